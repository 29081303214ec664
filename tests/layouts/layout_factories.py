"""Ground truth for layout tests, built without ckptscan.

A test draws the per-head blocks first (`head_pair`), fuses/transposes them
into a family's on-disk layout with its own code, writes the checkpoints, runs
the scan, and compares with dense float64 spectra of the per-head blocks it
started from (`reference`, `assert_heads_match`). So a resolver that splits
heads wrongly cannot agree with the reference by construction.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from factories import random_weights

import ckptscan
from ckptscan.scan import ScanOptions

F64 = torch.float64


def exact(shape: tuple[int, ...], seed: int, dtype: torch.dtype, scale: float = 0.05) -> torch.Tensor:
    """Random float64 values that the storage dtype holds exactly."""
    return random_weights(shape, seed, scale).to(dtype).to(F64)


def nudged(x: torch.Tensor, seed: int, dtype: torch.dtype, scale: float = 0.01) -> torch.Tensor:
    """x plus a random update, rounded to the storage dtype (so it is exact there)."""
    return (x + random_weights(tuple(x.shape), seed, scale)).to(dtype).to(F64)


@dataclass
class HeadPair:
    """Per-head query/key blocks of checkpoints a and b: q [H, d, D], k [G, d, D]."""

    q_a: torch.Tensor
    k_a: torch.Tensor
    q_b: torch.Tensor
    k_b: torch.Tensor


def head_pair(heads: int, kv_heads: int, head_dim: int, hidden: int, seed: int, dtype: torch.dtype) -> HeadPair:
    q_a = exact((heads, head_dim, hidden), seed, dtype)
    k_a = exact((kv_heads, head_dim, hidden), seed + 1, dtype)
    return HeadPair(q_a, k_a, nudged(q_a, seed + 2, dtype), nudged(k_a, seed + 3, dtype))


def entropy(singular_values: np.ndarray) -> float:
    p = singular_values**2 / np.sum(singular_values**2)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def reference(q_a, k_a, q_b, k_b) -> dict[str, list[float]]:
    """Per query head: entropies of Δ1, Δ2, Δ3 (dense d×d SVDs) and of ΔQ_h,
    ΔK_g, from head blocks (any array-likes of shape [H, r, D] / [G, r, D])."""
    q_a, k_a, q_b, k_b = (np.asarray(x, dtype=np.float64) for x in (q_a, k_a, q_b, k_b))
    heads, kv_heads = q_a.shape[0], k_a.shape[0]
    out: dict[str, list[float]] = {name: [] for name in ("delta1", "delta2", "delta3", "dwq", "dwk")}
    for h in range(heads):
        g = h // (heads // kv_heads)
        dq, dk = q_b[h] - q_a[h], k_b[g] - k_a[g]
        spectra = {
            "delta1": q_b[h].T @ k_b[g] - q_a[h].T @ k_a[g],
            "delta2": dq.T @ k_a[g] + q_a[h].T @ dk,
            "delta3": dq.T @ dk,
            "dwq": dq,
            "dwk": dk,
        }
        for name, matrix in spectra.items():
            out[name].append(entropy(np.linalg.svd(matrix, compute_uv=False)))
    return out


def scan(path_a, path_b, **options) -> ckptscan.ScanReport:
    """The scan on the exact path, so agreement can be asserted tightly."""
    return ckptscan.scan_pair(path_a, path_b, ScanOptions(compute_dtype=F64, **options))


def assert_heads_match(layer_result, expected: dict[str, list[float]], rel: float = 1e-7) -> None:
    heads = layer_result.attention.heads
    assert len(heads) == len(expected["delta2"])
    for h, head in enumerate(heads):
        got = {"delta1": head.delta1_entropy, "delta2": head.delta2_entropy, "delta3": head.delta3_entropy,
               "dwq": head.dwq_entropy, "dwk": head.dwk_entropy}
        for name, value in got.items():
            assert value == pytest.approx(expected[name][h], rel=rel, abs=1e-9), (layer_result.layer, h, name)


def router_epsilon(weight) -> float:
    w = np.asarray(weight, dtype=np.float64)
    mean = w.mean(0)
    return float(np.linalg.norm(w - mean, axis=1).max() / np.linalg.norm(mean))


def assert_router_matches(layer_result, router_a, router_b, bias_b=None, rel: float = 1e-9) -> None:
    router = layer_result.router
    assert router is not None, layer_result.layer
    assert router.epsilon == pytest.approx(router_epsilon(router_b), rel=rel)
    assert router.epsilon_change == pytest.approx(router_epsilon(router_b) - router_epsilon(router_a), rel=1e-6,
                                                  abs=1e-12)
    if bias_b is not None:
        b = np.asarray(bias_b, dtype=np.float64)
        assert router.bias_spread == pytest.approx(float(b.max() - b.min()), rel=rel)


def router_pair(experts: int, hidden: int, seed: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Router weights of a and b, rows sharing a common direction (as trained routers do)."""
    common = exact((1, hidden), seed, dtype, scale=0.2)
    a = (common + exact((experts, hidden), seed + 1, dtype)).to(dtype).to(F64)
    return a, nudged(a, seed + 2, dtype)
