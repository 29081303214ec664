"""What a layout resolver produces: the model's shape and, per layer, which
tensors to read and how to turn them into per-head Q/K blocks and a router.

A resolver only looks at tensor names, shapes and the config; it reads no
tensor data. Each `LayerPlan.build` is a pure function from the raw tensors
of one layer to `LayerWeights`, so the scan can read one layer at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from ckptscan.errors import CkptScanError


@dataclass(frozen=True)
class ModelInfo:
    family: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_experts: int | None = None
    top_k: int | None = None


@dataclass
class LayerWeights:
    """One layer's monitored weights, upcast to the scan's compute dtype.

    q: [H, r, d] query head blocks and k: [G, r, d] key head blocks with any
    QK-norm gain folded in; router: [E, d]; router_bias: [E] (selection bias).
    """

    q: torch.Tensor | None = None
    k: torch.Tensor | None = None
    router: torch.Tensor | None = None
    router_bias: torch.Tensor | None = None


Builder = Callable[[Mapping[str, torch.Tensor], torch.dtype], LayerWeights]


@dataclass
class LayerPlan:
    layer: int
    tensors: tuple[str, ...]
    build: Builder
    # Human-readable roles of the tensors read, for `ckptscan inspect`.
    roles: dict[str, str] = field(default_factory=dict)


@dataclass
class ModelLayout:
    info: ModelInfo
    layers: list[LayerPlan]


@dataclass(frozen=True)
class HeadOverrides:
    """Head geometry from CLI flags, for checkpoints that carry no config."""

    num_heads: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None


def config_value(config: Mapping[str, Any] | None, *names: str) -> Any:
    """First of `names` present in the config or its `text_config` (multimodal
    wrappers keep the language model's settings there)."""
    for scope in (config or {}, (config or {}).get("text_config") or {}):
        for name in names:
            if isinstance(scope, Mapping) and scope.get(name) is not None:
                return scope[name]
    return None


def head_blocks(weight: torch.Tensor, num_heads: int, head_dim: int, *, tensor: str, path: Any = None) -> torch.Tensor:
    """Split an nn.Linear weight [n·r, d] into head blocks [n, r, d]
    (head h is rows h·r:(h+1)·r)."""
    if weight.ndim != 2 or weight.shape[0] != num_heads * head_dim:
        raise CkptScanError(
            f"shape {list(weight.shape)} does not split into {num_heads} heads of {head_dim} rows",
            path=path,
            tensor=tensor,
        )
    return weight.reshape(num_heads, head_dim, weight.shape[1])


def require_shape(actual: tuple[int, ...], expected: tuple[int, ...], *, tensor: str, path: Any, why: str) -> None:
    if tuple(actual) != tuple(expected):
        raise CkptScanError(f"shape {list(actual)} but {why} implies {list(expected)}", path=path, tensor=tensor)
