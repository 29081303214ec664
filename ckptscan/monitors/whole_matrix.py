"""Whole-matrix update spectra, the `--full-spectrum` opt-in.

The per-head monitors never form more than a 2r × 2r core. The spectrum of a
whole projection update ΔW (H·r × d for W_q) has no such shortcut: it costs a
Gram of the smaller side, min(out, in)² entries from an O(out·in·min) product,
and a dense eigensolve of that size, O(min(out, in)³). For a 7B layer that is
a 4096² float64 eigenproblem per matrix, seconds each on a CPU, which is why
it is off by default.
"""

from __future__ import annotations

import torch

from ckptscan.monitors.spectral import gram_singular_values

_F64 = torch.float64


def whole_matrix_singular_values(delta: torch.Tensor, compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Singular values of a 2-D matrix, largest first, in float64.

    σ² = eig(Gram) with the Gram taken on the smaller side in `compute_dtype`
    (the O(d³) product) and solved in float64. As for every Gram method, a
    singular value σ is accurate to about u·σ_max²/σ absolutely (u the unit
    roundoff of `compute_dtype`), so σ² -weighted statistics (entropy,
    effective rank) are accurate to ~u relative while the tiniest singular
    values are not.
    """
    if delta.ndim != 2:
        raise ValueError(f"expected a matrix, got shape {tuple(delta.shape)}")
    m = delta.to(compute_dtype)
    gram = m @ m.T if m.shape[0] <= m.shape[1] else m.T @ m
    return gram_singular_values(gram.to(_F64))
