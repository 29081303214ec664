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


def spectral_stats(singular_values: torch.Tensor, rank: int | torch.Tensor | None = None) -> SpectralStats:
    """Statistics over the last dimension of `singular_values` (any order).

    `rank` is n in the normalisation H / ln n: the number of singular values
    the operator can have (2r for Δ2 when d ≥ 2r). It defaults to the length
    of the last dimension; a tensor gives each spectrum its own (a batch of
    spectra of several lengths, padded with zeros, which carry no energy).
    With n = 1 the normalised entropy is defined as 1 (a single direction is
    the only possible spectrum).
    """
    sv = singular_values.to(torch.float64).clamp_min(0.0)
    n = sv.shape[-1] if rank is None else rank
    # Work with σ/σ_max: p, the entropy and the stable rank are scale-free, and
    # squaring σ itself would underflow/overflow for extreme scales (σ ~ 1e-170
    # would otherwise read as "unchanged").
    top = sv.amax(-1) if sv.shape[-1] else sv.new_zeros(sv.shape[:-1])
    unchanged = top <= 0
    energy = (sv / top.masked_fill(unchanged, 1.0).unsqueeze(-1)).square()
    total = energy.sum(-1)  # Σσ²/σ_max² ≥ 1 unless unchanged
    p = energy / total.masked_fill(unchanged, 1.0).unsqueeze(-1)
    # 0 ln 0 = 0: xlogy gives exactly that.
    entropy = torch.special.xlogy(p, p).sum(-1).neg().masked_fill(unchanged, 0.0)
    if isinstance(n, torch.Tensor):
        single = n <= 1
        normalized = (entropy / n.to(entropy.dtype).log().masked_fill(single, 1.0)).masked_fill(single, 1.0)
    else:
        normalized = entropy / math.log(n) if n > 1 else torch.ones_like(entropy)
    return SpectralStats(
        entropy=entropy,
        normalized_entropy=normalized.masked_fill(unchanged, 0.0),
        effective_rank=entropy.exp().masked_fill(unchanged, 0.0),
        stable_rank=total.masked_fill(unchanged, 0.0),
        frobenius_norm=top * total.sqrt(),
        spectral_norm=top,
        unchanged=unchanged,
    )


def gram_singular_values(gram: torch.Tensor, rank: int | None = None) -> torch.Tensor:
    """The top `rank` (default all) singular values of A, largest first, from
    a symmetric Gram G = AAᵀ (or any core with the same eigenvalues σ²):
    √λ of its eigenvalues, a rounding-negative λ read as 0."""
    evals = torch.linalg.eigvalsh(gram)  # ascending
    return evals.flip(-1)[..., :rank].clamp_min(0).sqrt()


def eigvalsh_two_sizes(wide: torch.Tensor, narrow: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenvalues (ascending) of symmetric matrices of two sizes, wide [N, 2k, 2k]
    and narrow [..., M, k, k], in ONE batched solver call: a GPU-shaped layer
    solves every small eigenproblem at once instead of one call per kind.

    Two narrow matrices X, Y share one 2k × 2k matrix diag(X̂, −Ŷ − I), each
    scaled by its trace (X̂ = X / tr X; any symmetric X with tr X > 0, here
    positive semi-definite Grams): X̂'s eigenvalues lie in [−ε, 1 + ε] and
    −Ŷ − I's in [−2 − ε, −1 + ε], so the upper k belong to X and the lower k
    to Y. The solver's absolute error, u·‖diag‖ ≤ 2u, is at most 2u·k relative
    to each matrix's largest eigenvalue (≥ tr / k): ~1e-13 in float64.
    Matrices are paired within their group (the leading dimensions of
    `narrow`, a layer's), so a group's values do not depend on what else is
    in the batch: a layer solved alone or with others gives the same bits.
    """
    k = narrow.shape[-1]
    if wide.shape[-1] != 2 * k:
        raise ValueError(f"wide matrices of size {wide.shape[-1]} cannot share a call with narrow ones of size {k}")
    groups = narrow.shape[:-3]
    narrow = narrow.reshape(-1, *narrow.shape[-3:])  # [groups, M, k, k]
    count = narrow.shape[1]
    traces = narrow.diagonal(dim1=-2, dim2=-1).sum(-1)
    safe = traces.masked_fill(traces <= 0, 1.0)
    half = (count + 1) // 2
    # diag(X̂, −Ŷ − I): each group's first half over its second (a zero matrix for an odd count).
    packed = narrow.new_zeros(narrow.shape[0], half, 2 * k, 2 * k)
    packed[:, :, :k, :k] = narrow[:, :half] / safe[:, :half, None, None]
    torch.div(narrow[:, half:], -safe[:, half:, None, None], out=packed[:, :count - half, k:, k:])
    packed[..., k:, k:].diagonal(dim1=-2, dim2=-1).sub_(1.0)
    stacked = torch.cat([wide, packed.flatten(0, 1)])
    del packed  # the solver copies its input: one copy of the matrices live, not two
    values = torch.linalg.eigvalsh(stacked)
    del stacked
    wide_values = values[:wide.shape[0]]
    packed_values = values[wide.shape[0]:].unflatten(0, (narrow.shape[0], half))
    narrow_values = torch.cat([packed_values[..., k:], packed_values[..., :k].flip(-1).neg_().sub_(1.0)], 1)
    return wide_values, (narrow_values[:, :count] * safe[..., None]).reshape(*groups, count, k)
