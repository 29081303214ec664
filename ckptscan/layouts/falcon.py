"""Falcon: one fused `query_key_value` whose layout depends on the config.

`{prefix}h.{i}.self_attention.query_key_value.weight` (TF
`falcon/modeling_falcon.py` `_split_heads`), head_dim = hidden / H always:
- `new_decoder_architecture` (40B/180B, and the custom-code model_type
  "RefinedWeb"): out = (H + 2G)·d, viewed (G, H/G + 2, d): each group holds
  H/G query heads, then its key, then its value. G = `num_kv_heads`
  (`n_head_kv` in old configs).
- else `multi_query` (7B): out = D + 2d, viewed (H + 2, d): H query heads,
  one key, one value; G is forced to 1.
- else (falcon-rw): viewed (H, 3, d): per-head [q, k, v].
All three are the grouped layout (G groups of [q·H/G | k | v]) with G = G, 1
and H respectively, so one split serves them; the config decides G and the
shape must agree. Without a config G comes from the shape.
"""

from __future__ import annotations

import re
from typing import Any

from ckptscan.errors import CkptScanError
from ckptscan.layouts.base import HeadOverrides, ModelLayout, config_entry, config_value, find_layers, model_types
from ckptscan.layouts.geometry import HeadHints, fused_geometry
from ckptscan.layouts.plan import QKTensors, attention_layout
from ckptscan.readers.base import Checkpoint

MODEL_TYPES = {"falcon", "RefinedWeb", "RefinedWebModel"}

_QKV = re.compile(r"(?P<prefix>.*?)h\.(?P<layer>\d+)\.self_attention\.query_key_value\.weight")


def matches(ckpt: Checkpoint, keys: set[str]) -> bool:
    return any(k.endswith("self_attention.query_key_value.weight") and _QKV.fullmatch(k) for k in keys)


def resolve(ckpt: Checkpoint, keys: set[str], overrides: HeadOverrides) -> ModelLayout:
    path, config = ckpt.path, ckpt.config
    layers = find_layers(keys, _QKV, path, "*h.N.self_attention.query_key_value.weight")
    shape = ckpt.tensors.shape
    first = layers[min(layers)]
    rows, hidden = shape(first)
    heads = config_entry(config, "num_attention_heads", "n_head")
    hints = HeadHints.gather(overrides, num_heads=heads, num_kv_heads=_kv_heads(config, heads), path=path)
    # FalconAttention: head_dim = hidden_size // num_heads, in every variant.
    default = (hidden // hints.num_heads[0], "hidden_size / heads") if hints.num_heads is not None else None
    geometry = fused_geometry(hints, first, rows, hidden, "grouped", path, default_head_dim=default)
    if geometry.head_dim * geometry.num_heads != hidden:
        raise CkptScanError(f"Falcon's head_dim is hidden/heads = {hidden / geometry.num_heads:g}, but the split "
                            f"gives {geometry.head_dim}", path=path, tensor=first)
    family = next((t for t in model_types(config) if t in MODEL_TYPES), "falcon")
    qk = {i: QKTensors(name, fused="grouped") for i, name in layers.items()}
    return attention_layout(family, geometry, qk, shape, path)


def _kv_heads(config: Any, heads: tuple[Any, str] | None) -> tuple[Any, str] | None:
    """KV heads as FalconAttention derives them from the config flags."""
    if config is None:
        return None
    new_arch = config_value(config, "new_decoder_architecture")
    if new_arch is None and "RefinedWeb" in model_types(config):
        new_arch = True  # the custom-code 40B config implies it
    if new_arch:
        return config_entry(config, "num_kv_heads", "n_head_kv") or heads
    if config_value(config, "multi_query"):
        return 1, "config.json 'multi_query' (one KV head)"
    return heads
