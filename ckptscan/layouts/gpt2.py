"""GPT-2: a fused `c_attn` stored by `Conv1D`, i.e. transposed.

`{prefix}h.{i}.attn.c_attn.weight` is [D, 3D] ([in, out]: Conv1D computes
x @ W, TF `pytorch_utils.py`); transposed, its rows are [Q | K | V], each D
wide (`split(split_size, dim=2)`, TF `gpt2/modeling_gpt2.py`). Multi-head
only; head_dim = n_embd / n_head. Hub checkpoints name it `h.{i}…` (saved
from GPT2Model) or `transformer.h.{i}…`. nanoGPT uses the same name with an
nn.Linear [3D, D] (nanogpt.py); the shape tells them apart, and both read
the weight through `c_attn_weights`.
"""

from __future__ import annotations

import re

from ckptscan.errors import CkptScanError
from ckptscan.layouts.base import (HeadOverrides, ModelLayout, config_entry, config_value, find_layers, matched_prefix,
                                   present)
from ckptscan.layouts.geometry import fused_geometry, mha_hints
from ckptscan.layouts.plan import OutputTensors, QKTensors, attach_output, attention_layout, find_output
from ckptscan.readers.base import Checkpoint

MODEL_TYPES = {"gpt2"}

C_ATTN = re.compile(r"(?P<prefix>.*?)h\.(?P<layer>\d+)\.attn\.c_attn\.weight")


def matches(ckpt: Checkpoint, keys: set[str]) -> bool:
    return has_c_attn(ckpt, keys, transposed=True)


def resolve(ckpt: Checkpoint, keys: set[str], overrides: HeadOverrides) -> ModelLayout:
    path = ckpt.path
    layers, rows, hidden = c_attn_weights(ckpt, keys, transposed=True)
    hints = mha_hints(overrides, config_entry(ckpt.config, "n_head", "num_attention_heads"), "GPT-2", path)
    geometry = fused_geometry(hints, layers[min(layers)], rows, hidden, "blocked", path,
                              looked="no config.json with n_head")
    qk = {i: QKTensors(name, fused="blocked", transposed=True, input_norm=present(keys, input_norm_name(name)))
          for i, name in layers.items()}
    output, note = c_attn_output(keys, layers, config_value(ckpt.config, "tie_word_embeddings"))
    return attach_output(attention_layout("gpt2", geometry, qk, ckpt.tensors.shape, path), output, note,
                         ckpt.tensors.shape, path)


def input_norm_name(c_attn: str) -> str:
    """`h.N.ln_1.weight`: the LayerNorm in front of `h.N.attn` (GPT-2, nanoGPT)."""
    return c_attn.removesuffix("attn.c_attn.weight") + "ln_1.weight"


def c_attn_output(keys: set[str], layers: dict[int, str], tied: bool | None
                  ) -> tuple[OutputTensors | None, str | None]:
    """`{prefix}wte`, `{prefix}ln_f` and `lm_head` beside the `transformer.`
    prefix (GPT-2 and nanoGPT name them alike; both tie the head to wte)."""
    prefix = matched_prefix(C_ATTN, layers[min(layers)])
    root = prefix.removesuffix("transformer.")
    return find_output(keys, (root + "lm_head.weight",), (prefix + "wte.weight",), (prefix + "ln_f.weight",),
                       tied=tied)


def is_c_attn(shape: tuple[int, ...], transposed: bool) -> bool:
    """[3D, D] rows [Q | K | V] once a transposed (Conv1D) weight is turned back."""
    if len(shape) != 2:
        return False
    rows, hidden = shape[::-1] if transposed else shape
    return rows == 3 * hidden


def has_c_attn(ckpt: Checkpoint, keys: set[str], transposed: bool) -> bool:
    return any(C_ATTN.fullmatch(k) and is_c_attn(ckpt.tensors.shape(k), transposed)
               for k in keys if k.endswith("c_attn.weight"))


def c_attn_weights(ckpt: Checkpoint, keys: set[str], transposed: bool) -> tuple[dict[int, str], int, int]:
    """Each layer's c_attn weight, and the (rows, hidden) of the first one as
    an [out, in] matrix: GPT-2's Conv1D [D, 3D] when `transposed`, else
    nanoGPT's nn.Linear [3D, D]."""
    layers = find_layers(keys, C_ATTN, ckpt.path, "*h.N.attn.c_attn.weight")
    first = layers[min(layers)]
    shape = ckpt.tensors.shape(first)
    if not is_c_attn(shape, transposed):
        kind = "GPT-2's Conv1D [D, 3D]" if transposed else "nanoGPT's nn.Linear [3D, D]"
        raise CkptScanError(f"shape {list(shape)} is not {kind}", path=ckpt.path, tensor=first)
    rows, hidden = shape[::-1] if transposed else shape
    return layers, rows, hidden
