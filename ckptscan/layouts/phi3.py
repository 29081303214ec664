"""Phi-3 (and Phi-4): one fused `qkv_proj` in blocks, not interleaved.

`{prefix}layers.{i}.self_attn.qkv_proj.weight` [H·d + 2·G·d, D] has rows
[Q (H·d) | K (G·d) | V (G·d)] (TF `phi3/modular_phi3.py`: query_pos =
H·head_dim, then G·head_dim key rows). head_dim is `config.head_dim` or
hidden_size / num_attention_heads.
"""

from __future__ import annotations

import re

from ckptscan.layouts.base import HeadOverrides, ModelLayout, config_entry, find_layers
from ckptscan.layouts.geometry import HeadHints, fused_geometry
from ckptscan.layouts.plan import QKTensors, attention_layout
from ckptscan.readers.base import Checkpoint

MODEL_TYPES = {"phi3"}

_QKV = re.compile(r"(?P<prefix>.*?)layers\.(?P<layer>\d+)\.self_attn\.qkv_proj\.weight")


def matches(ckpt: Checkpoint, keys: set[str]) -> bool:
    return any(k.endswith("self_attn.qkv_proj.weight") and _QKV.fullmatch(k) for k in keys)


def resolve(ckpt: Checkpoint, keys: set[str], overrides: HeadOverrides) -> ModelLayout:
    path, config = ckpt.path, ckpt.config
    layers = find_layers(keys, _QKV, path, "*layers.N.self_attn.qkv_proj.weight")
    shape = ckpt.tensors.shape
    first = layers[min(layers)]
    rows, hidden = shape(first)
    hints = HeadHints.gather(
        overrides,
        num_heads=config_entry(config, "num_attention_heads"),
        num_kv_heads=config_entry(config, "num_key_value_heads"),
        head_dim=config_entry(config, "head_dim"),
        path=path,
    )
    # Phi3Attention: head_dim = getattr(config, "head_dim", hidden_size // num_attention_heads).
    default = None
    if config is not None and hints.num_heads is not None:
        default = (hidden // hints.num_heads[0], "hidden_size / num_attention_heads")
    geometry = fused_geometry(hints, first, rows, hidden, "blocked", path, default_head_dim=default)
    qk = {i: QKTensors(name, fused="blocked") for i, name in layers.items()}
    return attention_layout("phi3", geometry, qk, shape, path)
