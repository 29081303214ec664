"""GPT-NeoX / Pythia: fused `query_key_value` interleaved per head.

`{prefix}layers.{i}.attention.query_key_value.weight` [3D, D] views as
(H, 3d): head h is rows h·3d + [0:d] = q, [d:2d] = k, [2d:3d] = v (TF
`gpt_neox/modeling_gpt_neox.py`), i.e. the grouped layout with G = H.
Multi-head; head_size = hidden_size / num_attention_heads.
"""

from __future__ import annotations

import re

from ckptscan.layouts.base import (HeadOverrides, ModelLayout, config_entry, config_value, find_layers, matched_prefix,
                                   present)
from ckptscan.layouts.geometry import fused_geometry, mha_hints
from ckptscan.layouts.plan import QKTensors, attach_output, attention_layout, find_output
from ckptscan.readers.base import Checkpoint

MODEL_TYPES = {"gpt_neox"}

_QKV = re.compile(r"(?P<prefix>.*?)layers\.(?P<layer>\d+)\.attention\.query_key_value\.weight")


def matches(ckpt: Checkpoint, keys: set[str]) -> bool:
    return any(k.endswith(".attention.query_key_value.weight") and _QKV.fullmatch(k) for k in keys)


def resolve(ckpt: Checkpoint, keys: set[str], overrides: HeadOverrides) -> ModelLayout:
    path = ckpt.path
    layers = find_layers(keys, _QKV, path, "*layers.N.attention.query_key_value.weight")
    shape = ckpt.tensors.shape
    first = layers[min(layers)]
    rows, hidden = shape(first)
    hints = mha_hints(overrides, config_entry(ckpt.config, "num_attention_heads"), "GPT-NeoX", path)
    geometry = fused_geometry(hints, first, rows, hidden, "grouped", path)
    # `layers.N.input_layernorm` feeds attention (also in the parallel-residual blocks).
    qk = {i: QKTensors(name, fused="grouped",
                       input_norm=present(keys, name.removesuffix("attention.query_key_value.weight")
                                          + "input_layernorm.weight"))
          for i, name in layers.items()}
    prefix = matched_prefix(_QKV, first)
    output, note = find_output(keys, (prefix.removesuffix("gpt_neox.") + "embed_out.weight",),
                               (prefix + "embed_in.weight",), (prefix + "final_layer_norm.weight",),
                               tied=config_value(ckpt.config, "tie_word_embeddings"))
    return attach_output(attention_layout("gpt_neox", geometry, qk, shape, path), output, note, shape, path)
