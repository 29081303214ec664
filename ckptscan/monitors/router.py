"""MoE router monitors from the router weight W_r ∈ R^{E×d} (rows w_e).

When routing collapses, router rows become alike: the conditioning ratio ε
falls and the rows' cosine similarity rises. Both are state metrics of one
checkpoint; the update ΔW_r gets the same spectral statistics as attention.
"""

from __future__ import annotations

import math
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
    return float(_epsilon(weight.to(_F64)))


def _epsilon(w: torch.Tensor) -> torch.Tensor:
    """`router_epsilon` as a 0-d tensor on w's device (inf when the mean row is zero)."""
    mean = w.mean(0)
    mean_norm = mean.norm()
    spread = (w - mean).norm(dim=1).max()
    return torch.where(mean_norm == 0, torch.inf, spread / mean_norm.masked_fill(mean_norm == 0, 1.0))


def mean_pairwise_cosine(weight: torch.Tensor) -> float:
    """Exact mean cosine similarity over all pairs i ≠ j of rows.

    With u_e = w_e/‖w_e‖ and ū = mean u_e the mean over the E(E−1) ordered
    pairs is (E‖ū‖² − 1)/(E − 1). O(E·d), no E × E matrix. A zero row has no
    direction and counts as orthogonal to every other row.
    """
    if weight.shape[0] < 2:
        raise ValueError("cosine similarity needs at least two router rows")
    return float(_mean_cosine(weight.to(_F64)))


def _mean_cosine(w: torch.Tensor) -> torch.Tensor:
    """`mean_pairwise_cosine` as a 0-d tensor on w's device."""
    num_experts = w.shape[0]
    norms = w.norm(dim=1, keepdim=True)
    nonzero = norms > 0
    units = torch.where(nonzero, w / norms.masked_fill(~nonzero, 1.0), 0.0)
    # Σ_{i≠j} u_i·u_j = ‖Σu‖² − Σ‖u_i‖², and ‖u_i‖² is 1 for every non-zero row.
    pair_sum = units.sum(0).square().sum() - nonzero.sum()
    return pair_sum / (num_experts * (num_experts - 1))


def router_metrics(
    weight_a: torch.Tensor,
    weight_b: torch.Tensor,
    bias_a: torch.Tensor | None = None,
    bias_b: torch.Tensor | None = None,
) -> RouterMetrics:
    """State metrics at both checkpoints and the spectrum of ΔW_r (float64).

    The O(E·d) work stays on the weights' device; what comes back is the
    scalars and the E × E Gram, in one transfer (one host sync on a GPU),
    and the Gram's eigenproblem is solved on the host."""
    w_a, w_b = weight_a.to(_F64), weight_b.to(_F64)
    if w_b.shape[0] < 2:
        raise ValueError("cosine similarity needs at least two router rows")
    delta = w_b - w_a  # exact for stored float32/bf16: float64 holds their difference
    rows, cols = delta.shape
    # σ(ΔW_r) from the E×E Gram: E ≤ a few hundred, so this is tiny. Its
    # float64 eigenvalues carry ~1e-16·σ_max² absolute error: every
    # σ ≥ 1e-3·σ_max is exact to ~1e-10 relative. A non-finite ΔW_r shows on
    # the Gram's diagonal (finite diagonals bound every other entry).
    gram = delta @ delta.T
    biases = [x.to(device=w_b.device, dtype=_F64) for x in (bias_b, bias_a) if x is not None]
    spreads = [torch.stack([x.max() - x.min(), x.std(correction=0)]) for x in biases]
    scalars = torch.stack([_epsilon(w_b), _epsilon(w_a), _mean_cosine(w_b), _mean_cosine(w_a), w_a.norm(),
                           delta.norm()])
    host = torch.cat([scalars, *spreads, gram.flatten()]).cpu()  # the one transfer
    values = host[:6 + 2 * len(spreads)].tolist()
    eps_b, eps_a, cos_b, cos_a, base_norm, delta_norm = values[:6]
    host_gram = host[6 + 2 * len(spreads):].reshape(rows, rows)
    if math.isfinite(float(host_gram.diagonal().sum())):
        sv = gram_singular_values(host_gram, min(rows, cols))
    else:
        sv = torch.full((min(rows, cols),), float("nan"), dtype=_F64)
    bias_b_stats = values[6:8] if bias_b is not None else [None, None]
    bias_a_stats = values[6 + 2 * (bias_b is not None):][:2] if bias_a is not None else [None, None]
    return RouterMetrics(
        epsilon=eps_b,
        epsilon_base=eps_a,
        cosine_similarity=cos_b,
        cosine_similarity_base=cos_a,
        dwr=spectral_stats(sv),
        dwr_rel_norm=delta_norm / base_norm if base_norm > 0 else float("inf"),
        bias_spread=bias_b_stats[0],
        bias_spread_base=bias_a_stats[0],
        dwr_singular_values=sv,
        bias_std=bias_b_stats[1],
        bias_std_base=bias_a_stats[1],
    )
