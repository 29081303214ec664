"""Hugging Face decoders with separate q_proj/k_proj (Llama and its kin).

Covers llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe, olmo,
olmo2, olmoe and gemma 1-3 (and multimodal wrappers whose `text_config` is
one of them): `{prefix}layers.{i}.self_attn.{q,k}_proj.weight` [H·d, D] /
[G·d, D], optional QK-norm gains (`q_norm`/`k_norm`: per head [d] in Qwen3
and Gemma3, flat [H·d] in OLMo2/OLMoE; Gemma's RMSNorm scales by 1 + w), and
MoE routers `block_sparse_moe.gate.weight` (Mixtral) or `mlp.gate.weight`
(Qwen-MoE, OLMoE, Mixtral as transformers v5 renames it) of shape [E, D].
Qwen-MoE's `mlp.shared_expert_gate` [1, D] gates the shared expert and is not
a router; the exact key match keeps it out.

Given H, the shapes fix d = rows/H and G = k rows/d, so checkpoints without
a config need only --num-heads; per-head QK-norm gains [d] (Qwen3, Gemma3)
fix d, and so H, without it. A checkpoint of an unknown model_type with
these names is read too, but its QK-norm convention is not known: one with
q_norm/k_norm is refused rather than folded by a guessed rule. Without any
model_type (no config at all: accelerate's save_state, Lightning without
hyper-parameters) the names decide, and `inspect` says so: Gemma's (1 + w)
only with Gemma 2/3's `pre_feedforward_layernorm`, else w (Qwen3, OLMo2);
the family is named from the names too ("qwen3-like", "mixtral-like").
"""

from __future__ import annotations

import re
from typing import Any

from ckptscan.errors import CkptScanError
from ckptscan.layouts.base import (
    HeadOverrides,
    ModelLayout,
    config_entry,
    config_value,
    find_layers,
    matched_prefix,
    model_types,
    present,
)
from ckptscan.layouts.geometry import HeadHints, separate_geometry
from ckptscan.layouts.plan import QKTensors, RouterTensors, attach_output, find_output, layer_plan, model_info
from ckptscan.readers.base import Checkpoint

