"""GPT-2: a fused `c_attn` stored by `Conv1D`, i.e. transposed.

`{prefix}h.{i}.attn.c_attn.weight` is [D, 3D] ([in, out]: Conv1D computes
x @ W, TF `pytorch_utils.py`); transposed, its rows are [Q | K | V], each D
wide (`split(split_size, dim=2)`, TF `gpt2/modeling_gpt2.py`). Multi-head
only; head_dim = n_embd / n_head. Hub checkpoints name it `h.{i}…` (saved
from GPT2Model) or `transformer.h.{i}…`. nanoGPT uses the same name with an
nn.Linear [3D, D] (nanogpt.py); the shape tells them apart.
"""

from __future__ import annotations

import re

from ckptscan.errors import CkptScanError
from ckptscan.layouts.base import HeadOverrides, ModelInfo, ModelLayout, config_entry, find_layers
from ckptscan.layouts.geometry import fused_geometry, mha_hints
from ckptscan.layouts.plan import QKTensors, layer_plan
from ckptscan.readers.base import Checkpoint

MODEL_TYPES = {"gpt2"}

_C_ATTN = re.compile(r"(?P<prefix>.*?)h\.(?P<layer>\d+)\.attn\.c_attn\.weight")


def matches(ckpt: Checkpoint, keys: set[str]) -> bool:
    return any(_C_ATTN.fullmatch(k) and _is_conv1d(ckpt.tensors.shape(k)) for k in keys if k.endswith("c_attn.weight"))


def _is_conv1d(shape: tuple[int, ...]) -> bool:
    return len(shape) == 2 and shape[1] == 3 * shape[0]


def resolve(ckpt: Checkpoint, keys: set[str], overrides: HeadOverrides) -> ModelLayout:
    path = ckpt.path
    layers = find_layers(keys, _C_ATTN, path)
    if not layers:
        raise CkptScanError("no '*h.N.attn.c_attn.weight' tensors found", path=path)
    shape = ckpt.tensors.shape
    first = layers[min(layers)]
    if not _is_conv1d(shape(first)):
        raise CkptScanError(f"shape {list(shape(first))} is not GPT-2's Conv1D [D, 3D]", path=path, tensor=first)
    hidden, rows = shape(first)
    hints = mha_hints(overrides, config_entry(ckpt.config, "n_head", "num_attention_heads"), "GPT-2", path)
    geometry = fused_geometry(hints, first, rows, hidden, "blocked", path, looked="no config.json with n_head")
    qk = {i: QKTensors(name, fused="blocked", transposed=True) for i, name in layers.items()}
    plans = [layer_plan(i, geometry, qk[i], None, shape, path) for i in sorted(layers)]
    info = ModelInfo("gpt2", len(plans), hidden, geometry.num_heads, geometry.num_kv_heads, geometry.head_dim)
    return ModelLayout(info, plans, list(geometry.notes))
