"""GPT-J: separate `q_proj`/`k_proj` [D, D] without bias, multi-head.

`{prefix}h.{i}.attn.q_proj.weight` / `k_proj.weight` (TF
`gptj/modeling_gptj.py`); head_dim = n_embd / n_head. Rotary over the first
`rotary_dim` dims of each head does not change the head split.
"""

from __future__ import annotations

import re

from ckptscan.layouts.base import HeadOverrides, ModelLayout, config_entry, find_layers
from ckptscan.layouts.geometry import mha_hints, separate_geometry
from ckptscan.layouts.plan import QKTensors, attention_layout, key_tensor
from ckptscan.readers.base import Checkpoint

MODEL_TYPES = {"gptj"}

_Q = re.compile(r"(?P<prefix>.*?)h\.(?P<layer>\d+)\.attn\.q_proj\.weight")


def matches(ckpt: Checkpoint, keys: set[str]) -> bool:
    return any(k.endswith("attn.q_proj.weight") and _Q.fullmatch(k) for k in keys)


def resolve(ckpt: Checkpoint, keys: set[str], overrides: HeadOverrides) -> ModelLayout:
    path = ckpt.path
    layers = find_layers(keys, _Q, path, "*h.N.attn.q_proj.weight")
    shape = ckpt.tensors.shape
    qk = {i: QKTensors(q, q.replace(".q_proj.", ".k_proj.")) for i, q in layers.items()}
    first = qk[min(qk)]
    first_k = key_tensor(first, path)
    hints = mha_hints(overrides, config_entry(ckpt.config, "n_head", "num_attention_heads"), "GPT-J", path)
    geometry = separate_geometry(hints, (first.q, shape(first.q)), (first_k, shape(first_k)), path,
                                 looked="no config.json with n_head")
    return attention_layout("gptj", geometry, qk, shape, path)
