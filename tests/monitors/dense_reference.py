"""Brute-force references for the monitor tests: dense float64 numpy, written
out from the definitions of monitors.md without using any ckptscan code."""

from __future__ import annotations

import math

import numpy as np
import torch


def spectrum_stats(singular_values, n: int) -> dict:
    """monitors.md "Spectral statistics" for one spectrum, n = normaliser."""
    s = np.sort(np.asarray(singular_values, dtype=np.float64))[::-1]
    energy = s**2
    total = energy.sum()
    if total == 0:
        return {"unchanged": True}
    p = energy / total
    entropy = -sum(pi * math.log(pi) for pi in p if pi > 0)
    return {
        "unchanged": False,
        "entropy": entropy,
        "normalized_entropy": entropy / math.log(n) if n > 1 else 1.0,
        "effective_rank": math.exp(entropy),
        "stable_rank": total / s[0] ** 2,
        "frobenius_norm": math.sqrt(total),
        "spectral_norm": s[0],
    }


def svdvals(m) -> np.ndarray:
    """Singular values of a dense matrix in float64, largest first (LAPACK)."""
    return torch.linalg.svdvals(_f64(m)).numpy()


def _f64(x) -> torch.Tensor:
    return x.to(torch.float64) if isinstance(x, torch.Tensor) else torch.from_numpy(np.asarray(x, dtype=np.float64))


def dense_qk(q_a, k_a, q_b, k_b) -> dict:
    """Every QK quantity from explicit d × d matrices, head by head.

    Inputs are [H, r, d] / [G, r, d] arrays of the *stored* values; the GQA
    pairing is written out here as g = h // (H / G) with a plain loop. The
    products run in float64 torch (not numpy) only so that one BLAS thread
    pool serves the whole test: two competing pools crawl on a 2-core box.
    """
    q_a, k_a, q_b, k_b = (_f64(x) for x in (q_a, k_a, q_b, k_b))
    num_heads, r, d = q_a.shape
    num_kv = k_a.shape[0]
    group = num_heads // num_kv
    out = {key: [] for key in ("delta1", "delta2", "delta3", "dwq", "q_norm_b", "q_norm_a", "logit_bound")}
    for h in range(num_heads):
        g = h // group
        qa, ka, qb, kb = q_a[h], k_a[g], q_b[h], k_b[g]
        dq, dk = qb - qa, kb - ka
        out["delta1"].append(svdvals(qb.T @ kb - qa.T @ ka))  # explicit Δ1, d × d
        out["delta2"].append(svdvals(dq.T @ ka + qa.T @ dk))
        out["delta3"].append(svdvals(dq.T @ dk))
        out["dwq"].append(svdvals(dq))
        out["q_norm_b"].append(svdvals(qb)[0])
        out["q_norm_a"].append(svdvals(qa)[0])
        out["logit_bound"].append(svdvals(qb.T @ kb)[0])
    out = {key: np.array(value) for key, value in out.items()}
    out["dwk"] = np.array([svdvals(k_b[g] - k_a[g]) for g in range(num_kv)])
    out["dwq_rel_norm"] = float(torch.linalg.norm(q_b - q_a) / torch.linalg.norm(q_a))
    out["dwk_rel_norm"] = float(torch.linalg.norm(k_b - k_a) / torch.linalg.norm(k_a))
    out["n2"] = min(2 * r, d)  # normaliser of Δ1, Δ2
    out["n1"] = min(r, d)  # normaliser of Δ3, ΔW
    return out
