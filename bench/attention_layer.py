"""Benchmark: QK monitors of one Llama-7B-shaped layer, cores vs dense SVD.

One layer with hidden size d = 4096, H = G = 32 heads, head_dim r = 128,
random weights N(0, 0.02²) stored in float32 and a random update of ≈1e-3
relative size. `qk_spectra` (every QK spectrum of the layer: Δ1, Δ2, Δ3, ΔW_q,
ΔW_k per head) is timed on the default float32 path and on the float64 path,
median of a few repetitions, against a dense float64 SVD of the explicit
4096 × 4096 Δ2 = ΔQᵀK + QᵀΔK of one or two heads, extrapolated × 32. Both run
side by side in this process, so machine load affects both; the ratio is what
matters. The singular values of the densely computed heads are compared with
both paths.

    .venv/bin/python bench/attention_layer.py [--dense-heads 1|2] [--reps 3]

Runs in about 1–3 minutes on a 2-core machine (the dense SVD dominates).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ckptscan.monitors.attention import qk_spectra  # noqa: E402

HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 4096, 32, 32, 128
INIT_STD, REL_UPDATE = 0.02, 1e-3


def make_layer(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q_a = torch.randn(HEADS, HEAD_DIM, HIDDEN, generator=gen) * INIT_STD
    k_a = torch.randn(KV_HEADS, HEAD_DIM, HIDDEN, generator=gen) * INIT_STD
    q_b = q_a + torch.randn(q_a.shape, generator=gen) * (INIT_STD * REL_UPDATE)
    k_b = k_a + torch.randn(k_a.shape, generator=gen) * (INIT_STD * REL_UPDATE)
    return q_a, k_a, q_b, k_b


def timed(fn, reps: int):
    times, out = [], None
    for _ in range(reps):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times, out


def dense_delta2_sv(q_a, k_a, q_b, k_b, head: int) -> torch.Tensor:
    """σ(Δ2) of one head from the explicit d × d matrix, float64."""
    g = head // (HEADS // KV_HEADS)
    qa, ka = q_a[head].double(), k_a[g].double()
    dq, dk = q_b[head].double() - qa, k_b[g].double() - ka
    delta2 = dq.T @ ka + qa.T @ dk  # 4096 × 4096
    return torch.linalg.svdvals(delta2)


def compare(core: torch.Tensor, dense: torch.Tensor) -> tuple[float, float, float]:
    """(max |Δσ|/σ_max, max |Δσ|/σ over σ ≥ 1e-3 σ_max, max |Δσ²|/σ_max²)."""
    n = core.shape[-1]
    ref = dense[:n]
    top = ref[0]
    diff = (core - ref).abs()
    big = ref >= 1e-3 * top
    rel_top = float(diff.max() / top)
    rel_each = float((diff[big] / ref[big]).max())
    rel_sq = float((core.square() - ref.square()).abs().max() / top.square())
    return rel_top, rel_each, rel_sq


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dense-heads", type=int, default=1, choices=(1, 2))
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"layer: d={HIDDEN}, H={HEADS}, G={KV_HEADS}, r={HEAD_DIM}; "
          f"weights N(0, {INIT_STD}²) float32, update ≈{REL_UPDATE:g} relative")
    q_a, k_a, q_b, k_b = make_layer()
    rel = float((q_b.double() - q_a.double()).norm() / q_a.double().norm())

    qk_spectra(q_a[:2], k_a[:2], q_b[:2], k_b[:2])  # warm-up (thread pools, allocator)
    t32, runs32, s32 = timed(lambda: qk_spectra(q_a, k_a, q_b, k_b), args.reps)
    t64, runs64, s64 = timed(lambda: qk_spectra(q_a, k_a, q_b, k_b, compute_dtype=torch.float64), args.reps)

    dense_times, dense_sv = [], []
    for head in range(args.dense_heads):
        start = time.perf_counter()
        dense_sv.append(dense_delta2_sv(q_a, k_a, q_b, k_b, head))
        dense_times.append(time.perf_counter() - start)
    t_dense_head = statistics.mean(dense_times)
    t_dense_layer = t_dense_head * HEADS

    print(f"measured ‖ΔW_q‖/‖W_q‖ = {rel:.2e} (qk_spectra reports {s32.dwq_rel_norm:.2e})")
    print()
    print(f"{'method':<44}{'time':>12}{'per layer':>12}{'speed-up':>10}")
    print(f"{'dense float64 SVD of Δ2 (4096², per head)':<44}{t_dense_head:>11.2f}s"
          f"{t_dense_layer:>11.1f}s{'1×':>10}")
    for name, t, runs in (("qk_spectra float32 (default), whole layer", t32, runs32),
                          ("qk_spectra float64, whole layer", t64, runs64)):
        print(f"{name:<44}{t:>11.3f}s{t:>11.3f}s{t_dense_layer / t:>9.0f}×")
    print(f"  (float32 runs: {', '.join(f'{x:.2f}' for x in runs32)} s; "
          f"float64 runs: {', '.join(f'{x:.2f}' for x in runs64)} s; "
          f"dense: {', '.join(f'{x:.1f}' for x in dense_times)} s; "
          f"dense extrapolated ×{HEADS})")
    print()
    print(f"ratio dense/cores (float32 path): {t_dense_layer / t32:.0f}×   "
          f"(float64 path): {t_dense_layer / t64:.0f}×   target ≥ 500×")
    print()
    print("accuracy of σ(Δ2) vs dense SVD (heads computed densely):")
    print(f"{'head':<6}{'path':<9}{'max|Δσ|/σ_max':>16}{'max|Δσ|/σ (σ≥1e-3σ_max)':>27}{'max|Δσ²|/σ_max²':>18}")
    for head, ref in enumerate(dense_sv):
        for name, s in (("float32", s32), ("float64", s64)):
            a, b, c = compare(s.delta2[head], ref)
            print(f"{head:<6}{name:<9}{a:>16.2e}{b:>27.2e}{c:>18.2e}")


if __name__ == "__main__":
    main()
