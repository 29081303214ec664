"""nanoGPT `ckpt.pt`: GPT-2's fused c_attn, but an nn.Linear (not transposed).

`{prefix}transformer.h.{i}.attn.c_attn.weight` [3D, D] has rows [Q | K | V]
(karpathy/nanoGPT `model.py`: `q, k, v = self.c_attn(x).split(n_embd, dim=2)`),
multi-head. Keys start with `_orig_mod.` when the model was torch.compile'd.
Head counts come from the checkpoint's `model_args` (n_head, n_embd), which
the reader exposes as metadata, or from --num-heads.
"""

from __future__ import annotations

from ckptscan.errors import CkptScanError
from ckptscan.layouts.base import HeadOverrides, ModelLayout, as_mapping, present
from ckptscan.layouts.geometry import fused_geometry, mha_hints
from ckptscan.layouts.gpt2 import c_attn_output, c_attn_weights, has_c_attn, input_norm_name
from ckptscan.layouts.plan import QKTensors, attach_output, attention_layout
from ckptscan.readers.base import Checkpoint

MODEL_TYPES: set[str] = set()


def matches(ckpt: Checkpoint, keys: set[str]) -> bool:
    return has_c_attn(ckpt, keys, transposed=False)


def resolve(ckpt: Checkpoint, keys: set[str], overrides: HeadOverrides) -> ModelLayout:
    path = ckpt.path
    layers, rows, hidden = c_attn_weights(ckpt, keys, transposed=False)
    first = layers[min(layers)]
    model_args = as_mapping(ckpt.meta.get("model_args"))
    heads = model_args.get("n_head")
    hints = mha_hints(overrides, (heads, "model_args 'n_head'") if heads is not None else None, "nanoGPT", path)
    embd = model_args.get("n_embd")
    if embd is not None and embd != hidden:
        raise CkptScanError(f"model_args 'n_embd' is {embd} but the weight is {hidden} wide", path=path, tensor=first)
    geometry = fused_geometry(hints, first, rows, hidden, "blocked", path,
                              looked="no model_args 'n_head' in the checkpoint")
    qk = {i: QKTensors(name, fused="blocked", input_norm=present(keys, input_norm_name(name)))
          for i, name in layers.items()}
    # nanoGPT ties lm_head to wte (one parameter saved under both names).
    output, note = c_attn_output(keys, layers, True)
    return attach_output(attention_layout("nanogpt", geometry, qk, ckpt.tensors.shape, path), output, note,
                         ckpt.tensors.shape, path)
