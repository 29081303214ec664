"""OLMo-core: `blocks.{i}.attention.w_q/w_k`, QK norms, flat MoE routers.

Attention per block `{prefix}blocks.{i}.attention.`: `w_q.weight` [H·d, D] and
`w_k.weight` [G·d, D], or a fused `w_qkv.weight` [3D, D] viewed (3, H, d)
(FusedAttention: blocks [Q | K | V], multi-head); QK norms `q_norm.weight`/
`k_norm.weight` over the flat projection [H·d] or per head [d]
(`use_head_qk_norm`) (allenai/OLMo-core `nn/attention/__init__.py`).
Router `feed_forward_moe.router.weight` is stored flat [E·D] and used as
view(E, D) (`nn/moe/router.py` MoELinearRouter), with the selection bias
buffer `router.score_bias` [E]. DCP keys carry a `model.` prefix.

Head counts come from the step directory's config.json when it is
OLMo-core's experiment config (model.block.sequence_mixer|attention.n_heads),
else from --num-heads. E = router size / D.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from ckptscan.errors import CkptScanError
from ckptscan.layouts.base import (HeadOverrides, ModelLayout, as_mapping, find_layers, matched_prefix, module_prefixes,
                                   present)
from ckptscan.layouts.geometry import HeadHints, fused_geometry, separate_geometry
from ckptscan.layouts.plan import QKTensors, RouterTensors, attach_output, find_output, layer_plan, model_info
from ckptscan.readers.base import Checkpoint

MODEL_TYPES: set[str] = set()

_ATTENTION = re.compile(r"(?P<prefix>.*?)blocks\.(?P<layer>\d+)\.attention\.(?:w_q|w_qkv)\.weight")


def matches(ckpt: Checkpoint, keys: set[str]) -> bool:
    return any(_ATTENTION.fullmatch(k) for k in keys if ".attention.w_q" in k)


def resolve(ckpt: Checkpoint, keys: set[str], overrides: HeadOverrides) -> ModelLayout:
    path = ckpt.path
    found = find_layers(keys, _ATTENTION, path, "*blocks.N.attention.w_q.weight")
    layers = module_prefixes(found, ".attention.")
    shape = ckpt.tensors.shape
    model = _model_config(ckpt.config)
    hints = HeadHints.gather(overrides, num_heads=_attention_value(model, "n_heads"),
                             num_kv_heads=_attention_value(model, "n_kv_heads"),
                             head_dim=_attention_value(model, "head_dim"), path=path)
    looked = "no OLMo-core config.json with model.block.sequence_mixer.n_heads"
    first = layers[min(layers)]
    if first + "w_qkv.weight" in keys:
        fused = first + "w_qkv.weight"
        rows, hidden = shape(fused)
        if overrides.num_kv_heads is None and hints.num_heads is not None:
            hints = HeadHints(hints.num_heads, (hints.num_heads[0], "FusedAttention is multi-head"), hints.head_dim)
        geometry = fused_geometry(hints, fused, rows, hidden, "blocked", path, looked=looked)
    else:
        geometry = separate_geometry(hints, (first + "w_q.weight", shape(first + "w_q.weight")),
                                     (first + "w_k.weight", shape(first + "w_k.weight")), path, looked=looked)

    plans = []
    for layer in sorted(layers):
        attn = layers[layer]
        q_norm, k_norm = present(keys, attn + "q_norm.weight"), present(keys, attn + "k_norm.weight")
        if attn + "w_qkv.weight" in keys:
            qk = QKTensors(attn + "w_qkv.weight", fused="blocked", q_norm=q_norm, k_norm=k_norm)
        else:
            qk = QKTensors(attn + "w_q.weight", attn + "w_k.weight", q_norm=q_norm, k_norm=k_norm)
        router, experts = _router(keys, attn, shape, geometry.hidden_size, path)
        plans.append(layer_plan(layer, geometry, qk, router, shape, path, num_experts=experts))
    moe = as_mapping(as_mapping(model.get("block")).get("feed_forward_moe"))
    router_config = as_mapping(moe.get("router"))
    info = model_info("olmo-core", geometry, plans, shape, top_k=router_config.get("top_k"),
                      router_scoring=router_config.get("gating_function"))
    # The head: `lm_head.w_out` after `lm_head.norm` (nn/lm_head.py), or the tied `embeddings`.
    # No input norm is read: a reordered-norm block (OLMo 2) applies `attention_norm` after attention.
    prefix = matched_prefix(_ATTENTION, found[min(found)])
    output, note = find_output(keys, (prefix + "lm_head.w_out.weight",), (prefix + "embeddings.weight",),
                               (prefix + "lm_head.norm.weight",))
    return attach_output(ModelLayout(info, plans, list(geometry.notes)), output, note, shape, path)


def _model_config(config: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """The `model` section of an OLMo-core experiment config, or {}."""
    return as_mapping((config or {}).get("model"))


def _attention_value(model: Mapping[str, Any], name: str) -> tuple[Any, str] | None:
    block = as_mapping(model.get("block"))
    for section in ("sequence_mixer", "attention"):
        value = as_mapping(block.get(section)).get(name)
        if value is not None:
            return value, f"config.json 'model.block.{section}.{name}'"
    return None


def _router(keys: set[str], attn: str, shape: Any, hidden: int, path: Any) -> tuple[RouterTensors | None, int | None]:
    block = attn[: -len("attention.")]
    name = block + "feed_forward_moe.router.weight"
    if name not in keys:
        return None, None
    size = shape(name)
    if len(size) != 1 or size[0] % hidden:
        raise CkptScanError(f"flat router of shape {list(size)} is not E x hidden {hidden}", path=path, tensor=name)
    bias = present(keys, block + "feed_forward_moe.router.score_bias")
    return RouterTensors(name, bias, flat=True), size[0] // hidden
