"""BERT (and RoBERTa, whose attention is BERT's): `query`/`key` [D, D] + bias.

`{prefix}encoder.layer.{i}.attention.self.query.weight` and `…key.weight`
(BertSelfAttention: all_head_size = H · D/H, heads are contiguous rows);
multi-head. The prefix is `bert.` / `roberta.` or empty (a bare BertModel).
"""

from __future__ import annotations

import re

from ckptscan.layouts.base import HeadOverrides, ModelLayout, config_entry, find_layers, model_types
from ckptscan.layouts.geometry import mha_hints, separate_geometry
from ckptscan.layouts.plan import QKTensors, attention_layout, key_tensor
from ckptscan.readers.base import Checkpoint

MODEL_TYPES = {"bert", "roberta"}

_Q = re.compile(r"(?P<prefix>.*?)encoder\.layer\.(?P<layer>\d+)\.attention\.self\.query\.weight")


def matches(ckpt: Checkpoint, keys: set[str]) -> bool:
    return any(k.endswith("attention.self.query.weight") and _Q.fullmatch(k) for k in keys)


def resolve(ckpt: Checkpoint, keys: set[str], overrides: HeadOverrides) -> ModelLayout:
    path = ckpt.path
    layers = find_layers(keys, _Q, path, "*encoder.layer.N.attention.self.query.weight")
    shape = ckpt.tensors.shape
    qk = {i: QKTensors(q, q.replace(".self.query.", ".self.key.")) for i, q in layers.items()}
    first = qk[min(qk)]
    first_k = key_tensor(first, path)
    hints = mha_hints(overrides, config_entry(ckpt.config, "num_attention_heads"), "BERT", path)
    geometry = separate_geometry(hints, (first.q, shape(first.q)), (first_k, shape(first_k)), path)
    family = next((t for t in model_types(ckpt.config) if t in MODEL_TYPES), "bert")
    return attention_layout(family, geometry, qk, shape, path)
