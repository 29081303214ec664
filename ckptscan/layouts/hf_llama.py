"""Hugging Face decoders with separate q_proj/k_proj (Llama and its kin).

Covers llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe, olmo,
olmo2, olmoe and gemma 1-3: `{prefix}layers.{i}.self_attn.{q,k}_proj.weight`
[H·r, D] / [G·r, D], optional QK-norm gains (`q_norm`/`k_norm`, per head [r]
or flat [H·r]; Gemma's RMSNorm scales by 1 + w), and MoE routers
`block_sparse_moe.gate.weight` (Mixtral) or `mlp.gate.weight` (Qwen-MoE,
OLMoE) of shape [E, D]. Qwen-MoE's `mlp.shared_expert_gate` [1, D] gates the
shared expert and is not a router; the exact key match keeps it out.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

import torch

from ckptscan.errors import CkptScanError
from ckptscan.layouts.base import (
    HeadOverrides,
    LayerPlan,
    LayerWeights,
    ModelInfo,
    ModelLayout,
    config_value,
    head_blocks,
    require_shape,
)
from ckptscan.monitors.attention import fold_head_gains

MODEL_TYPES = {
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
    "olmo", "olmo2", "olmoe", "gemma", "gemma2", "gemma3", "gemma3_text",
}
# Gemma's RMSNorm multiplies by (1 + weight): fold that, not the raw weight.
ONE_PLUS_GAIN = {"gemma", "gemma2", "gemma3", "gemma3_text"}
ROUTER_SUFFIXES = ("block_sparse_moe.gate.weight", "mlp.gate.weight")

_Q_PROJ = re.compile(r"^(.*?)layers\.(\d+)\.self_attn\.q_proj\.weight$")


def matches(keys: list[str], config: Mapping[str, Any] | None) -> bool:
    model_type = config_value(config, "model_type")
    if model_type is not None:
        return model_type in MODEL_TYPES
    return any(_Q_PROJ.match(k) for k in keys)


def resolve(tensors, config: Mapping[str, Any] | None, overrides: HeadOverrides, path: Any) -> ModelLayout:
    keys = tensors.keys()
    layer_ids: dict[int, str] = {}
    for key in keys:
        match = _Q_PROJ.match(key)
        if match:
            layer_ids[int(match.group(2))] = match.group(1)
    if not layer_ids:
        raise CkptScanError("no '*layers.N.self_attn.q_proj.weight' tensors found", path=path)
    prefixes = set(layer_ids.values())
    if len(prefixes) > 1:
        raise CkptScanError(f"attention tensors under several prefixes {sorted(prefixes)}", path=path)
    prefix = prefixes.pop()
    first = min(layer_ids)

    q_shape = tensors.shape(f"{prefix}layers.{first}.self_attn.q_proj.weight")
    k_shape = tensors.shape(f"{prefix}layers.{first}.self_attn.k_proj.weight")
    hidden = q_shape[1]
    num_heads = overrides.num_heads or config_value(config, "num_attention_heads", "n_head")
    if num_heads is None:
        raise CkptScanError(
            "the number of attention heads is unknown (no config.json with num_attention_heads): pass --num-heads",
            path=path,
        )
    head_dim = overrides.head_dim or config_value(config, "head_dim") or q_shape[0] // num_heads
    num_kv_heads = overrides.num_kv_heads or config_value(config, "num_key_value_heads", "num_kv_heads")
    if num_kv_heads is None:
        if config is None:
            raise CkptScanError("the number of KV heads is unknown (no config.json): pass --num-kv-heads", path=path)
        num_kv_heads = num_heads
    require_shape(q_shape, (num_heads * head_dim, hidden), tensor=f"{prefix}layers.{first}.self_attn.q_proj.weight",
                  path=path, why=f"{num_heads} heads x head_dim {head_dim}")
    require_shape(k_shape, (num_kv_heads * head_dim, hidden), tensor=f"{prefix}layers.{first}.self_attn.k_proj.weight",
                  path=path, why=f"{num_kv_heads} KV heads x head_dim {head_dim}")
    if num_heads % num_kv_heads:
        raise CkptScanError(f"{num_heads} heads do not group over {num_kv_heads} KV heads", path=path)

    one_plus = config_value(config, "model_type") in ONE_PLUS_GAIN
    key_set = set(keys)
    num_experts = None
    plans = []
    for layer in sorted(layer_ids):
        base = f"{prefix}layers.{layer}."
        roles = {f"{base}self_attn.q_proj.weight": "W_q", f"{base}self_attn.k_proj.weight": "W_k"}
        for role, name in (("q_norm", f"{base}self_attn.q_norm.weight"), ("k_norm", f"{base}self_attn.k_norm.weight")):
            if name in key_set:
                roles[name] = role
        router = next((base + s for s in ROUTER_SUFFIXES if base + s in key_set), None)
        if router is not None:
            shape = tensors.shape(router)
            require_shape(shape[1:], (hidden,), tensor=router, path=path, why=f"hidden size {hidden}")
            num_experts = shape[0]
            roles[router] = "router"
        plans.append(LayerPlan(layer, tuple(roles), _builder(roles, num_heads, num_kv_heads, head_dim, one_plus, path),
                               roles))

    info = ModelInfo(
        family=str(config_value(config, "model_type") or "llama"),
        num_layers=len(plans),
        hidden_size=hidden,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        num_experts=num_experts or config_value(config, "num_local_experts", "num_experts"),
        top_k=config_value(config, "num_experts_per_tok"),
    )
    return ModelLayout(info, plans)


def _builder(roles: dict[str, str], num_heads: int, num_kv_heads: int, head_dim: int, one_plus: bool, path: Any):
    by_role = {role: name for name, role in roles.items()}

    def fold(blocks: torch.Tensor, raw: Mapping[str, torch.Tensor], role: str, dtype: torch.dtype) -> torch.Tensor:
        if role not in by_role:
            return blocks
        gain = raw[by_role[role]].to(dtype)
        try:
            return fold_head_gains(blocks, 1 + gain if one_plus else gain)
        except ValueError as e:
            raise CkptScanError(str(e), path=path, tensor=by_role[role]) from None

    def build(raw: Mapping[str, torch.Tensor], dtype: torch.dtype) -> LayerWeights:
        q = head_blocks(raw[by_role["W_q"]].to(dtype), num_heads, head_dim, tensor=by_role["W_q"], path=path)
        k = head_blocks(raw[by_role["W_k"]].to(dtype), num_kv_heads, head_dim, tensor=by_role["W_k"], path=path)
        router = raw[by_role["router"]].to(dtype) if "router" in by_role else None
        return LayerWeights(q=fold(q, raw, "q_norm", dtype), k=fold(k, raw, "k_norm", dtype), router=router)

    return build
