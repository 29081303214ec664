"""DeepSeek-V2/V3 in Hugging Face naming: MLA attention and sigmoid/softmax routers.

Per layer `{prefix}layers.{i}.self_attn.`: `q_a_proj`, `q_a_layernorm`,
`q_b_proj` (or `q_proj` without query LoRA, V2-Lite), `kv_a_proj_with_mqa`,
`kv_a_layernorm`, `kv_b_proj` (see mla.py for the head layout). MoE layers
(index ≥ first_k_dense_replace) have the router `mlp.gate.weight` [E, D]
(E = n_routed_experts); V3 adds `mlp.gate.e_score_correction_bias` [E], a
selection-only bias of its sigmoid router (TF `deepseek_v3`). Dense layers
have `mlp.gate_proj` instead, so the exact key `mlp.gate.weight` tells them
apart. Layers ≥ num_hidden_layers (V3's `model.layers.61`) are the MTP
module, which transformers ignores; they are skipped here too.
"""

from __future__ import annotations

import re
from typing import Any

from ckptscan.errors import CkptScanError
from ckptscan.layouts.base import (
    HeadOverrides,
    ModelLayout,
    config_entry,
    config_value,
    find_layers,
    model_types,
)
from ckptscan.layouts.geometry import HeadHints
from ckptscan.layouts.mla import MLATensors, mla_geometry, mla_plan
from ckptscan.layouts.plan import RouterTensors, model_info
from ckptscan.readers.base import Checkpoint

MODEL_TYPES = {"deepseek_v2", "deepseek_v3"}
# TF deepseek_v3 always scores with a sigmoid; V2 with a softmax (config `scoring_func`).
DEFAULT_SCORING = {"deepseek_v3": "sigmoid", "deepseek_v2": "softmax"}
MLA_DIMS = ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank", "q_lora_rank")

_KV_A = re.compile(r"(?P<prefix>.*?)layers\.(?P<layer>\d+)\.self_attn\.kv_a_proj_with_mqa\.weight")


def matches(ckpt: Checkpoint, keys: set[str]) -> bool:
    return any(k.endswith("self_attn.kv_a_proj_with_mqa.weight") for k in keys)


def resolve(ckpt: Checkpoint, keys: set[str], overrides: HeadOverrides) -> ModelLayout:
    path, config = ckpt.path, ckpt.config
    layers = find_layers(keys, _KV_A, path, "*layers.N.self_attn.kv_a_proj_with_mqa.weight")
    family = next((t for t in model_types(config) if t in MODEL_TYPES), "deepseek")
    main_layers = config_value(config, "num_hidden_layers")
    notes = []
    mtp = sorted(i for i, name in layers.items() if _is_mtp(i, name, keys, main_layers))
    if mtp:
        notes.append(f"skipped layers {mtp}: multi-token-prediction module, not part of the main model")
    tensors = {i: _tensors(name, keys) for i, name in layers.items() if i not in mtp}
    if not tensors:
        raise CkptScanError("only MTP layers found", path=path)

    hints = HeadHints.gather(overrides, num_heads=config_entry(config, "num_attention_heads"), path=path)
    stated = {name: config_entry(config, name) for name in MLA_DIMS}
    if stated["q_lora_rank"] is None and config is not None and "q_lora_rank" in config:
        stated["q_lora_rank"] = (None, "config.json 'q_lora_rank'")
    shape = ckpt.tensors.shape
    geometry = mla_geometry(hints, tensors[min(tensors)], shape, stated, path,
                            looked="no config.json with num_attention_heads")
    notes[:0] = geometry.notes

    config_experts = config_value(config, "n_routed_experts")
    plans = []
    scoring = None
    for layer in sorted(tensors):
        base = layers[layer][: -len("self_attn.kv_a_proj_with_mqa.weight")]
        router = None
        if base + "mlp.gate.weight" in keys:
            bias = base + "mlp.gate.e_score_correction_bias"
            router = RouterTensors(base + "mlp.gate.weight", bias if bias in keys else None)
            scoring = _scoring(config, family, router)
            experts = shape(router.weight)[0]
            if config_experts is not None and experts != config_experts:
                raise CkptScanError(f"router has {experts} rows but config 'n_routed_experts' is {config_experts}",
                                    path=path, tensor=router.weight)
        plans.append(mla_plan(layer, geometry, tensors[layer], router, shape, path, scoring))

    info = model_info(family, geometry.heads(), plans, shape, top_k=config_value(config, "num_experts_per_tok"),
                      router_scoring=scoring, rope_head_dim=geometry.rope)
    return ModelLayout(info, plans, notes)


def _is_mtp(layer: int, kv_a_name: str, keys: set[str], main_layers: Any) -> bool:
    if isinstance(main_layers, int):
        return layer >= main_layers
    # Without a config, the MTP block is the one with its own embedding projection.
    return kv_a_name.replace("self_attn.kv_a_proj_with_mqa.weight", "eh_proj.weight") in keys


def _tensors(kv_a_name: str, keys: set[str]) -> MLATensors:
    attn = kv_a_name[: -len("kv_a_proj_with_mqa.weight")]
    lora = attn + "q_a_proj.weight" in keys
    return MLATensors(
        kv_a=kv_a_name,
        kv_a_norm=attn + "kv_a_layernorm.weight",
        kv_b=attn + "kv_b_proj.weight",
        q=None if lora else attn + "q_proj.weight",
        q_a=attn + "q_a_proj.weight" if lora else None,
        q_a_norm=attn + "q_a_layernorm.weight" if lora else None,
        q_b=attn + "q_b_proj.weight" if lora else None,
    )


def _scoring(config: Any, family: str, router: RouterTensors) -> str | None:
    stated = config_value(config, "scoring_func")
    if stated is not None:
        return str(stated)
    if family in DEFAULT_SCORING:
        return DEFAULT_SCORING[family]
    # e_score_correction_bias exists only on V3's router, which always uses a sigmoid.
    return "sigmoid" if router.bias is not None else None
