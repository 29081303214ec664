"""MoE router monitors from the router weight W_r ∈ R^{E×d} (rows w_e).

When routing collapses, router rows become alike: the conditioning ratio ε
falls and the rows' cosine similarity rises. Both are state metrics of one
checkpoint; the update ΔW_r gets the same spectral statistics as attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ckptscan.monitors.spectral import SpectralStats, gram_singular_values, spectral_stats

_F64 = torch.float64


@dataclass
class RouterMetrics:
    epsilon: float  # at b; inf when the mean row is zero
    epsilon_base: float  # at a
    cosine_similarity: float  # at b
    cosine_similarity_base: float  # at a
    dwr: SpectralStats  # spectrum of ΔW_r (0-d batch)
    dwr_rel_norm: float
    bias_spread: float | None  # max − min of the router bias at b, if any
    bias_spread_base: float | None
    dwr_singular_values: torch.Tensor | None = None  # σ(ΔW_r), float64, largest first
    bias_std: float | None = None  # population std of the router bias at b, if any
    bias_std_base: float | None = None


def router_epsilon(weight: torch.Tensor) -> float:
    """ε = max_e ‖w_e − w̄‖ / ‖w̄‖; small ε means the rows are nearly equal."""
    w = weight.to(_F64)
    mean = w.mean(0)
    mean_norm = float(mean.norm())
    if mean_norm == 0.0:
        return float("inf")
    return float((w - mean).norm(dim=1).max()) / mean_norm


def mean_pairwise_cosine(weight: torch.Tensor) -> float:
    """Exact mean cosine similarity over all pairs i ≠ j of rows.

    With u_e = w_e/‖w_e‖ and ū = mean u_e the mean over the E(E−1) ordered
    pairs is (E‖ū‖² − 1)/(E − 1). O(E·d), no E × E matrix. A zero row has no
    direction and counts as orthogonal to every other row.
    """
    w = weight.to(_F64)
    num_experts = w.shape[0]
    if num_experts < 2:
        raise ValueError("cosine similarity needs at least two router rows")
    norms = w.norm(dim=1, keepdim=True)
    nonzero = norms > 0
    units = torch.where(nonzero, w / torch.where(nonzero, norms, torch.ones_like(norms)), torch.zeros_like(w))
    # Σ_{i≠j} u_i·u_j = ‖Σu‖² − Σ‖u_i‖², and ‖u_i‖² is 1 for every non-zero row.
    pair_sum = units.sum(0).square().sum() - nonzero.sum()
    return float(pair_sum / (num_experts * (num_experts - 1)))


def router_metrics(
    weight_a: torch.Tensor,
    weight_b: torch.Tensor,
    bias_a: torch.Tensor | None = None,
    bias_b: torch.Tensor | None = None,
) -> RouterMetrics:
    """State metrics at both checkpoints and the spectrum of ΔW_r (float64)."""
    w_a, w_b = weight_a.to(_F64), weight_b.to(_F64)
    delta = w_b - w_a  # exact for stored float32/bf16: float64 holds their difference
    rows, cols = delta.shape
    if bool(torch.isfinite(delta).all()):
        # σ(ΔW_r) from the E×E Gram: E ≤ a few hundred, so this is tiny. Its
        # float64 eigenvalues carry ~1e-16·σ_max² absolute error: every
        # σ ≥ 1e-3·σ_max is exact to ~1e-10 relative.
        gram = delta @ delta.T
        sv = gram_singular_values(gram, min(rows, cols))
    else:
        sv = torch.full((min(rows, cols),), float("nan"), dtype=_F64)
    base_norm = float(w_a.norm())
    return RouterMetrics(
        epsilon=router_epsilon(w_b),
        epsilon_base=router_epsilon(w_a),
        cosine_similarity=mean_pairwise_cosine(w_b),
        cosine_similarity_base=mean_pairwise_cosine(w_a),
        dwr=spectral_stats(sv),
        dwr_rel_norm=float(delta.norm()) / base_norm if base_norm > 0 else float("inf"),
        bias_spread=_spread(bias_b),
        bias_spread_base=_spread(bias_a),
        dwr_singular_values=sv,
        bias_std=_std(bias_b),
        bias_std_base=_std(bias_a),
    )


def _spread(bias: torch.Tensor | None) -> float | None:
    if bias is None:
        return None
    b = bias.to(_F64)
    return float(b.max() - b.min())


def _std(bias: torch.Tensor | None) -> float | None:
    if bias is None:
        return None
    return float(bias.to(_F64).std(correction=0))
