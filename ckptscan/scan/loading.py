"""Loading one checkpoint's layer: its tensors read, counted for non-finite
values, built into the layout's weights in the compute dtype (float64 when
float32 Grams would overflow), with the Grams a later pair reuses and the
probe's routing."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ckptscan.errors import CkptScanError
from ckptscan.layouts import LayerPlan, LayerWeights
from ckptscan.layouts.base import OUTPUT_ROLES, ROUTER_ROLES
from ckptscan.monitors.attention import QKGrams, qk_grams
from ckptscan.monitors.routing import RoutingStats, routing_stats
from ckptscan.readers import Checkpoint
from ckptscan.scan.options import DEFAULT_TOP_K, ScanOptions
from ckptscan.scan.reading import read_layer
from ckptscan.scan.selection import HeadSelection, router_name


@dataclass
class LoadedLayer:
    """One checkpoint's layer as the pairs that include it need it."""

    weights: LayerWeights
    nonfinite: dict[str, int]
    qk_finite: bool = False  # W_q/W_k present, finite and within the compute dtype's range
    grams: QKGrams | None = None  # only for a checkpoint that is the older side of a pair
    routing: RoutingStats | None = None
    stored_dtype: dict[str, str] = field(default_factory=dict)  # role -> safetensors dtype name
    compute_dtype: torch.dtype = torch.float32


def load_layer(
    ckpt: Checkpoint,
    plan: LayerPlan,
    options: ScanOptions,
    probe_input: torch.Tensor | None = None,
    top_k: int = DEFAULT_TOP_K,
    selection: HeadSelection | None = None,
    as_base: bool = True,
    keep_head: bool = False,
) -> LoadedLayer:
    """One checkpoint's layer, read and checked. `as_base`: the checkpoint is
    the older side of some pair, whose Grams `qk_spectra` reuses; the newer
    side's are assembled from the difference blocks, so they are not formed.
    `keep_head`: several pairs read this checkpoint's LM head, which is then
    kept as it is read instead of being read again (`StoredRows`)."""
    dtype = options.compute_dtype
    raw = read_layer(ckpt, plan, selection, options.device, keep_head)
    weights = _build(plan, raw, dtype, selection)
    # One readback of the layer's checks: each tensor's Frobenius norm (finite
    # iff every value is: NaN and ±Inf propagate through it; an overflowing
    # sum of squares only sends that tensor to the exact count), those of the
    # built W_q/W_k blocks bounding their Gram entries. One multi-tensor op,
    # ~20x faster on a CPU than the same op's max |w| (12 ms a 2048² bf16 tensor).
    # (The LM head is `StoredRows`: its pass counts what it reads, `comparing.compare`.)
    tensors = {name: t for name, t in raw.items() if isinstance(t, torch.Tensor)}
    floats = {name: t for name, t in tensors.items() if t.dtype in _PROVABLE and t.numel()}
    blocks = [w for w in (weights.q, weights.k) if w is not None and w.numel()]
    norms = torch._foreach_norm(list(floats.values()) + blocks) if floats or blocks else []
    checks = torch.cat([n.reshape(1) for n in norms]).tolist() if norms else []  # cat promotes the dtypes
    nonfinite = {}
    # A tensor of another dtype (fp8 as stored) has no such proof: it is counted.
    unproven = [name for name, t in tensors.items() if t.is_floating_point() and t.dtype not in _PROVABLE]
    for name in [n for n, norm in zip(floats, checks) if not math.isfinite(norm)] + unproven:
        bad = int((~torch.isfinite(raw[name])).sum())
        if bad:
            nonfinite[plan.roles.get(name, name)] = bad
    frobenius = max(checks[len(floats):], default=0.0)
    grams = None
    # A non-finite router or head leaves attention judged (the numeric rule names the tensor).
    qk_finite = weights.q is not None and all(r in ROUTER_ROLES or r in OUTPUT_ROLES for r in nonfinite)
    if qk_finite:
        if _overflows(weights, frobenius, dtype) and dtype != torch.float64:
            # Finite weights so large (|w| ≳ 1e17) that their float32 Grams
            # overflow: this layer is computed in float64, which holds the
            # square of any value a float32 or narrower dtype can store.
            dtype = torch.float64
            weights = _build(plan, raw, dtype, selection)
        if _overflows(weights, frobenius, dtype):
            name = next(n for n, role in plan.roles.items() if role not in ROUTER_ROLES and role not in OUTPUT_ROLES)
            raise CkptScanError("values too large for float64 arithmetic", path=ckpt.path, tensor=name)
        grams = qk_grams(weights.q, weights.k, dtype) if as_base else None
    routing = None
    # A non-finite router weight or bias leaves the routing null (the numeric rule reports it).
    if probe_input is not None and weights.router is not None and not any(r in nonfinite for r in ROUTER_ROLES):
        try:
            routing = routing_stats(probe_input, weights.router, top_k, scoring=weights.router_scoring,
                                    selection_bias=weights.router_bias, compute_dtype=dtype)
        except ValueError as e:
            raise CkptScanError(f"cannot route the probe: {e}", path=ckpt.path, tensor=router_name(plan)) from None
    stored = {plan.roles.get(name, name): ckpt.tensors.dtype(name) for name in plan.tensors}
    return LoadedLayer(weights, nonfinite, qk_finite, grams, routing, stored, dtype)


# Dtypes whose norm proves every value finite (one fast pass instead of the
# exact count's three); only a non-finite norm pays for the count.
_PROVABLE = (torch.bfloat16, torch.float16, torch.float32, torch.float64)


def _build(plan: LayerPlan, raw: dict[str, torch.Tensor], dtype: torch.dtype,
           selection: HeadSelection | None) -> LayerWeights:
    weights = plan.build(raw, dtype)
    if selection is not None and weights.q is not None and weights.k is not None:  # set together by every layout
        weights.q, weights.k = weights.q[selection.heads], weights.k[selection.kv_heads]
        if weights.rope_q is not None:  # MLA: every head shares the one rope key
            weights.rope_q = weights.rope_q[selection.heads]
    return weights


def _overflows(weights: LayerWeights, frobenius: float, dtype: torch.dtype) -> bool:
    """Whether Gram entries can come within 16x of `dtype`'s range: the ΔQ Grams
    of a pair can be 4x larger than either checkpoint's.

    Every entry of a Gram of rows w_i, w_j is at most ‖w_i‖‖w_j‖ ≤ ‖W‖_F²
    (Cauchy–Schwarz; `frobenius` the larger of W_q's and W_k's norms), so
    weights within that bound need no Gram formed; only weights past it (a
    norm past ~1e18 in float32) pay for the exact check of their Grams."""
    limit = torch.finfo(dtype).max / 16
    q, k = weights.q, weights.k
    if frobenius * frobenius <= limit:  # a Python float: its square cannot overflow here
        return False
    grams = qk_grams(q, k, dtype)
    return not all(bool(g.abs().amax() <= limit) for g in (grams.qq, grams.kk) if g.numel())
