"""Specification of ckptscan.monitors.attention, checked against dense SVDs.

Every spectral number is compared with a brute force (dense_reference.py):
the explicit d × d matrices Δ1 = Q_bᵀK_b − Q_aᵀK_a, Δ2 = ΔQᵀK_a + Q_aᵀΔK,
Δ3 = ΔQᵀΔK of every query head, its KV head paired by a plain loop, their
float64 `np.linalg.svd`, and the statistics of monitors.md recomputed in numpy.
The brute force always works on the *stored* values (bf16-rounded ones for bf16
inputs), so the update must be differenced exactly for a test to pass.

Tolerances
----------
float64 path: per head, every σ within 1e-6·σ_max and every σ ≥ 1e-3·σ_max
within 1e-6 relative; entropies and the other statistics within 1e-6 relative.

float32 path (the default): |σ̂² − σ²| ≤ 1e-5·σ_max² per head. Reason: the
only float32 arithmetic is the Gram products (ΔQΔQᵀ, ΔQQᵀ, QQᵀ, …), each
rounded to u·|x||y| per entry (u = 6e-8, times an accumulation factor, ~1–20
measured for d ≤ 4096); everything after them is float64. A Gram method sees
σ², so that rounding lands on the eigenvalues σ² as an absolute error of order
u·σ_max², not on σ relatively; small singular values are therefore only
accurate to |σ̂ − σ| ≤ 1e-5·σ_max²/σ. The σ²-based statistics follow:
Frobenius norm and σ_max ≤ 1e-5 relative, stable rank ≤ 3e-5 relative, and
the entropy to its first-order propagation |Ĥ − H| ≤ Σ_i 2τ_p (1 + ln 1/p_i),
τ_p = 1e-5·σ_max²/Σσ², p_i floored at τ_p (`f32_entropy_tolerance`): ≈ 2e-5
relative for a flat spectrum; a direction with p_i ≈ 0 can add ≈ 2e-4 at most.
Measured errors are 10–100× smaller than these bounds.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptscan.layouts.geometry import fold_head_gains
from ckptscan.monitors.attention import (
    QKGrams,
    QKSpectra,
    kv_head_index,
    logit_scale,
    product_singular_values,
    qk_norm_logit_bound,
    qk_grams,
    qk_spectra,
)
from ckptscan.monitors.spectral import spectral_stats
from dense_reference import dense_qk, spectrum_stats, svdvals

F64_TOL = 1e-6
F32_SQ_TOL = 1e-5  # |σ̂² − σ²| ≤ F32_SQ_TOL · σ_max²

STORAGE = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}


# ---------------------------------------------------------------- fixtures ---


def make_layer(seed, num_heads, num_kv, r, d, rel=1e-3, changed="both", storage="float64", scale=1.0):
    """Random head blocks (never zero) and an update of `rel` relative size.

    Returns the stored tensors (in `storage`) and float64 numpy copies of the
    very same stored values for the brute force.
    """
    rng = np.random.default_rng(seed)
    q_a = rng.normal(size=(num_heads, r, d)) * scale
    k_a = rng.normal(size=(num_kv, r, d)) * scale
    dq = rng.normal(size=q_a.shape) * scale * rel * (changed != "k_only")
    dk = rng.normal(size=k_a.shape) * scale * rel * (changed != "q_only")
    dtype = STORAGE[storage]
    stored = [torch.tensor(x).to(dtype) for x in (q_a, k_a, q_a + dq, k_a + dk)]
    exact = [x.to(torch.float64).numpy() for x in stored]
    return stored, exact


@st.composite
def layer_cases(draw):
    num_kv = draw(st.integers(1, 3))
    group = draw(st.integers(1, 3))  # group = 1: MHA (G = H); num_kv = 1: MQA
    storage = draw(st.sampled_from(sorted(STORAGE)))
    rel = draw(st.sampled_from([1e-1, 1e-3, 1e-6]))
    if storage == "bfloat16":
        rel = max(rel, 1e-2)  # a smaller update rounds away entirely in bf16
    return dict(
        seed=draw(st.integers(0, 2**32 - 1)),
        num_heads=num_kv * group,
        num_kv=num_kv,
        r=draw(st.integers(1, 10)),
        d=draw(st.integers(2, 20)),  # includes r ≥ d and 2r > d
        rel=rel,
        changed=draw(st.sampled_from(["both", "q_only", "k_only"])),
        storage=storage,
        scale=draw(st.sampled_from([0.02, 1.0, 50.0])),
    )


# ------------------------------------------------------------- assertions ---


def assert_spectrum_f64(got, want, n):
    """Per head: |σ̂ − σ| ≤ 1e-6 σ_max; σ ≥ 1e-3 σ_max within 1e-6 relative."""
    got = got.numpy()
    assert got.shape[-1] == n
    for g, w in zip(got, want[:, :n]):
        top = w.max()
        if top == 0:
            assert np.all(g == 0), g
            continue
        assert np.max(np.abs(g - w)) <= F64_TOL * top, (g, w)
        big = w >= 1e-3 * top
        assert np.all(np.abs(g - w)[big] <= F64_TOL * w[big]), (g, w)


def assert_spectrum_f32(got, want, n):
    """Per head: |σ̂² − σ²| ≤ 1e-5 σ_max² (the Gram rounding bound)."""
    got = got.numpy()
    assert got.shape[-1] == n
    for g, w in zip(got, want[:, :n]):
        top = w.max()
        if top == 0:
            assert np.all(g == 0), g
            continue
        assert np.max(np.abs(g**2 - w**2)) <= F32_SQ_TOL * top**2, (g, w)


def f32_entropy_tolerance(singular_values) -> float:
    """First-order propagation of |δσ_i²| ≤ τ σ_max² into H = −Σ p ln p.

    |δp_i| ≤ 2τ_p with τ_p = τ σ_max²/Σσ², and ∂H/∂p_i = −(1 + ln p_i); a
    direction with p_i below τ_p carries at most ~τ_p ln(1/τ_p) of entropy.
    """
    s = np.asarray(singular_values, dtype=np.float64)
    energy = s**2
    tau_p = F32_SQ_TOL * energy.max() / energy.sum()
    p = np.maximum(energy / energy.sum(), tau_p)
    return float(np.sum(2 * tau_p * (1 + np.log(1 / p))))


def assert_stats(got_sv, want_sv, n, precise=True):
    """spectral_stats of the returned spectrum vs numpy stats of the dense one."""
    stats = spectral_stats(got_sv)
    for head, w in enumerate(want_sv):
        ref = spectrum_stats(w, n)
        assert bool(stats.unchanged[head]) == ref["unchanged"]
        if ref["unchanged"]:
            assert float(stats.entropy[head]) == 0.0 and float(stats.frobenius_norm[head]) == 0.0
            continue
        h_ref = ref["entropy"]
        if precise:
            h_tol = F64_TOL * h_ref + 1e-12
            sr_tol = fro_tol = F64_TOL
        else:
            h_tol = f32_entropy_tolerance(w)
            sr_tol, fro_tol = 3 * F32_SQ_TOL, F32_SQ_TOL
        assert abs(float(stats.entropy[head]) - h_ref) <= h_tol
        expected_norm = 1.0 if n == 1 else ref["normalized_entropy"]
        norm_tol = 0.0 if n == 1 else h_tol / math.log(n)
        assert abs(float(stats.normalized_entropy[head]) - expected_norm) <= norm_tol + 1e-15
        # exp(H): relative error = absolute error of H (to first order)
        assert float(stats.effective_rank[head]) == pytest.approx(ref["effective_rank"], rel=1.01 * h_tol + 1e-15)
        assert float(stats.stable_rank[head]) == pytest.approx(ref["stable_rank"], rel=sr_tol)
        assert float(stats.frobenius_norm[head]) == pytest.approx(ref["frobenius_norm"], rel=fro_tol)
        assert float(stats.spectral_norm[head]) == pytest.approx(ref["spectral_norm"], rel=fro_tol)


def assert_layer(spectra: QKSpectra, dense: dict, precise: bool):
    check = assert_spectrum_f64 if precise else assert_spectrum_f32
    n2, n1 = dense["n2"], dense["n1"]
    for name, n in (("delta1", n2), ("delta2", n2), ("delta3", n1), ("dwq", n1), ("dwk", n1)):
        check(getattr(spectra, name), dense[name], n)
        assert_stats(getattr(spectra, name), dense[name], n, precise)
    rel = F64_TOL if precise else F32_SQ_TOL
    assert spectra.dwq_rel_norm == pytest.approx(dense["dwq_rel_norm"], rel=rel, abs=0)
    assert spectra.dwk_rel_norm == pytest.approx(dense["dwk_rel_norm"], rel=rel, abs=0)
    np.testing.assert_allclose(spectra.q_spectral_norm.numpy(), dense["q_norm_b"], rtol=rel, atol=0)
    np.testing.assert_allclose(spectra.q_spectral_norm_base.numpy(), dense["q_norm_a"], rtol=rel, atol=0)
    np.testing.assert_allclose(spectra.qk_logit_bound.numpy(), dense["logit_bound"], rtol=rel, atol=0)


# ------------------------------------------------- spectra vs dense, random ---


@settings(max_examples=80, deadline=None)
@given(case=layer_cases())
def test_float64_path_matches_dense_svd_to_1e6_on_random_layers(case):
    stored, exact = make_layer(**case)
    spectra = qk_spectra(*stored, compute_dtype=torch.float64)
    assert_layer(spectra, dense_qk(*exact), precise=True)


@settings(max_examples=80, deadline=None)
@given(case=layer_cases())
def test_float32_path_matches_dense_svd_within_the_gram_rounding_bound(case):
    stored, exact = make_layer(**case)
    spectra = qk_spectra(*stored, compute_dtype=torch.float32)
    assert_layer(spectra, dense_qk(*exact), precise=False)


@pytest.mark.parametrize("compute", [torch.float64, torch.float32])
@pytest.mark.parametrize("rel", [1e-3, 1e-6])
def test_llama_like_heads_match_dense_svd(compute, rel):
    # r = 32, d = 256, 8 query heads over 2 KV heads: closer to real shapes.
    stored, exact = make_layer(7, 8, 2, 32, 256, rel=rel, storage="float32", scale=0.02)
    spectra = qk_spectra(*stored, compute_dtype=compute)
    assert_layer(spectra, dense_qk(*exact), precise=compute == torch.float64)


@pytest.mark.parametrize("compute", [torch.float64, torch.float32])
def test_tiny_updates_of_float64_weights_are_differenced_before_rounding(compute):
    # ‖ΔW‖ = 1e-6 ‖W‖: rounding Q_a and Q_b to float32 *before* subtracting
    # would leave ~6% error in ΔQ. The difference must be taken exactly.
    stored, exact = make_layer(3, 4, 2, 8, 40, rel=1e-6, storage="float64")
    spectra = qk_spectra(*stored, compute_dtype=compute)
    assert_layer(spectra, dense_qk(*exact), precise=compute == torch.float64)


@pytest.mark.parametrize("compute", [torch.float64, torch.float32])
def test_bf16_weights_are_differenced_exactly(compute):
    stored, exact = make_layer(5, 6, 3, 8, 32, rel=1e-2, storage="bfloat16")
    assert all(t.dtype == torch.bfloat16 for t in stored)
    spectra = qk_spectra(*stored, compute_dtype=compute)
    assert_layer(spectra, dense_qk(*exact), precise=compute == torch.float64)


@pytest.mark.parametrize("num_kv", [1, 2, 4], ids=["MQA", "GQA", "MHA"])
def test_each_query_head_pairs_with_its_kv_head(num_kv):
    stored, exact = make_layer(11, 4, num_kv, 6, 16, rel=1e-2)
    spectra = qk_spectra(*stored, compute_dtype=torch.float64)
    assert_layer(spectra, dense_qk(*exact), precise=True)


@pytest.mark.parametrize("compute", [torch.float64, torch.float32])
def test_a_selection_of_heads_with_kv_index_matches_those_heads_of_the_full_layer(compute):
    # Query heads 1, 4, 5 of a 6-over-3 GQA layer (KV heads 0, 2, 2), with only
    # the KV heads they use: rows [0, 2] of K, so kv_index = [0, 1, 1].
    stored, exact = make_layer(79, 6, 3, 5, 18, rel=1e-3)
    q_a, k_a, q_b, k_b = stored
    heads, kv_rows = [1, 4, 5], [0, 2]
    spectra = qk_spectra(q_a[heads], k_a[kv_rows], q_b[heads], k_b[kv_rows], compute_dtype=compute,
                         kv_index=torch.tensor([0, 1, 1]))
    dense = dense_qk(*exact)
    check = assert_spectrum_f64 if compute == torch.float64 else assert_spectrum_f32
    for name, n in (("delta1", 10), ("delta2", 10), ("delta3", 5), ("dwq", 5)):
        check(getattr(spectra, name), dense[name][heads], n)
    check(spectra.dwk, dense["dwk"][kv_rows], 5)
    rel = 1e-10 if compute == torch.float64 else F32_SQ_TOL
    np.testing.assert_allclose(spectra.qk_logit_bound.numpy(), dense["logit_bound"][heads], rtol=rel)


@pytest.mark.parametrize("r, d", [(8, 12), (8, 8), (12, 5)])
def test_heads_wider_than_half_the_hidden_size_report_min_2r_d_values(r, d):
    stored, exact = make_layer(2, 2, 1, r, d, rel=1e-3)
    spectra = qk_spectra(*stored, compute_dtype=torch.float64)
    assert spectra.delta2.shape == (2, min(2 * r, d)) and spectra.delta3.shape == (2, min(r, d))
    assert spectra.delta2_rank == min(2 * r, d)
    assert_layer(spectra, dense_qk(*exact), precise=True)


@pytest.mark.parametrize("changed", ["q_only", "k_only"])
@pytest.mark.parametrize("compute", [torch.float64, torch.float32])
def test_one_sided_update_gives_rank_r_delta2_and_zero_delta3(changed, compute):
    stored, exact = make_layer(13, 4, 2, 5, 30, rel=1e-6, changed=changed)
    spectra = qk_spectra(*stored, compute_dtype=compute)
    dense = dense_qk(*exact)
    assert_layer(spectra, dense, precise=compute == torch.float64)
    assert torch.all(spectra.delta3 == 0) and bool(spectral_stats(spectra.delta3).unchanged.all())
    # Δ2 = ΔQᵀK or QᵀΔK has rank r: the other r of its 2r values are ~0.
    assert float((spectra.delta2[:, 5:] / spectra.delta2[:, :1]).max()) <= 1e-6


@pytest.mark.parametrize("compute", [torch.float64, torch.float32])
def test_rank_deficient_updates_match_dense_svd(compute):
    """ΔQ_h and ΔK_g of rank 1 (only some directions trained, e.g. a few rows
    changed): the Grams of A = [αΔQ; βQ] and of ΔQ are singular, so their
    factors come from the eigendecomposition square root instead of Cholesky,
    with the same results as a dense SVD."""
    rng = np.random.default_rng(53)
    h, g, r, d = 4, 2, 6, 32
    q_a, k_a = rng.normal(size=(h, r, d)), rng.normal(size=(g, r, d))
    q_b = q_a + 1e-3 * rng.normal(size=(h, r, 1)) * rng.normal(size=(h, 1, d))
    k_b = k_a + 1e-3 * rng.normal(size=(g, r, 1)) * rng.normal(size=(g, 1, d))
    spectra = qk_spectra(*(torch.tensor(x) for x in (q_a, k_a, q_b, k_b)), compute_dtype=compute)
    assert_layer(spectra, dense_qk(q_a, k_a, q_b, k_b), precise=compute == torch.float64)


# ------------------------------------------------------ per-head quantities ---


@pytest.mark.parametrize("compute", [torch.float64, torch.float32])
def test_per_head_update_spectra_match_dense_svd_of_each_block(compute):
    stored, exact = make_layer(17, 6, 2, 10, 48, rel=1e-3, storage="float32")
    q_a, k_a, q_b, k_b = exact
    spectra = qk_spectra(*stored, compute_dtype=compute)
    check = assert_spectrum_f64 if compute == torch.float64 else assert_spectrum_f32
    check(spectra.dwq, np.array([svdvals(q_b[h] - q_a[h]) for h in range(6)]), 10)
    check(spectra.dwk, np.array([svdvals(k_b[g] - k_a[g]) for g in range(2)]), 10)


def test_relative_update_norm_is_frobenius_over_the_whole_projection():
    stored, exact = make_layer(19, 4, 2, 6, 24, rel=3e-4)
    q_a, k_a, q_b, k_b = exact
    spectra = qk_spectra(*stored, compute_dtype=torch.float64)
    w_q_a, w_q_b = q_a.reshape(-1, 24), q_b.reshape(-1, 24)  # the [H·r, d] weight
    assert spectra.dwq_rel_norm == pytest.approx(np.linalg.norm(w_q_b - w_q_a) / np.linalg.norm(w_q_a), rel=1e-12)
    assert spectra.dwk_rel_norm == pytest.approx(np.linalg.norm(k_b - k_a) / np.linalg.norm(k_a), rel=1e-12)


@pytest.mark.parametrize("num_kv", [1, 4])
def test_query_spectral_norms_and_logit_bound_match_dense(num_kv):
    stored, exact = make_layer(23, 4, num_kv, 7, 20, rel=1e-1)
    q_a, k_a, q_b, k_b = exact
    spectra = qk_spectra(*stored, compute_dtype=torch.float64)
    group = 4 // num_kv
    for h in range(4):
        assert float(spectra.q_spectral_norm[h]) == pytest.approx(svdvals(q_b[h])[0], rel=1e-12)
        assert float(spectra.q_spectral_norm_base[h]) == pytest.approx(svdvals(q_a[h])[0], rel=1e-12)
        bound = svdvals(q_b[h].T @ k_b[h // group])[0]  # σ_max(Q_hᵀK_g) at b
        assert float(spectra.qk_logit_bound[h]) == pytest.approx(bound, rel=1e-10)


def test_product_singular_values_are_those_of_the_thin_product():
    rng = np.random.default_rng(29)
    a, b = rng.normal(size=(3, 4, 9)), rng.normal(size=(3, 4, 9))
    grams_a = torch.tensor(a @ a.transpose(0, 2, 1))
    grams_b = torch.tensor(b @ b.transpose(0, 2, 1))
    got = product_singular_values(grams_a, grams_b, 4).numpy()
    want = np.array([svdvals(a[i].T @ b[i])[:4] for i in range(3)])
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12 * want.max())


# ------------------------------------------------------------ other rules ---


def test_unchanged_layer_reports_zero_spectra_and_no_nan():
    stored, _ = make_layer(31, 4, 2, 6, 16)
    q_a, k_a, _, _ = stored
    spectra = qk_spectra(q_a, k_a, q_a.clone(), k_a.clone(), compute_dtype=torch.float64)
    for name in ("delta1", "delta2", "delta3", "dwq", "dwk"):
        sv = getattr(spectra, name)
        assert torch.all(sv == 0), name
        stats = spectral_stats(sv)
        assert bool(stats.unchanged.all())
        for field in ("entropy", "normalized_entropy", "effective_rank", "stable_rank", "frobenius_norm"):
            assert torch.isfinite(getattr(stats, field)).all(), (name, field)
    assert spectra.dwq_rel_norm == 0.0 and spectra.dwk_rel_norm == 0.0


@pytest.mark.parametrize("compute", [torch.float64, torch.float32])
def test_reused_checkpoint_grams_give_the_same_spectra(compute):
    stored, _ = make_layer(37, 4, 2, 6, 16, rel=1e-3, storage="float32")
    q_a, k_a, q_b, k_b = stored
    grams_a, grams_b = qk_grams(q_a, k_a, compute), qk_grams(q_b, k_b, compute)
    assert isinstance(grams_a, QKGrams) and grams_a.qq.shape == (4, 6, 6) and grams_a.kk.shape == (2, 6, 6)
    fresh = qk_spectra(q_a, k_a, q_b, k_b, compute_dtype=compute)
    reused = qk_spectra(q_a, k_a, q_b, k_b, compute_dtype=compute, grams_a=grams_a, grams_b=grams_b)
    tol = 1e-12 if compute == torch.float64 else 1e-5
    for name in ("delta1", "delta2", "delta3", "dwq", "dwk", "q_spectral_norm", "qk_logit_bound"):
        a, b = getattr(fresh, name), getattr(reused, name)
        assert torch.allclose(a, b, rtol=tol, atol=tol * float(a.max())), name


def test_non_finite_weights_give_nan_for_the_affected_heads_only():
    stored, _ = make_layer(41, 4, 2, 5, 12, rel=1e-2)
    q_a, k_a, q_b, k_b = stored
    clean = qk_spectra(q_a, k_a, q_b, k_b, compute_dtype=torch.float64)
    q_bad, k_bad = q_b.clone(), k_b.clone()
    q_bad[0, 1, 2] = float("nan")  # query head 0
    k_bad[1, 0, 0] = float("inf")  # KV head 1 = query heads 2, 3
    spectra = qk_spectra(q_a, k_a, q_bad, k_bad, compute_dtype=torch.float64)
    assert torch.isnan(spectra.delta2[[0, 2, 3]]).all() and torch.isnan(spectra.delta1[[0, 2, 3]]).all()
    assert torch.equal(spectra.delta2[1], clean.delta2[1])
    assert torch.isnan(spectra.dwq[0]).all() and torch.equal(spectra.dwq[1:], clean.dwq[1:])
    assert torch.isnan(spectra.dwk[1]).all() and torch.equal(spectra.dwk[0], clean.dwk[0])
    assert math.isnan(spectra.dwq_rel_norm) and math.isnan(spectra.dwk_rel_norm)


def test_kv_head_index_is_the_repeat_kv_layout():
    for num_heads, num_kv in [(8, 8), (8, 2), (8, 1), (32, 8), (6, 3)]:
        expected = np.repeat(np.arange(num_kv), num_heads // num_kv)
        assert kv_head_index(num_heads, num_kv).tolist() == expected.tolist()
    for num_heads, num_kv in [(6, 4), (4, 0), (4, 8)]:
        with pytest.raises(ValueError):
            kv_head_index(num_heads, num_kv)


# ----------------------------------------------------------- norm gains ---


def explicit_fold(weight, gain):
    """diag(γ_h) Q_h for each head, with γ_h the head's slice of the gain."""
    weight = np.asarray(weight, dtype=np.float64)
    gain = np.asarray(gain, dtype=np.float64).reshape(-1, weight.shape[1])
    return np.stack([np.diag(gain[h % len(gain)]) @ weight[h] for h in range(weight.shape[0])])