MODEL_TYPES = {
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
    "olmo", "olmo2", "olmoe", "gemma", "gemma2", "gemma3", "gemma3_text",
}
# Gemma's RMSNorm multiplies by (1 + weight): fold that, not the raw weight.
ONE_PLUS_GAIN = {"gemma", "gemma2", "gemma3", "gemma3_text"}
# Token-choice top-k over softmax(W_r x) (TF mixtral, qwen2_moe, olmoe).
SOFTMAX_ROUTERS = {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe"}
ROUTER_SUFFIXES = ("block_sparse_moe.gate.weight", "mlp.gate.weight")
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")

_Q_PROJ = re.compile(r"(?P<prefix>.*?)layers\.(?P<layer>\d+)\.self_attn\.q_proj\.weight")


def matches(ckpt: Checkpoint, keys: set[str]) -> bool:
    """q_proj with a k_proj beside it (DeepSeek-V2-Lite's q_proj has none)."""
    return any(
        _Q_PROJ.fullmatch(k) and k.replace(".q_proj.", ".k_proj.") in keys for k in keys if k.endswith("q_proj.weight")
    )


def resolve(ckpt: Checkpoint, keys: set[str], overrides: HeadOverrides) -> ModelLayout:
    path, config = ckpt.path, ckpt.config
    layers = find_layers(keys, _Q_PROJ, path, "*layers.N.self_attn.q_proj.weight")
    known = [t for t in model_types(config) if t in MODEL_TYPES]
    untyped = not model_types(config)  # no config, or one that names no model_type
    shape = ckpt.tensors.shape
    family = known[0] if known else (model_types(config) or [_family_from_names(keys, layers, shape)])[0]

    first = layers[min(layers)]
    k_first = first.replace(".q_proj.", ".k_proj.")
    if k_first not in keys:
        raise CkptScanError("no matching k_proj", path=path, tensor=k_first)
    hints = HeadHints.gather(
        overrides,
        num_heads=config_entry(config, "num_attention_heads", "n_head") or _heads_from_q_norm(keys, first, shape),
        num_kv_heads=config_entry(config, "num_key_value_heads", "num_kv_heads"),
        head_dim=config_entry(config, "head_dim"),
        path=path,
    )
    geometry = separate_geometry(hints, (first, shape(first)), (k_first, shape(k_first)), path)

    config_experts = config_value(config, *EXPERT_KEYS)
    base_family = family.removesuffix("-like")
    scoring = "softmax" if base_family in SOFTMAX_ROUTERS else config_value(config, "scoring_func")
    notes = list(geometry.notes)
    if untyped:
        notes.append(f"family {family}: from the tensor names (no config states a model_type)")
    gemma_names = any(_GEMMA_NORM in k for k in keys)
    plans = []
    for layer in sorted(layers):
        q_name = layers[layer]
        base = q_name[: -len("self_attn.q_proj.weight")]
        qk = QKTensors(
            q=q_name,
            k=q_name.replace(".q_proj.", ".k_proj."),
            q_norm=present(keys, base + "self_attn.q_norm.weight"),
            k_norm=present(keys, base + "self_attn.k_norm.weight"),
            gain_offset=1.0 if family in ONE_PLUS_GAIN or (untyped and gemma_names) else 0.0,
            input_norm=present(keys, base + "input_layernorm.weight"),
        )
        if (qk.q_norm or qk.k_norm) and untyped and layer == min(layers):
            notes.append("QK-norm convention inferred from the tensor names: " + (
                "Gemma 2/3 names (pre_feedforward_layernorm), so the gain is 1 + w" if gemma_names else
                "no Gemma 2/3 names (pre_feedforward_layernorm), so the gain is w, as in Qwen3/OLMo2"))
        if (qk.q_norm or qk.k_norm) and not known and not untyped:
            raise CkptScanError(
                f"QK-norm gains of model_type '{family}' (convention unknown: Gemma scales by 1 + w, others by w); "
                "describe the layout with --tensor-map (norm_offset)",
                path=path, tensor=qk.q_norm or qk.k_norm,
            )
        router = _router(keys, base, shape, config_experts, known, path, notes, untyped)
        plans.append(layer_plan(layer, geometry, qk, router, shape, path, router_scoring=scoring))

    info = model_info(family, geometry, plans, shape, top_k=config_value(config, "num_experts_per_tok"),
                      router_scoring=scoring)
    offset = 1.0 if family in ONE_PLUS_GAIN or (untyped and gemma_names) else 0.0
    output, note = _output(keys, layers[min(layers)], config, offset)
    return attach_output(ModelLayout(info, plans, notes), output, note, shape, path)


def _output(keys: set[str], first_q: str, config: Any, offset: float) -> tuple[Any, str | None]:
    """`{prefix}embed_tokens`, `{prefix}norm` and `lm_head` (at the root, or
    beside a multimodal wrapper's language model); without `lm_head` the head
    is tied to the embedding, as transformers saves a tied model."""
    prefix = matched_prefix(_Q_PROJ, first_q)
    root = prefix.removesuffix("model.")
    heads = tuple(dict.fromkeys((root + "lm_head.weight", "lm_head.weight")))
    return find_output(keys, heads, (prefix + "embed_tokens.weight",), (prefix + "norm.weight",),
                       tied=config_value(config, "tie_word_embeddings"), gain_offset=offset)


def _router(
    keys: set[str], base: str, shape: Any, config_experts: Any, known: list[str], path: Any, notes: list[str],
    untyped: bool = False,
) -> RouterTensors | None:
    name = next((base + s for s in ROUTER_SUFFIXES if base + s in keys), None)
    if name is None:
        return None
    if untyped and config_experts is None:
        # No config at all: a gate is a router only with experts beside it.
        experts_prefix = name[: -len("gate.weight")] + "experts."
        if not any(k.startswith(experts_prefix) for k in keys):
            notes.append(f"ignored {name}: no config, and no experts beside it")
            return None
        return RouterTensors(name)
    experts = shape(name)[0] if shape(name) else None
    if config_experts is not None and experts != config_experts:
        if not known:
            notes.append(f"ignored {name}: {experts} rows, but the config says {config_experts} experts")
            return None
        raise CkptScanError(f"router has {experts} rows but the config says {config_experts} experts",
                            path=path, tensor=name)
    if config_experts is None and not known:
        # An unknown architecture's `mlp.gate` may be a gate projection, not a router.
        notes.append(f"ignored {name}: model_type unknown and the config states no expert count")
        return None
    return RouterTensors(name)


# Gemma 2/3 decoder layers (and no other family here) norm before the MLP
# under this name; their RMSNorm scales by (1 + w).
_GEMMA_NORM = ".pre_feedforward_layernorm."


def _heads_from_q_norm(keys: set[str], q_name: str, shape: Any) -> tuple[int, str] | None:
    """H = q_proj rows / d when a per-head q_norm [d] states d (Qwen3, Gemma3).
    A flat OLMo2 gain [H·d] is as long as the rows and says nothing."""
    norm = q_name.replace(".q_proj.weight", ".q_norm.weight")
    if norm not in keys or len(shape(norm)) != 1 or len(shape(q_name)) != 2:
        return None
    d, rows = shape(norm)[0], shape(q_name)[0]
    if d < 1 or d >= rows or rows % d:
        return None
    return rows // d, f"{q_name} rows / per-head {norm.rsplit('.', 2)[-2]} size {d}"


def _family_from_names(keys: set[str], layers: dict[int, str], shape: Any) -> str:
    """The most precise family the tensor names support, as "<family>-like"."""
    first = layers[min(layers)]
    base = first[: -len("self_attn.q_proj.weight")]
    norm = base + "self_attn.q_norm.weight"
    moe = any(".block_sparse_moe.gate.weight" in k for k in keys)
    experts = any(".mlp.experts." in k for k in keys) and any(k.endswith(".mlp.gate.weight") for k in keys)
    if any(_GEMMA_NORM in k for k in keys):
        name = "gemma3" if norm in keys else "gemma2"
    elif norm in keys:
        flat = tuple(shape(norm)) == (shape(first)[0],)
        name = ("olmoe" if flat else "qwen3_moe") if experts else ("olmo2" if flat else "qwen3")
    elif moe:
        name = "mixtral"
    elif experts:
        name = "qwen2_moe" if any(".shared_expert." in k for k in keys) else "mixtral"
    elif base + "self_attn.q_proj.bias" in keys:
        name = "qwen2"
    else:
        name = "llama"
    return f"{name}-like"
