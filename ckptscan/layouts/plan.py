"""One layer's plan from where its Q/K and router tensors are: shapes
checked against the geometry, roles named, and the build function that turns
the raw tensors into per-head blocks (fused layouts split, transposes undone,
QK-norm gains folded) and a router [E, D]."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from ckptscan.errors import CkptScanError
from ckptscan.layouts.base import (
    Builder,
    LayerPlan,
    LayerWeights,
    ModelInfo,
    ModelLayout,
    head_blocks,
    require_shape,
)
from ckptscan.layouts.geometry import Geometry, fold_head_gains, split_qkv

Shape = Callable[[str], tuple[int, ...]]


@dataclass(frozen=True)
class QKTensors:
    """Where one layer's query and key weights are and how they are stored."""

    q: str  # W_q, or the fused QKV weight when `fused` is set
    k: str | None = None
    fused: str | None = None  # one of FUSED_LAYOUTS
    transposed: bool = False  # stored [in, out] (GPT-2 Conv1D)
    q_norm: str | None = None  # QK-norm gains, per head [d] or flat [n·d]
    k_norm: str | None = None
    gain_offset: float = 0.0  # 1.0 where the norm scales by (1 + w) (Gemma)
    input_norm: str | None = None  # the gain [hidden] of the norm in front of attention


def key_tensor(qk: QKTensors, path: Any) -> str:
    """The key projection of separate q/k weights, which every such layer needs."""
    if qk.k is None:
        raise CkptScanError("a key projection is required unless q is fused", path=path, tensor=qk.q)
    return qk.k


@dataclass(frozen=True)
class RouterTensors:
    weight: str  # [E, D], or flat [E·D] when `flat`
    bias: str | None = None  # selection bias [E] (expert_bias, e_score_correction_bias)
    flat: bool = False  # OLMo-core stores the router flat and views it (E, D)


def layer_plan(
    layer: int,
    geometry: Geometry,
    qk: QKTensors | None,
    router: RouterTensors | None,
    shape: Shape,
    path: Any,
    *,
    num_experts: int | None = None,
    router_scoring: str | None = None,
) -> LayerPlan:
    """Validate one layer's tensor shapes against the geometry and return its plan."""
    h, g, d, hidden = geometry.num_heads, geometry.num_kv_heads, geometry.head_dim, geometry.hidden_size
    roles: dict[str, str] = {}

    def check(name: str, expected: tuple[int, ...], why: str) -> None:
        require_shape(tuple(shape(name)), expected, tensor=name, path=path, why=why)

    def check_gain(name: str, heads: int) -> None:
        actual = tuple(shape(name))
        if actual not in ((d,), (heads * d,), (heads, d)):
            raise CkptScanError(f"norm gain of shape {list(actual)} fits neither head_dim {d} nor {heads} heads x {d}",
                                path=path, tensor=name)

    if qk is not None:
        if qk.fused is not None:
            rows = (h * (2 if qk.fused == "grouped_gated" else 1) + 2 * g) * d
            check(qk.q, (hidden, rows) if qk.transposed else (rows, hidden),
                  f"{h} heads, {g} KV heads of {d} rows ({qk.fused}{', transposed' if qk.transposed else ''})")
            roles[qk.q] = "W_qkv"
        else:
            # Transposed weights get their own role: their rows are not heads.
            for name, heads, role in ((qk.q, h, "W_q"), (key_tensor(qk, path), g, "W_k")):
                check(name, (hidden, heads * d) if qk.transposed else (heads * d, hidden), f"{heads} heads x {d} rows")
                roles[name] = f"{role}^T" if qk.transposed else role
        for gain, heads, role in ((qk.q_norm, h, "q_norm"), (qk.k_norm, g, "k_norm")):
            if gain is not None:
                check_gain(gain, heads)
                roles[gain] = role
        if qk.input_norm is not None:
            check(qk.input_norm, (hidden,), f"hidden {hidden}")
            roles[qk.input_norm] = "input_norm"
    if router is not None:
        experts = num_experts or tuple(shape(router.weight))[0]
        if router.flat:
            check(router.weight, (experts * hidden,), f"{experts} experts x hidden {hidden}, flat")
        else:
            check(router.weight, (experts, hidden), f"{experts} experts x hidden {hidden}")
        roles[router.weight] = "router"
        if router.bias is not None:
            check(router.bias, (experts,), f"{experts} experts")
            roles[router.bias] = "router_bias"
        num_experts = experts

    build = _standard_builder(geometry, qk, router, num_experts, router_scoring, path)
    return LayerPlan(layer, tuple(roles), build, roles)