@pytest.mark.parametrize("layout", ["per_head", "flat", "matrix"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_fold_head_gains_equals_diag_gain_times_head_block(layout, dtype):
    rng = np.random.default_rng(43)
    weight = torch.tensor(rng.normal(size=(3, 4, 7))).to(dtype)
    gain_shape = {"per_head": (4,), "flat": (12,), "matrix": (3, 4)}[layout]
    gain = torch.tensor(rng.uniform(0.5, 2.0, size=gain_shape)).to(dtype)
    folded = fold_head_gains(weight, gain)
    want = explicit_fold(weight.double(), gain.double())
    assert folded.dtype in (torch.float32, torch.float64)  # never rounded back to bf16
    # bf16 × bf16 is exact in float32, anything else is folded in float64: the
    # fold itself adds no rounding beyond float64's.
    np.testing.assert_allclose(folded.double().numpy(), want, rtol=1e-15, atol=0)


def test_fold_head_gains_offset_folds_one_plus_w_for_gemma():
    rng = np.random.default_rng(47)
    weight = torch.tensor(rng.normal(size=(2, 3, 5))).to(torch.bfloat16)
    w = torch.tensor(rng.normal(size=3) * 1e-3).to(torch.bfloat16)
    folded = fold_head_gains(weight, w, offset=1.0)
    want = explicit_fold(weight.double(), 1.0 + w.double())
    np.testing.assert_allclose(folded.double().numpy(), want, rtol=1e-15, atol=0)


def test_fold_head_gains_rejects_a_gain_of_the_wrong_size():
    with pytest.raises(ValueError):
        fold_head_gains(torch.ones(2, 3, 4), torch.ones(5))


@pytest.mark.parametrize("compute", [torch.float64, torch.float32])
def test_each_checkpoint_folds_its_own_gain_before_differencing(compute):
    rng = np.random.default_rng(53)
    (q_a, k_a, q_b, k_b), _ = make_layer(59, 4, 2, 6, 24, rel=1e-2, storage="bfloat16")
    gq_a = torch.tensor(rng.uniform(0.5, 1.5, size=6)).to(torch.bfloat16)  # per head [r]
    gk_a = torch.tensor(rng.uniform(0.5, 1.5, size=12)).to(torch.bfloat16)  # flat [G·r]
    gq_b = (gq_a.double() * (1 + 0.01 * torch.tensor(rng.normal(size=6)))).to(torch.bfloat16)
    gk_b = (gk_a.double() * (1 + 0.01 * torch.tensor(rng.normal(size=12)))).to(torch.bfloat16)
    folded = [fold_head_gains(w, g) for w, g in ((q_a, gq_a), (k_a, gk_a), (q_b, gq_b), (k_b, gk_b))]
    spectra = qk_spectra(*folded, compute_dtype=compute)
    exact = [explicit_fold(w.double(), g.double()) for w, g in ((q_a, gq_a), (k_a, gk_a), (q_b, gq_b), (k_b, gk_b))]
    assert_layer(spectra, dense_qk(*exact), precise=compute == torch.float64)


# ------------------------------------------------- relatedness of weights ---


@pytest.mark.parametrize("rel", [1e-3, 1.0, 10.0])
def test_weight_cosine_is_that_of_the_whole_projections_however_large_the_update(rel):
    stored, exact = make_layer(29, 4, 2, 6, 24, rel=rel)
    q_a, k_a, q_b, k_b = exact
    spectra = qk_spectra(*stored, compute_dtype=torch.float64)

    def cosine(a, b):
        a, b = a.reshape(-1), b.reshape(-1)
        return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))

    assert spectra.q_cosine == pytest.approx(cosine(q_a, q_b), rel=1e-10, abs=1e-12)
    assert spectra.k_cosine == pytest.approx(cosine(k_a, k_b), rel=1e-10, abs=1e-12)
    # An update of `rel` times the weights, independent of them: cos ≈ 1/√(1 + rel²), still well above 0
    # (⟨W_a, ΔW⟩ ≈ ±‖W_a‖‖ΔW‖/√n: three such deviations allowed).
    spread = 3 * rel / math.sqrt(q_a.size) / math.sqrt(1 + rel ** 2)
    assert spectra.q_cosine == pytest.approx(1 / math.sqrt(1 + rel ** 2), abs=spread + 1e-6)


