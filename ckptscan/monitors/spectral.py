"""Spectral statistics of a batch of spectra: one definition used everywhere.

For singular values σ_1 ≥ … ≥ σ_n ≥ 0 the energy distribution is
p_i = σ_i² / Σσ² (the paper's α = 2). Every statistic below is scale-free
except the Frobenius norm, so entropies of layers with very different update
sizes are directly comparable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class SpectralStats:
    """Statistics of a batch of spectra; every field has the batch shape.

    `unchanged` marks spectra with no energy at all (identical weights). Their
    entropy-type fields are 0 and must not be read as a collapse: reports turn
    them into null plus an "unchanged" finding.
    """

    entropy: torch.Tensor
    normalized_entropy: torch.Tensor
    effective_rank: torch.Tensor
    stable_rank: torch.Tensor
    frobenius_norm: torch.Tensor
    spectral_norm: torch.Tensor
    unchanged: torch.Tensor


def spectral_stats(singular_values: torch.Tensor, rank: int | None = None) -> SpectralStats:
    """Statistics over the last dimension of `singular_values` (any order).

    `rank` is n in the normalisation H / ln n: the number of singular values
    the operator can have (2r for Δ2 when d ≥ 2r). It defaults to the length
    of the last dimension. With n = 1 the normalised entropy is defined as 1
    (a single direction is the only possible spectrum).
    """
    sv = singular_values.to(torch.float64).clamp_min(0.0)
    n = sv.shape[-1] if rank is None else rank
    energy = sv.square()
    total = energy.sum(-1)
    unchanged = total <= 0
    safe_total = torch.where(unchanged, torch.ones_like(total), total)
    p = energy / safe_total.unsqueeze(-1)
    # 0 ln 0 = 0: xlogy gives exactly that.
    entropy = -torch.special.xlogy(p, p).sum(-1)
    entropy = torch.where(unchanged, torch.zeros_like(entropy), entropy)
    normalized = entropy / math.log(n) if n > 1 else torch.ones_like(entropy)
    normalized = torch.where(unchanged, torch.zeros_like(normalized), normalized)
    spectral_norm = sv.amax(-1) if sv.shape[-1] else torch.zeros_like(total)
    safe_top = torch.where(unchanged, torch.ones_like(spectral_norm), spectral_norm)
    stable_rank = torch.where(unchanged, torch.zeros_like(total), total / safe_top.square())
    return SpectralStats(
        entropy=entropy,
        normalized_entropy=normalized,
        effective_rank=torch.where(unchanged, torch.zeros_like(entropy), entropy.exp()),
        stable_rank=stable_rank,
        frobenius_norm=total.sqrt(),
        spectral_norm=spectral_norm,
        unchanged=unchanged,
    )