def attention_layout(family: str, geometry: Geometry, qk: Mapping[int, QKTensors], shape: Shape, path: Any
                     ) -> ModelLayout:
    """The layout of a model without routers: one attention plan per layer."""
    plans = [layer_plan(i, geometry, qk[i], None, shape, path) for i in sorted(qk)]
    return ModelLayout(model_info(family, geometry, plans, shape), plans, list(geometry.notes))


def model_info(
    family: str,
    geometry: Geometry,
    plans: list[LayerPlan],
    shape: Shape,
    *,
    num_experts: int | None = None,
    top_k: int | None = None,
    router_scoring: str | None = None,
    rope_head_dim: int | None = None,
) -> ModelInfo:
    """The model's shape from its geometry and plans. The router fields stay
    None when no layer has a router; E defaults to the first router's size
    over hidden_size (the rows of [E, D], or OLMo-core's flat [E·D])."""
    routers = [name for plan in plans for name, role in plan.roles.items() if role == "router"]
    if routers and num_experts is None:
        num_experts = math.prod(shape(routers[0])) // geometry.hidden_size
    return ModelInfo(
        family=family,
        num_layers=len(plans),
        hidden_size=geometry.hidden_size,
        num_heads=geometry.num_heads,
        num_kv_heads=geometry.num_kv_heads,
        head_dim=geometry.head_dim,
        num_experts=num_experts if routers else None,
        top_k=top_k if routers else None,
        router_scoring=router_scoring if routers else None,
        rope_head_dim=rope_head_dim,
    )


def _standard_builder(
    geometry: Geometry,
    qk: QKTensors | None,
    router: RouterTensors | None,
    num_experts: int | None,
    router_scoring: str | None,
    path: Any,
) -> Builder:
    h, g, d = geometry.num_heads, geometry.num_kv_heads, geometry.head_dim

    def build(raw: Mapping[str, torch.Tensor], dtype: torch.dtype) -> LayerWeights:
        weights = LayerWeights() if router_scoring is None else LayerWeights(router_scoring=router_scoring)
        if qk is not None:
            # Blocks stay in the stored dtype until a gain is folded in:
            # fold_head_gains multiplies without rounding to it.
            if qk.fused is not None:
                fused = raw[qk.q]
                q, k = split_qkv(fused.T if qk.transposed else fused, qk.fused, geometry)
            else:
                k_name = key_tensor(qk, path)
                q_weight, k_weight = raw[qk.q], raw[k_name]
                if qk.transposed:
                    q_weight, k_weight = q_weight.T, k_weight.T
                q = head_blocks(q_weight, h, d, tensor=qk.q, path=path)
                k = head_blocks(k_weight, g, d, tensor=k_name, path=path)
            weights.q = _folded(q, raw[qk.q_norm] if qk.q_norm else None, qk.gain_offset, dtype)
            weights.k = _folded(k, raw[qk.k_norm] if qk.k_norm else None, qk.gain_offset, dtype)
            if qk.input_norm is not None:
                # As stored where there is no offset: its one use (the logit scale) casts it to the compute dtype.
                gain = raw[qk.input_norm]
                weights.input_gain = _gain(gain, qk.gain_offset) if qk.gain_offset else gain
            if qk.q_norm and qk.k_norm and raw[qk.q_norm].numel() == d and raw[qk.k_norm].numel() == d:
                # Per-head QK-norm (Qwen3, Gemma3): each head normalised on its own.
                weights.q_norm_gain = _gain(raw[qk.q_norm], qk.gain_offset).reshape(d)
                weights.k_norm_gain = _gain(raw[qk.k_norm], qk.gain_offset).reshape(d)
        if router is not None:
            weights.router = raw[router.weight].to(dtype).reshape(num_experts, -1)
            weights.router_bias = raw[router.bias].to(dtype) if router.bias is not None else None
        return weights

    return build


