"""torchtitan (and Meta-format Llama) checkpoints: `wq`/`wk`, MLA, MoE routers.

Attention per layer `{prefix}layers.{i}.attention.`: `wq.weight` [H·d, D] and
`wk.weight` [G·d, D] (2025), or `qkv_linear.wq.weight`/`qkv_linear.wk.weight`
(2026: FusedQKVLinear saves them split through state-dict hooks), with
optional per-head QK norms `q_norm.weight`/`k_norm.weight` [d] (Qwen3). Within
a head the rows are in Meta's interleaved RoPE order (torchtitan
`llama3/state_dict_adapter.py` `_permute`), which permutes rows inside each
head only: head blocks and every QK spectrum are unchanged.
DeepSeek-V3 uses MLA (see mla.py) as `wq_a`/`q_norm`/`wq_b` (or `wq`),
`wkv_a`/`kv_norm`/`wkv_b` (`deepseek_v3/state_dict_adapter.py`).
Routers: `moe.router.gate.weight` [E, D], selection bias `moe.expert_bias`
(2025) or `moe.expert_bias_E` (2026).

The checkpoint holds no model config: the job's TOML names a model flavour,
so `--model-config job.toml` (or a config.json, or --num-heads) gives H; G
and d follow from the shapes. The router's score function (a training
setting) is reported as unknown. The step is `train_state.step` (reader).
"""

from __future__ import annotations

import re
from typing import Any

from ckptscan.layouts.base import (HeadOverrides, ModelLayout, config_entry, find_layers, matched_prefix,
                                   module_prefixes, present)
from ckptscan.layouts.geometry import HeadHints, separate_geometry
from ckptscan.layouts.mla import MLATensors, mla_geometry, mla_plan
from ckptscan.layouts.plan import (QKTensors, RouterTensors, attach_output, find_output, key_tensor, layer_plan,
                                   model_info)
from ckptscan.readers.base import Checkpoint

MODEL_TYPES: set[str] = set()
LOOKED = "torchtitan checkpoints carry no model config; the job's TOML names its flavour"

_ATTENTION = re.compile(r"(?P<prefix>.*?)layers\.(?P<layer>\d+)\.attention\.(?:qkv_linear\.wq|wq|wkv_a)\.weight")


def matches(ckpt: Checkpoint, keys: set[str]) -> bool:
    return any(_ATTENTION.fullmatch(k) for k in keys if ".attention." in k)


def resolve(ckpt: Checkpoint, keys: set[str], overrides: HeadOverrides) -> ModelLayout:
    path = ckpt.path
    found = find_layers(keys, _ATTENTION, path, "*layers.N.attention.wq.weight")
    layers = module_prefixes(found, ".attention.")
    shape = ckpt.tensors.shape
    config = ckpt.config
    hints = HeadHints.gather(overrides, config_entry(config, "num_attention_heads", "n_heads"),
                             config_entry(config, "num_key_value_heads", "n_kv_heads"),
                             config_entry(config, "head_dim"), path=path)
    first = layers[min(layers)]
    if first + "wkv_a.weight" in keys:
        return _mla(ckpt, keys, layers, hints, path)

    def qk(attn: str) -> QKTensors:
        wq = attn + ("qkv_linear.wq.weight" if attn + "qkv_linear.wq.weight" in keys else "wq.weight")
        return QKTensors(wq, wq.replace(".wq.", ".wk."), q_norm=present(keys, attn + "q_norm.weight"),
                         k_norm=present(keys, attn + "k_norm.weight"),
                         input_norm=present(keys, attn[: -len("attention.")] + "attention_norm.weight"))

    first_qk = qk(first)
    first_k = key_tensor(first_qk, path)
    geometry = separate_geometry(hints, (first_qk.q, shape(first_qk.q)), (first_k, shape(first_k)), path,
                                 looked=LOOKED)
    plans = [layer_plan(i, geometry, qk(layers[i]), _router(keys, layers[i]), shape, path) for i in sorted(layers)]
    # The job TOML's [model] name (via --model-config) says which torchtitan model this is.
    name = (config or {}).get("torchtitan_model")
    family = f"torchtitan-{name}" if name else "torchtitan"
    layout = ModelLayout(model_info(family, geometry, plans, shape), plans,
                         [*geometry.notes, "router score function: unknown"])
    # Outside the layers: `tok_embeddings`, the final `norm` and the head `output`.
    prefix = matched_prefix(_ATTENTION, found[min(found)])
    output, note = find_output(keys, (prefix + "output.weight",), (prefix + "tok_embeddings.weight",),
                               (prefix + "norm.weight",))
    return attach_output(layout, output, note, shape, path)


def _mla(ckpt: Checkpoint, keys: set[str], layers: dict[int, str], hints: HeadHints, path: Any) -> ModelLayout:
    shape = ckpt.tensors.shape

    def tensors(attn: str) -> MLATensors:
        lora = attn + "wq_a.weight" in keys
        return MLATensors(
            kv_a=attn + "wkv_a.weight", kv_a_norm=attn + "kv_norm.weight", kv_b=attn + "wkv_b.weight",
            q=None if lora else attn + "wq.weight",
            q_a=attn + "wq_a.weight" if lora else None,
            q_a_norm=attn + "q_norm.weight" if lora else None,
            q_b=attn + "wq_b.weight" if lora else None,
        )

    geometry = mla_geometry(hints, tensors(layers[min(layers)]), shape, {}, path, looked=LOOKED)
    plans = [mla_plan(i, geometry, tensors(layers[i]), _router(keys, layers[i]), shape, path, None)
             for i in sorted(layers)]
    info = model_info("torchtitan-mla", geometry.heads(), plans, shape, rope_head_dim=geometry.rope)
    return ModelLayout(info, plans, [*geometry.notes, "router score function: unknown"])


def _router(keys: set[str], attn: str) -> RouterTensors | None:
    layer = attn[: -len("attention.")]
    if layer + "moe.router.gate.weight" not in keys:
        return None
    bias = next((layer + b for b in ("moe.expert_bias_E", "moe.expert_bias") if layer + b in keys), None)
    return RouterTensors(layer + "moe.router.gate.weight", bias)
