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

Cost: one pass over row blocks, O(V·d). Each checkpoint's head is read once
and each row block upcast to float64 once, into two block buffers reused
from block to block (older and newer: a 128k × 8k bfloat16 head is never
upcast whole); the sums stay on the head's device and come back in one read
at the end (on a GPU every read is a host sync). The update's spectrum needs the d × d Gram ΔWᵀΔW, V·d²
multiply-adds (134 G for a 32k × 2k head, 8.6 T for 128k × 8k): it is
computed only when asked for (`spectrum=True`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ckptscan.monitors.spectral import gram_singular_values, spectral_stats

_F64 = torch.float64
# Elements of a row block upcast to float64 at a time (two live: older and newer). On a CPU a block that
# stays in cache: the pass makes ~10 sweeps over each block, and at 32 MiB blocks they all go to memory
# (a 32k × 2k head on one core: 0.7 s in 1 MiB blocks, 1.4 s in 32 MiB ones). On a GPU each sweep is a
# kernel launch, so fewer, larger blocks (4 at that shape, 256 MiB of device memory).
BLOCK_ELEMENTS = 1 << 24
CPU_BLOCK_ELEMENTS = 1 << 17
ROW_BLOCK = 8192  # the most rows in one block, however narrow the head


def block_rows(width: int, device: torch.device | str = "cpu") -> int:
    """Rows a block of a head of that width holds on that device."""
    elements = CPU_BLOCK_ELEMENTS if torch.device(device).type == "cpu" else BLOCK_ELEMENTS
    return max(1, min(ROW_BLOCK, elements // max(width, 1)))


@dataclass(frozen=True)
class HeadStats:
    """One checkpoint's head with its gain: the sums the logit scales come from."""

    rows: int
    row_energy: float  # Σ_v ‖D_γ w_v‖²
    max_row: float  # max_v ‖D_γ w_v‖
    row_sum: torch.Tensor  # Σ_v D_γ w_v [d], float64, on the head's device
    row_sum_norm: float  # ‖Σ_v D_γ w_v‖, read with the others


def logit_rms(stats: HeadStats) -> float:
    """‖W D_γ‖_F / √V: the RMS over the vocabulary of the logits' standard
    deviation for isotropic unit-RMS inputs."""
    return math.sqrt(stats.row_energy / stats.rows)


def shift_scale(stats: HeadStats) -> float:
    """‖D_γ w̄‖: the standard deviation, for isotropic unit-RMS inputs, of the
    shift every logit (and log Z) takes together."""
    return stats.row_sum_norm / stats.rows


def mean_row_share(stats: HeadStats) -> float | None:
    """‖D_γ w̄‖ / RMS_v ‖D_γ w_v‖ in [0, 1] (Jensen): 1 when every row is the
    same (every logit moves together), about 1/√V for independent rows."""
    rms = logit_rms(stats)
    return shift_scale(stats) / rms if rms > 0 else None


@dataclass(frozen=True)
class HeadUpdate:
    """The update ΔW = W_b − W_a of the head (gain not applied: the head's own update)."""

    # Spectral entropy of ΔW / ln min(V, d); None when unchanged, or not asked for (O(V·d²)).
    entropy_norm: float | None
    relative_norm: float | None  # ‖ΔW‖_F / ‖W_a‖_F
    mean_coherence: float | None  # ‖Σ_v Δw_v‖ / ‖ΔW‖_F in [0, √V]


@dataclass(frozen=True)
class HeadPair:
    """A pair of heads in one pass: the newer one's scales and the update.
    finite is False when a value of either head or of the gain is not finite
    (their float64 sums are not); the numbers are then meaningless."""

    stats: HeadStats
    update: HeadUpdate
    finite: bool


def _check(weight: torch.Tensor, gain: torch.Tensor | None, older: torch.Tensor | None) -> None:
    if weight.ndim != 2 or weight.shape[0] < 1:
        raise ValueError(f"expected a head [V, d], got shape {tuple(weight.shape)}")
    if gain is not None and tuple(gain.shape) != (weight.shape[1],):
        raise ValueError(f"gain of shape {tuple(gain.shape)} for a head of width {weight.shape[1]}")
    if older is not None and older.shape != weight.shape:
        raise ValueError(f"head shapes {tuple(older.shape)} and {tuple(weight.shape)} do not match")


def _flat_dot(x: torch.Tensor, out: torch.Tensor) -> None:
    """‖x‖_F² into out, without a squared copy of the block."""
    flat = x.reshape(-1)
    torch.dot(flat, flat, out=out)


def head_pair(older: torch.Tensor | None, newer: torch.Tensor, gain: torch.Tensor | None = None,
              block: int | None = None, spectrum: bool = False) -> HeadPair:
    """The newer head's sums with its gain, and the update from the older
    (None: no update, its fields None), in one pass over row blocks.

    ΔW is taken from the float64 upcasts of both stored blocks, so it is the
    exact difference of the stored values (float64 holds every bfloat16,
    float16 and float32 value), rounded once. spectrum=True also forms the
    d × d Gram ΔWᵀΔW in float64 (never V × V) for the update's spectral
    entropy: V·d² multiply-adds, which is why it is off by default.

    mean_coherence: for rows updated independently ‖Σ_v Δw_v‖ ≈ ‖ΔW‖_F, so the
    ratio is about 1; plain gradient descent on cross-entropy gives 0 (the
    mean row gets no gradient); √V when every row takes the same step."""
    _check(newer, gain, older)
    vocab, width = newer.shape
    device = newer.device
    step = block or block_rows(width, device)
    scale = None if gain is None else gain.to(device=device, dtype=_F64)
    starts = range(0, vocab, step)
    row_norms = torch.empty(vocab, dtype=_F64, device=device)  # ‖D_γ w_v‖, 8 bytes a row
    row_sum = torch.zeros(width, dtype=_F64, device=device)
    ones = torch.ones(step, dtype=_F64, device=device)  # column sums as matrix-vector products: one op a block
    # Per block: ‖W_a‖_F² and ‖ΔW‖_F² of its rows, summed at the end.
    parts = torch.zeros(2, len(starts), dtype=_F64, device=device)
    delta_sum = torch.zeros(width, dtype=_F64, device=device)
    gram = torch.zeros(width, width, dtype=_F64, device=device) if spectrum and older is not None else None
    # Two float64 blocks, filled in place block after block: a fresh upcast of a large block maps and faults
    # in new pages each time (a 32 MiB one: 5x slower on a CPU than copying into the same memory).
    into_b = torch.empty(step, width, dtype=_F64, device=device)
    into_a = torch.empty_like(into_b) if older is not None else into_b
    for k, lo in enumerate(starts):
        n = min(step, vocab - lo)
        b = into_b[:n].copy_(newer[lo:lo + n])
        if older is not None:
            a = into_a[:n].copy_(older[lo:lo + n])
            _flat_dot(a, parts[0, k])
            delta = torch.sub(b, a, out=a)  # W_a's block is not needed again: ΔW's takes its place
            delta_sum.addmv_(delta.T, ones[:n])
            _flat_dot(delta, parts[1, k])
            if gram is not None:
                gram.addmm_(delta.T, delta)
        if scale is not None:
            b.mul_(scale)
        row_sum.addmv_(b.T, ones[:n])
        torch.linalg.vector_norm(b, dim=1, out=row_norms[lo:lo + n])
    totals = parts.sum(1)
    read = torch.stack([
        torch.dot(row_norms, row_norms), row_norms.max(), torch.linalg.vector_norm(row_sum),
        totals[0], totals[1], torch.linalg.vector_norm(delta_sum),
    ]).tolist()  # the one read: a host sync on a GPU
    energy, peak, shift, base, change, coherent = read
    finite = all(math.isfinite(x) for x in read)
    stats = HeadStats(vocab, energy, peak, row_sum, shift)
    if older is None:
        return HeadPair(stats, HeadUpdate(None, None, None), finite)
    if not change > 0:
        return HeadPair(stats, HeadUpdate(None, 0.0 if base > 0 else None, None), finite)
    entropy = None
    if gram is not None and finite:
        entropy = float(spectral_stats(gram_singular_values(gram), rank=min(vocab, width)).normalized_entropy)
    norm = math.sqrt(change)
    return HeadPair(stats, HeadUpdate(entropy, norm / math.sqrt(base) if base > 0 else None, coherent / norm), finite)


def head_stats(weight: torch.Tensor, gain: torch.Tensor | None = None, block: int | None = None) -> HeadStats:
    """The row sums of D_γ W (W [V, d]; γ [d] or None for no gain)."""
    return head_pair(None, weight, gain, block).stats


def head_update(older: torch.Tensor, newer: torch.Tensor, block: int | None = None,
                spectrum: bool = False) -> HeadUpdate:
    """The update ΔW = newer − older: its relative norm and mean-row
    coherence, and with spectrum=True its spectral entropy (head_pair)."""
    return head_pair(older, newer, None, block, spectrum).update
