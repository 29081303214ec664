"""nanoGPT `ckpt.pt`: GPT-2's fused c_attn, but an nn.Linear (not transposed).

`{prefix}transformer.h.{i}.attn.c_attn.weight` [3D, D] has rows [Q | K | V]
(karpathy/nanoGPT `model.py`: `q, k, v = self.c_attn(x).split(n_embd, dim=2)`),
multi-head. Keys start with `_orig_mod.` when the model was torch.compile'd.
Head counts come from the checkpoint's `model_args` (n_head, n_embd), which
the reader exposes as metadata, or from --num-heads.
"""

from __future__ import annotations

import re

from ckptscan.errors import CkptScanError
from ckptscan.layouts.base import HeadOverrides, ModelInfo, ModelLayout, as_mapping, find_layers
from ckptscan.layouts.geometry import fused_geometry, mha_hints
from ckptscan.layouts.plan import QKTensors, layer_plan
from ckptscan.readers.base import Checkpoint

MODEL_TYPES: set[str] = set()

_C_ATTN = re.compile(r"(?P<prefix>.*?)h\.(?P<layer>\d+)\.attn\.c_attn\.weight")


def matches(ckpt: Checkpoint, keys: set[str]) -> bool:
    return any(_C_ATTN.fullmatch(k) and _is_linear(ckpt.tensors.shape(k)) for k in keys if k.endswith("c_attn.weight"))


def _is_linear(shape: tuple[int, ...]) -> bool:
    return len(shape) == 2 and shape[0] == 3 * shape[1]


def resolve(ckpt: Checkpoint, keys: set[str], overrides: HeadOverrides) -> ModelLayout:
    path = ckpt.path
    layers = find_layers(keys, _C_ATTN, path)
    if not layers:
        raise CkptScanError("no '*h.N.attn.c_attn.weight' tensors found", path=path)
    shape = ckpt.tensors.shape
    first = layers[min(layers)]
    if not _is_linear(shape(first)):
        raise CkptScanError(f"shape {list(shape(first))} is not nanoGPT's nn.Linear [3D, D]", path=path, tensor=first)
    rows, hidden = shape(first)
    model_args = as_mapping(ckpt.meta.get("model_args"))
    heads = model_args.get("n_head")
    hints = mha_hints(overrides, (heads, "model_args 'n_head'") if heads is not None else None, "nanoGPT", path)
    embd = model_args.get("n_embd")
    if embd is not None and embd != hidden:
        raise CkptScanError(f"model_args 'n_embd' is {embd} but the weight is {hidden} wide", path=path, tensor=first)
    geometry = fused_geometry(hints, first, rows, hidden, "blocked", path,
                              looked="no model_args 'n_head' in the checkpoint")
    plans = [layer_plan(i, geometry, QKTensors(layers[i], fused="blocked"), None, shape, path) for i in sorted(layers)]
    info = ModelInfo("nanogpt", len(plans), hidden, geometry.num_heads, geometry.num_kv_heads, geometry.head_dim)
    return ModelLayout(info, plans, list(geometry.notes))