def _gain(gain: torch.Tensor, offset: float) -> torch.Tensor:
    """A norm's gain as it scales, in float64: w, or 1 + w (Gemma)."""
    return gain.to(torch.float64) + offset if offset else gain.to(torch.float64)


def _folded(blocks: torch.Tensor, gain: torch.Tensor | None, offset: float, dtype: torch.dtype) -> torch.Tensor:
    """Head blocks with their norm gain folded in (exactly, see fold_head_gains),
    or upcast to the compute dtype when there is no gain."""
    if gain is None:
        return blocks.to(dtype)
    return fold_head_gains(blocks, gain, offset=offset)


# ---- The output family: the LM head and the final norm -------------------


@dataclass(frozen=True)
class OutputTensors:
    """Where the LM head and the final norm are. `tied`: the checkpoint has no
    head of its own and the token embedding is the head (Hugging Face
    `tie_word_embeddings` saves only the embedding)."""

    head: str  # [V, hidden]
    tied: bool = False
    final_norm: str | None = None  # the gain [hidden] of the norm in front of the head
    gain_offset: float = 0.0  # 1.0 where the norm scales by (1 + w) (Gemma, Megatron's layernorm-1p)


def find_output(keys: set[str], heads: tuple[str, ...], embeddings: tuple[str, ...], norms: tuple[str, ...],
                *, tied: bool | None = None, gain_offset: float = 0.0) -> tuple[OutputTensors | None, str | None]:
    """The output tensors from candidate names (the first present of each),
    and a note for `inspect`. A head of its own is used when there is one;
    else the embedding, unless the config says the head is not tied (`tied`
    False: a checkpoint without its head, e.g. a pipeline stage): then no
    output tensors, and the note says why the family is not judged."""
    norm = next((n for n in norms if n in keys), None)
    head = next((n for n in heads if n in keys), None)
    if head is not None and tied is not True:
        return OutputTensors(head, False, norm, gain_offset), None
    embedding = next((n for n in embeddings if n in keys), None)
    if embedding is not None and tied is not False:
        return OutputTensors(embedding, True, norm, gain_offset), f"output family: the head is tied to {embedding}"
    if head is not None:
        return OutputTensors(head, False, norm, gain_offset), None
    why = ("the config says the head is not tied to the embedding, and the checkpoint holds no head"
           if tied is False and embedding is not None else f"no LM head ({', '.join(heads)}) or token embedding")
    return None, f"output family not judged: {why}"


def attach_output(layout: ModelLayout, output: OutputTensors | None, note: str | None, shape: Shape,
                  path: Any) -> ModelLayout:
    """The layout with the head and final norm read beside the model's last
    layer (the output family's values are that layer's), checked against
    the hidden size; `note` goes to the layout's notes."""
    if note:
        layout.notes.append(note)
    if output is None or not layout.layers:
        return layout
    hidden = layout.info.hidden_size
    head_shape = tuple(shape(output.head))
    if len(head_shape) != 2 or head_shape[1] != hidden:
        raise CkptScanError(f"shape {list(head_shape)} is not [vocabulary, hidden {hidden}]", path=path,
                            tensor=output.head)
    roles = {output.head: "embedding" if output.tied else "lm_head"}
    if output.final_norm is not None:
        require_shape(tuple(shape(output.final_norm)), (hidden,), tensor=output.final_norm, path=path,
                      why=f"hidden {hidden}")
        roles[output.final_norm] = "final_norm"
    last = layout.layers[-1]
    inner = last.build

    def build(raw: Mapping[str, torch.Tensor], dtype: torch.dtype) -> LayerWeights:
        weights = inner(raw, dtype)
        weights.head, weights.head_tied = raw[output.head], output.tied
        if output.final_norm is not None:
            weights.final_gain = _gain(raw[output.final_norm], output.gain_offset)
        return weights

    fresh = [name for name in roles if name not in last.roles]
    layout.layers[-1] = LayerPlan(last.layer, (*last.tensors, *fresh), build, {**last.roles, **roles})
    return layout
