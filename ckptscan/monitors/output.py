"""The output family's math: the LM head W [V, d] (the token embedding when
tied) and the final norm's gain γ [d] in front of it. Pure functions, no I/O.

With h the final normed hidden state (unit RMS per coordinate) the logits
are z_v = w_vᵀ D_γ h. For isotropic inputs (E[hhᵀ] = I) logit v has standard
deviation ‖D_γ w_v‖, so the head's row norms are the output logit scale a
checkpoint allows. Softmax is shift-invariant: every row moving by one vector
c moves every logit by cᵀ D_γ h, and log Z with it; the mean row
w̄ = mean_v w_v is that common part. The cross-entropy gradient on w̄ is
mean_v (p_v − y_v) h = 0 (Σ_v p_v = Σ_v y_v = 1), so gradient descent never
moves it: only Adam's per-coordinate normalisation, weight decay and z-loss
do (Wortsman et al. 2023, §3.2; docs/monitors.md, "Output family").

Every statistic is accumulated over row blocks in float64, so a 128k × 8k
head stored in bfloat16 is never upcast whole.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator

import torch

from ckptscan.monitors.spectral import gram_singular_values, spectral_stats

_F64 = torch.float64
ROW_BLOCK = 8192  # rows upcast to float64 at a time: 8192 × 8192 × 8 B = 512 MiB at d 8192


@dataclass(frozen=True)
class HeadStats:
    """One checkpoint's head with its gain: the sums the logit scales come from."""

    rows: int
    row_energy: float  # Σ_v ‖D_γ w_v‖²
    max_row: float  # max_v ‖D_γ w_v‖
    row_sum: torch.Tensor  # Σ_v D_γ w_v [d], float64


def _blocks(weight: torch.Tensor, gain: torch.Tensor | None, block: int) -> Iterator[torch.Tensor]:
    """D_γ W a row block at a time, in float64 (one block upcast at once)."""
    scale = None if gain is None else gain.to(device=weight.device, dtype=_F64)
    for lo in range(0, weight.shape[0], block):
        rows = weight[lo:lo + block].to(_F64)
        yield rows if scale is None else rows * scale


def head_stats(weight: torch.Tensor, gain: torch.Tensor | None = None, block: int = ROW_BLOCK) -> HeadStats:
    """The row sums of D_γ W (W [V, d]; γ [d] or None for no gain)."""
    if weight.ndim != 2 or weight.shape[0] < 1:
        raise ValueError(f"expected a head [V, d], got shape {tuple(weight.shape)}")
    if gain is not None and tuple(gain.shape) != (weight.shape[1],):
        raise ValueError(f"gain of shape {tuple(gain.shape)} for a head of width {weight.shape[1]}")
    energy, peak = 0.0, 0.0
    total = torch.zeros(weight.shape[1], dtype=_F64, device=weight.device)
    for rows in _blocks(weight, gain, block):
        sq = rows.square().sum(1)
        energy += float(sq.sum())
        peak = max(peak, float(sq.max()))
        total += rows.sum(0)
    return HeadStats(weight.shape[0], energy, math.sqrt(peak), total)


def logit_rms(stats: HeadStats) -> float:
    """‖W D_γ‖_F / √V: the RMS over the vocabulary of the logits' standard
    deviation for isotropic unit-RMS inputs."""
    return math.sqrt(stats.row_energy / stats.rows)


def shift_scale(stats: HeadStats) -> float:
    """‖D_γ w̄‖: the standard deviation, for isotropic unit-RMS inputs, of the
    shift every logit (and log Z) takes together."""
    return float(torch.linalg.vector_norm(stats.row_sum)) / stats.rows


def mean_row_share(stats: HeadStats) -> float | None:
    """‖D_γ w̄‖ / RMS_v ‖D_γ w_v‖ in [0, 1] (Jensen): 1 when every row is the
    same (every logit moves together), about 1/√V for independent rows."""
    rms = logit_rms(stats)
    return shift_scale(stats) / rms if rms > 0 else None


@dataclass(frozen=True)
class HeadUpdate:
    """The update ΔW = W_b − W_a of the head (gain not applied: the head's own update)."""

    entropy_norm: float | None  # spectral entropy of ΔW / ln min(V, d); None when unchanged
    relative_norm: float | None  # ‖ΔW‖_F / ‖W_a‖_F
    mean_coherence: float | None  # ‖Σ_v Δw_v‖ / ‖ΔW‖_F in [0, √V]


def head_update(older: torch.Tensor, newer: torch.Tensor, block: int = ROW_BLOCK) -> HeadUpdate:
    """The spectrum of ΔW through its d × d Gram ΔWᵀΔW (never V × V), and how
    much of it moves every row together.

    mean_coherence: for rows updated independently ‖Σ_v Δw_v‖ ≈ ‖ΔW‖_F, so the
    ratio is about 1; plain gradient descent on cross-entropy gives 0 (the
    mean row gets no gradient); √V when every row takes the same step."""
    if older.shape != newer.shape or older.ndim != 2:
        raise ValueError(f"head shapes {tuple(older.shape)} and {tuple(newer.shape)} do not match")
    d = older.shape[1]
    gram = torch.zeros(d, d, dtype=_F64, device=older.device)
    total = torch.zeros(d, dtype=_F64, device=older.device)
    base = 0.0
    for lo in range(0, older.shape[0], block):
        a = older[lo:lo + block].to(_F64)
        delta = newer[lo:lo + block].to(_F64) - a
        gram += delta.T @ delta
        total += delta.sum(0)
        base += float(a.square().sum())
    energy = float(torch.diagonal(gram).sum())
    if energy <= 0:
        return HeadUpdate(None, 0.0 if base > 0 else None, None)
    stats = spectral_stats(gram_singular_values(gram), rank=min(older.shape))
    norm = math.sqrt(energy)
    return HeadUpdate(
        float(stats.normalized_entropy),
        norm / math.sqrt(base) if base > 0 else None,
        float(torch.linalg.vector_norm(total)) / norm,
    )
