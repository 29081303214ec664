"""Layouts: tensor names and config -> per-layer heads and routers.

One small resolver per model family. `resolve_layout` picks the first whose
`matches` accepts the checkpoint; a checkpoint no resolver can place is an
error that says what is missing, never a guess.
"""

from __future__ import annotations

from ckptscan.errors import CkptScanError
from ckptscan.layouts import hf_llama
from ckptscan.layouts.base import HeadOverrides, LayerPlan, LayerWeights, ModelInfo, ModelLayout
from ckptscan.readers import Checkpoint

RESOLVERS = [hf_llama]

__all__ = ["HeadOverrides", "LayerPlan", "LayerWeights", "ModelInfo", "ModelLayout", "resolve_layout"]


def resolve_layout(checkpoint: Checkpoint, overrides: HeadOverrides = HeadOverrides()) -> ModelLayout:
    keys = checkpoint.tensors.keys()
    for resolver in RESOLVERS:
        if resolver.matches(keys, checkpoint.config):
            return resolver.resolve(checkpoint.tensors, checkpoint.config, overrides, checkpoint.path)
    model_type = (checkpoint.config or {}).get("model_type")
    what = f"model_type '{model_type}'" if model_type else "these tensor names"
    raise CkptScanError(f"no layout resolver recognises {what}; see `ckptscan inspect` and the README's "
                        "list of supported families", path=checkpoint.path)
