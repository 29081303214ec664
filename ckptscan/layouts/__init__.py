"""Layouts: tensor names and config -> per-layer heads and routers.

One small resolver per model family. Each module has `MODEL_TYPES` (the
config.json model_type values it owns), `matches(checkpoint, keys)` (its
tensor names, for checkpoints without a config) and `resolve(checkpoint,
keys, overrides) -> ModelLayout`. `resolve_layout` picks a resolver by
model_type first, then by names; a checkpoint no resolver can place is an
error that says what is missing, never a guess. A user tensor map
(`--tensor-map`) replaces the resolvers altogether.
"""

from __future__ import annotations

from ckptscan.errors import CkptScanError
from ckptscan.layouts import (
    bert,
    deepseek,
    falcon,
    gpt2,
    gpt_neox,
    gptj,
    hf_llama,
    litgpt,
    maxtext,
    megatron,
    megatron_legacy,
    nanogpt,
    olmo_core,
    phi3,
    switch,
    torchtitan,
)
from ckptscan.layouts.base import HeadOverrides, LayerPlan, LayerWeights, ModelInfo, ModelLayout, model_types
from ckptscan.layouts.stated_config import ModelConfigFile, load_model_config, stated_config
from ckptscan.layouts.tensor_map import TensorMap, load_tensor_map
from ckptscan.readers import Checkpoint

# Name matching runs in this order: the more specific patterns first
# (DeepSeek's q_proj has no k_proj; legacy Megatron's query_key_value sits
# under `encoder.`/`transformer.`, NeoX's does not).
RESOLVERS = [
    deepseek, hf_llama, phi3, gpt2, nanogpt, litgpt, gptj, falcon, bert, switch,
    megatron, megatron_legacy, gpt_neox, torchtitan, olmo_core, maxtext,
]

__all__ = [
    "HeadOverrides", "LayerPlan", "LayerWeights", "ModelConfigFile", "ModelInfo", "ModelLayout", "TensorMap",
    "load_model_config", "load_tensor_map", "resolve_layout",
]


def resolve_layout(
    checkpoint: Checkpoint, overrides: HeadOverrides = HeadOverrides(), tensor_map: TensorMap | None = None
) -> ModelLayout:
    keys = set(checkpoint.tensors.keys())
    checkpoint = stated_config(checkpoint, overrides.model_config)
    if tensor_map is not None:
        return tensor_map.resolve(checkpoint, keys, overrides)
    for model_type in model_types(checkpoint.config):
        for resolver in RESOLVERS:
            if model_type in resolver.MODEL_TYPES:
                return resolver.resolve(checkpoint, keys, overrides)
    for resolver in RESOLVERS:
        if resolver.matches(checkpoint, keys):
            return resolver.resolve(checkpoint, keys, overrides)
    types = model_types(checkpoint.config)
    what = f"model_type '{types[0]}'" if types else "these tensor names"
    raise CkptScanError(f"no layout resolver recognises {what}; see `ckptscan inspect` for the tensor names, the "
                        "list of supported families in docs/supported-checkpoints.md, or describe the names with "
                        "--tensor-map",
                        path=checkpoint.path)