def test_unrelated_weights_have_a_cosine_near_zero():
    (q_a, k_a, _, _), _ = make_layer(31, 4, 2, 16, 64)
    (q_b, k_b, _, _), _ = make_layer(37, 4, 2, 16, 64)
    spectra = qk_spectra(q_a, k_a, q_b, k_b, compute_dtype=torch.float64)
    n = q_a.numel()
    assert abs(spectra.q_cosine) < 4 / math.sqrt(n) and abs(spectra.k_cosine) < 4 / math.sqrt(k_a.numel())


# ------------------------------------------------------------ logit scale ---


@pytest.mark.parametrize("num_kv", [1, 2, 4])
def test_logit_scale_is_the_frobenius_norm_of_the_gain_folded_qk_form(num_kv):
    rng = np.random.default_rng(41)
    h, r, d = 4, 6, 20
    q = rng.normal(size=(h, r, d))
    k = rng.normal(size=(num_kv, r, d))
    gain = rng.uniform(0.2, 3.0, size=d)
    got = logit_scale(torch.tensor(q), torch.tensor(k), input_gain=torch.tensor(gain)).numpy()
    group = h // num_kv
    for head in range(h):
        m = np.diag(gain) @ q[head].T @ k[head // group] @ np.diag(gain)  # the d × d bilinear form
        assert got[head] == pytest.approx(np.linalg.norm(m) / math.sqrt(r), rel=1e-12)


def test_logit_scale_of_selected_heads_uses_each_heads_own_kv_head():
    # A selection's kv_index (here heads 5, 0, 3 over 2 KV heads in an order of
    # their own) takes a gather instead of repeat_kv's broadcast: same values.
    rng = np.random.default_rng(43)
    r, d = 6, 20
    q = rng.normal(size=(3, r, d))
    k = rng.normal(size=(2, r, d))
    gain = rng.uniform(0.2, 3.0, size=d)
    kv_index = [1, 0, 1]
    got = logit_scale(torch.tensor(q), torch.tensor(k), input_gain=torch.tensor(gain),
                      kv_index=torch.tensor(kv_index)).numpy()
    for row, g in enumerate(kv_index):
        m = np.diag(gain) @ q[row].T @ k[g] @ np.diag(gain)
        assert got[row] == pytest.approx(np.linalg.norm(m) / math.sqrt(r), rel=1e-12)


def test_logit_scale_is_the_logits_standard_deviation_for_isotropic_unit_rms_inputs():
    rng = np.random.default_rng(47)
    h, r, d, samples = 2, 8, 32, 200_000
    q, k = rng.normal(size=(h, r, d)) / math.sqrt(d), rng.normal(size=(1, r, d)) / math.sqrt(d)
    gain = rng.uniform(0.5, 2.0, size=d)
    got = logit_scale(torch.tensor(q), torch.tensor(k), input_gain=torch.tensor(gain)).numpy()
    x_i, x_j = gain * rng.normal(size=(samples, d)), gain * rng.normal(size=(samples, d))  # E[x̂x̂ᵀ] = I
    for head in range(h):
        logits = np.einsum("nr,nr->n", x_i @ q[head].T, x_j @ k[0].T) / math.sqrt(r)
        assert np.sqrt(np.mean(logits ** 2)) == pytest.approx(got[head], rel=0.02)  # Monte Carlo: ~0.3 % error


def test_qk_norm_logit_bound_is_attained_and_never_exceeded():
    rng = np.random.default_rng(43)
    r = 8
    q_gain, k_gain = rng.uniform(0.5, 4.0, size=r), rng.uniform(0.5, 4.0, size=r)
    got = qk_norm_logit_bound(torch.tensor(q_gain), torch.tensor(k_gain))
    # Normalised to norm √r, then the gain: all of q (k) on its largest gain, a rotation aligning them.
    q_vec, k_vec = np.zeros(r), np.zeros(r)
    q_vec[q_gain.argmax()], k_vec[k_gain.argmax()] = math.sqrt(r) * q_gain.max(), math.sqrt(r) * k_gain.max()
    assert got == pytest.approx(np.linalg.norm(q_vec) * np.linalg.norm(k_vec) / math.sqrt(r), rel=1e-12)
    for _ in range(200):
        a, b = rng.normal(size=r), rng.normal(size=r)
        a, b = q_gain * a * math.sqrt(r) / np.linalg.norm(a), k_gain * b * math.sqrt(r) / np.linalg.norm(b)
        rotation, _ = np.linalg.qr(rng.normal(size=(r, r)))
        assert abs(a @ rotation @ b) / math.sqrt(r) <= got * (1 + 1e-12)
