"""Head geometry: how many query heads, KV heads and rows per head, and
where each number came from.

CLI flags take precedence over what the checkpoint states (config.json,
Megatron `args`, nanoGPT `model_args`); every number is then checked against
the tensor shapes. A number that can be derived from the shapes is derived
(given H, separate q/k projections fix d and G); one that cannot is an error
naming the flag that supplies it. `split_qkv` cuts the fused layouts into
head blocks and `fold_head_gains` folds QK-norm gains into them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ckptscan.errors import CkptScanError
from ckptscan.layouts.base import HeadOverrides, require_shape

# Fused QKV layouts (rows of an [out, in] weight, d rows per head):
#   blocked        [Q(H·d) | K(G·d) | V(G·d)]            Phi-3, GPT-2, nanoGPT, Falcon MQA
#   grouped        G × [q·(H/G) | k | v]                   Megatron linear_qkv, Falcon new arch,
#                                                          NeoX and Falcon-RW (G = H)
#   grouped_gated  G × [q·(H/G) | gate·(H/G) | k | v]      Megatron attention_output_gate
#   row_interleaved  H × d × [q, k, v] rows (MHA only)     Megatron checkpoint_version 1.0
FUSED_LAYOUTS = ("blocked", "grouped", "grouped_gated", "row_interleaved")

_LOW_PRECISION = (torch.bfloat16, torch.float16)
# What --model-config reads (stated_config.load_model_config).
MODEL_CONFIG_KINDS = "a config.json, a litgpt model_config.yaml, a torchtitan job .toml"


@dataclass(frozen=True)
class HeadHints:
    """Head counts the checkpoint states, each with where it came from; CLI
    flags take precedence over anything the checkpoint says."""

    num_heads: tuple[int, str] | None = None
    num_kv_heads: tuple[int, str] | None = None
    head_dim: tuple[int, str] | None = None

    @classmethod
    def gather(
        cls,
        overrides: HeadOverrides,
        num_heads: tuple[Any, str] | None = None,
        num_kv_heads: tuple[Any, str] | None = None,
        head_dim: tuple[Any, str] | None = None,
        *,
        path: Any = None,
    ) -> HeadHints:
        def pick(flag_value: int | None, flag: str, found: tuple[Any, str] | None) -> tuple[int, str] | None:
            if flag_value is not None:
                return _positive(flag_value, flag, path), flag
            if found is None:
                return None
            return _positive(found[0], found[1], path), found[1]

        return cls(
            pick(overrides.num_heads, "--num-heads", num_heads),
            pick(overrides.num_kv_heads, "--num-kv-heads", num_kv_heads),
            pick(overrides.head_dim, "--head-dim", head_dim),
        )


def mha_hints(overrides: HeadOverrides, num_heads: tuple[Any, str] | None, family: str, path: Any,
              head_dim: tuple[Any, str] | None = None) -> HeadHints:
    """Hints for a multi-head-only family: KV heads = query heads, and a
    --num-kv-heads that says otherwise is an error, not an override."""
    hints = HeadHints.gather(HeadOverrides(overrides.num_heads, None, overrides.head_dim), num_heads, None, head_dim,
                             path=path)
    if hints.num_heads is None:
        return hints
    heads = hints.num_heads[0]
    if overrides.num_kv_heads not in (None, heads):
        raise CkptScanError(f"{family} attention is multi-head: --num-kv-heads {overrides.num_kv_heads} contradicts "
                            f"{heads} heads ({hints.num_heads[1]})", path=path)
    return HeadHints(hints.num_heads, (heads, f"{family} is multi-head (KV heads = heads)"), hints.head_dim)


def _positive(value: Any, where: str, path: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CkptScanError(f"{where} must be a positive integer, not {value!r}", path=path)
    return value


@dataclass(frozen=True)
class Geometry:
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    notes: tuple[str, ...] = ()


def missing(what: str, flag: str, path: Any, looked: str = "") -> CkptScanError:
    """The error for a head count the checkpoint does not state."""
    where = f" ({looked})" if looked else ""
    return CkptScanError(f"cannot split attention heads: {what} is unknown{where}; pass {flag}, or --model-config "
                         f"FILE with the model's config ({MODEL_CONFIG_KINDS})", path=path)


def separate_geometry(
    hints: HeadHints,
    q: tuple[str, tuple[int, ...]],
    k: tuple[str, tuple[int, ...]],
    path: Any,
    looked: str = "no config.json with num_attention_heads",
) -> Geometry:
    """Heads of separate q/k projections [H·d, D] / [G·d, D]: given H the
    shapes fix d = rows/H and G = k rows/d, and stated values must agree."""
    (q_name, q_shape), (k_name, k_shape) = q, k
    if hints.num_heads is None:
        raise missing("the number of query heads", "--num-heads", path, looked)
    num_heads, heads_from = hints.num_heads
    if len(q_shape) != 2 or len(k_shape) != 2 or q_shape[1] != k_shape[1]:
        raise CkptScanError(f"q/k projections of shapes {list(q_shape)} and {list(k_shape)} are not [heads·d, hidden]",
                            path=path, tensor=k_name)
    hidden = q_shape[1]
    if hints.head_dim is not None:
        head_dim, dim_from = hints.head_dim
    elif q_shape[0] % num_heads == 0:
        head_dim, dim_from = q_shape[0] // num_heads, f"{q_name} rows / heads"
    else:
        raise CkptScanError(f"{q_shape[0]} rows do not split into {num_heads} heads ({heads_from})",
                            path=path, tensor=q_name)
    require_shape(q_shape, (num_heads * head_dim, hidden), tensor=q_name, path=path,
                  why=f"{num_heads} heads ({heads_from}) x head_dim {head_dim} ({dim_from})")
    if k_shape[0] % head_dim:
        raise CkptScanError(f"{k_shape[0]} rows are not whole heads of {head_dim} rows", path=path, tensor=k_name)
    num_kv_heads, kv_from = k_shape[0] // head_dim, f"{k_name} rows / head_dim"
    if hints.num_kv_heads is not None and hints.num_kv_heads[0] != num_kv_heads:
        raise CkptScanError(f"{hints.num_kv_heads[1]} says {hints.num_kv_heads[0]} KV heads but the shape "
                            f"{list(k_shape)} holds {num_kv_heads} of {head_dim} rows", path=path, tensor=k_name)
    return _checked(hidden, num_heads, num_kv_heads, head_dim, path,
                    (f"query heads {num_heads}: {heads_from}", f"KV heads {num_kv_heads}: {kv_from}",
                     f"head_dim {head_dim}: {dim_from}"))


def fused_geometry(
    hints: HeadHints,
    name: str,
    rows: int,
    hidden: int,
    layout: str,
    path: Any,
    default_head_dim: tuple[int, str] | None = None,
    looked: str = "no config.json with num_attention_heads",
) -> Geometry:
    """Heads of a fused QKV weight with `rows` output rows.

    rows = (q·H + 2G)·d with q = 2 for the gated layout, else 1. H is always
    needed; then either d (stated, or the family's documented default such as
    hidden/H) or G fixes the other. Without either the split is ambiguous.
    """
    if layout not in FUSED_LAYOUTS:
        raise CkptScanError(f"unknown fused layout {layout!r} (expected one of {', '.join(FUSED_LAYOUTS)})",
                            path=path)
    if hints.num_heads is None:
        raise missing("the number of query heads", "--num-heads", path, looked)
    num_heads, heads_from = hints.num_heads
    q_width = 2 * num_heads if layout == "grouped_gated" else num_heads
    stated_dim = hints.head_dim if hints.head_dim is not None else default_head_dim if hints.num_kv_heads is None \
        else None
    if stated_dim is not None:
        head_dim, dim_from = stated_dim
        if hints.num_kv_heads is not None:
            num_kv_heads, kv_from = hints.num_kv_heads
        else:
            spare = rows - q_width * head_dim
            if rows % head_dim or spare <= 0 or spare % (2 * head_dim):
                raise CkptScanError(f"{rows} rows do not hold {num_heads} query heads plus K/V heads of {head_dim} "
                                    f"rows ({dim_from})", path=path, tensor=name)
            num_kv_heads, kv_from = spare // (2 * head_dim), f"{name} rows"
    elif hints.num_kv_heads is not None:
        num_kv_heads, kv_from = hints.num_kv_heads
        if rows % (q_width + 2 * num_kv_heads):
            raise CkptScanError(f"{rows} rows do not split into {num_heads} query and {num_kv_heads} K/V heads",
                                path=path, tensor=name)
        head_dim, dim_from = rows // (q_width + 2 * num_kv_heads), f"{name} rows"
    else:
        raise missing("the head size (or the number of KV heads)", "--head-dim or --num-kv-heads", path, looked)
    require_shape((rows,), ((q_width + 2 * num_kv_heads) * head_dim,), tensor=name, path=path,
                  why=f"{num_heads} heads ({heads_from}), {num_kv_heads} KV heads ({kv_from}) and head_dim "
                      f"{head_dim} ({dim_from})")
    return _checked(hidden, num_heads, num_kv_heads, head_dim, path,
                    (f"query heads {num_heads}: {heads_from}", f"KV heads {num_kv_heads}: {kv_from}",
                     f"head_dim {head_dim}: {dim_from}"))


def _checked(hidden: int, num_heads: int, num_kv_heads: int, head_dim: int, path: Any, notes: tuple[str, ...]
             ) -> Geometry:
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        raise CkptScanError(f"{num_heads} query heads do not group over {num_kv_heads} KV heads", path=path)
    return Geometry(hidden, num_heads, num_kv_heads, head_dim, notes)


def split_qkv(weight: torch.Tensor, layout: str, geometry: Geometry) -> tuple[torch.Tensor, torch.Tensor]:
    """Query [H, d, D] and key [G, d, D] head blocks of a fused [out, D] weight
    (layouts in FUSED_LAYOUTS; query head order g·(H/G) + j, as repeat_kv)."""
    h, g, d = geometry.num_heads, geometry.num_kv_heads, geometry.head_dim
    width = weight.shape[-1]
    if layout == "blocked":
        return weight[: h * d].reshape(h, d, width), weight[h * d : (h + g) * d].reshape(g, d, width)
    if layout == "row_interleaved":
        rows = weight.reshape(h, d, 3, width)
        return rows[:, :, 0], rows[:, :, 1]
    per_group = h // g
    slots = (2 * per_group if layout == "grouped_gated" else per_group) + 2
    groups = weight.reshape(g, slots, d, width)
    return groups[:, :per_group].reshape(h, d, width), groups[:, slots - 2]


def fold_head_gains(weight: torch.Tensor, gain: torch.Tensor, *, offset: float = 0.0) -> torch.Tensor:
    """Multiply the rows of each head block [n, r, d] by a norm gain: diag(γ) W_h.

    `gain` is per head ([r], shared by all heads: Qwen3/Gemma3 `q_norm`) or
    flat over the projection ([n·r] or [n, r]: OLMo2/OLMoE). `offset` is added
    to the gain in float64 first: Gemma's RMSNorm scales by (1 + w), so pass the
    raw w with offset=1.0 (computing 1 + w in bf16/float32 would round it).
    The per-token 1/rms factor is a scalar per token and does not change the
    spectrum shape.

    The product is never rounded to the stored precision: it is float32 when
    both operands are bf16/float16 (the product of two ≤ 11-bit mantissas is
    exact in float32) and float64 otherwise, so that checkpoints folded
    separately still difference exactly.
    """
    n, r, _ = weight.shape
    if gain.numel() == r:
        scale = gain.reshape(1, r)
    elif gain.numel() == n * r:
        scale = gain.reshape(n, r)
    else:
        raise ValueError(f"norm gain of {gain.numel()} values fits neither {r} nor {n}x{r}")
    exact_in_f32 = weight.dtype in _LOW_PRECISION and gain.dtype in _LOW_PRECISION and offset == 0.0
    out = torch.float32 if exact_in_f32 else torch.float64
    scale = scale.to(out) + offset if offset else scale.to(out)
    return weight.to(out) * scale.unsqueeze(-1)
