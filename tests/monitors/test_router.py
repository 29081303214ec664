"""Specification of ckptscan.monitors.router (monitors.md, "MoE router"),
checked against brute-force pairwise loops and dense float64 SVDs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ckptscan.monitors.router import RouterMetrics, mean_pairwise_cosine, router_epsilon, router_metrics
from dense_reference import spectrum_stats, svdvals

STORAGE = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}
SQRT2_MINUS_1 = math.sqrt(2) - 1


def stored(array, storage="float64"):
    """The tensor as stored, and the float64 numpy copy of those very values."""
    t = torch.tensor(np.asarray(array)).to(STORAGE[storage])
    return t, t.to(torch.float64).numpy()


def pairwise_cosines(w):
    """cos(w_i, w_j) for every ordered pair i ≠ j; a zero row has cosine 0."""
    w = np.asarray(w, dtype=np.float64)
    out = []
    for i in range(len(w)):
        for j in range(len(w)):
            if i == j:
                continue
            ni, nj = math.sqrt(w[i] @ w[i]), math.sqrt(w[j] @ w[j])
            out.append(0.0 if ni == 0 or nj == 0 else (w[i] @ w[j]) / (ni * nj))
    return np.array(out)


def direct_epsilon(w):
    """max_e ‖w_e − w̄‖ / ‖w̄‖ written out row by row."""
    w = np.asarray(w, dtype=np.float64)
    mean = w.sum(0) / len(w)
    return max(math.sqrt((row - mean) @ (row - mean)) for row in w) / math.sqrt(mean @ mean)


@st.composite
def router_weights(draw, near_equal=None):
    experts, dim = draw(st.integers(2, 16)), draw(st.integers(1, 24))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    near_equal = draw(st.booleans()) if near_equal is None else near_equal
    if near_equal:  # rows w̄ + small perturbations: the collapsed-router regime
        spread = draw(st.sampled_from([1e-6, 1e-3, 0.05, 0.2]))
        w = rng.normal(size=dim) + spread * rng.normal(size=(experts, dim))
    else:
        w = rng.normal(size=(experts, dim)) * draw(st.sampled_from([0.01, 1.0, 100.0]))
    return stored(w, draw(st.sampled_from(sorted(STORAGE))))


@settings(max_examples=100, deadline=None)
@given(weights=router_weights())
def test_mean_pairwise_cosine_is_the_average_over_all_pairs(weights):
    w, exact = weights
    assert mean_pairwise_cosine(w) == pytest.approx(pairwise_cosines(exact).mean(), rel=1e-10, abs=1e-13)


def test_zero_row_counts_as_orthogonal_to_every_other_row():
    w = np.array([[1.0, 2.0, 0.0], [0.0, 0.0, 0.0], [2.0, 1.0, 1.0], [1.0, 2.0, 0.1]])
    assert mean_pairwise_cosine(torch.tensor(w)) == pytest.approx(pairwise_cosines(w).mean(), rel=1e-14)


def test_identical_rows_have_cosine_one_and_epsilon_zero():
    w = torch.tensor(np.tile(np.array([[0.3, -1.2, 2.0]]), (5, 1)))
    assert mean_pairwise_cosine(w) == pytest.approx(1.0, abs=1e-14)
    assert router_epsilon(w) == pytest.approx(0.0, abs=1e-15)


def test_mean_pairwise_cosine_needs_two_rows():
    with pytest.raises(ValueError):
        mean_pairwise_cosine(torch.ones(1, 4))


@settings(max_examples=100, deadline=None)
@given(weights=router_weights())
def test_router_epsilon_is_the_direct_formula(weights):
    w, exact = weights
    assume(np.linalg.norm(exact.mean(0)) > 0)
    assert router_epsilon(w) == pytest.approx(direct_epsilon(exact), rel=1e-10)


def test_router_epsilon_is_infinite_when_the_mean_row_is_zero():
    assert router_epsilon(torch.tensor([[1.0, -2.0], [-1.0, 2.0]])) == math.inf


@settings(max_examples=150, deadline=None)
@given(weights=router_weights(near_equal=True))
def test_cosine_bound_holds_for_every_pair_below_sqrt2_minus_1(weights):
    # cos(w_i, w_j) ≥ (1 − 2ε − ε²)/(1 + ε)² for ε < √2 − 1.
    w, exact = weights
    eps = router_epsilon(w)
    assert eps == pytest.approx(direct_epsilon(exact), rel=1e-10)
    assume(eps < SQRT2_MINUS_1)
    bound = (1 - 2 * eps - eps**2) / (1 + eps) ** 2
    cosines = pairwise_cosines(exact)
    assert cosines.min() >= bound - 1e-12
    assert mean_pairwise_cosine(w) >= bound - 1e-12


@st.composite
def router_pairs(draw):
    experts, dim = draw(st.integers(2, 12)), draw(st.integers(1, 20))  # includes E > d
    storage = draw(st.sampled_from(sorted(STORAGE)))
    rel = draw(st.sampled_from([1e-1, 1e-3, 1e-6] if storage != "bfloat16" else [1e-1, 1e-2]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    w_a = rng.normal(size=(experts, dim)) * 0.02
    w_b = w_a + rel * 0.02 * rng.normal(size=(experts, dim))
    return stored(w_a, storage), stored(w_b, storage)


@settings(max_examples=100, deadline=None)
@given(pair=router_pairs())
def test_update_spectrum_matches_dense_svd(pair):
    (w_a, exact_a), (w_b, exact_b) = pair
    m = router_metrics(w_a, w_b)
    assert isinstance(m, RouterMetrics)
    experts, dim = exact_a.shape
    n = min(experts, dim)
    want = svdvals(exact_b - exact_a)[:n]
    got = m.dwr_singular_values.numpy()
    assert got.shape == (n,)
    top = want.max()
    if top == 0:  # bf16 rounding may leave a tiny update unchanged
        assert np.all(got == 0) and bool(m.dwr.unchanged)
        return
    assert np.max(np.abs(got - want)) <= 1e-6 * top
    big = want >= 1e-3 * top
    assert np.all(np.abs(got - want)[big] <= 1e-6 * want[big])
    ref = spectrum_stats(want, n)
    assert not bool(m.dwr.unchanged)
    for field in ("entropy", "normalized_entropy", "effective_rank", "stable_rank", "frobenius_norm",
                  "spectral_norm"):
        assert float(getattr(m.dwr, field)) == pytest.approx(ref[field], rel=1e-6, abs=1e-12), field
    assert m.dwr_rel_norm == pytest.approx(np.linalg.norm(exact_b - exact_a) / np.linalg.norm(exact_a), rel=1e-12)


def test_state_metrics_describe_each_checkpoint_and_bias_spread():
    rng = np.random.default_rng(61)
    w_a = rng.normal(size=(8, 16))
    w_b = w_a + 0.1 * rng.normal(size=(8, 16))
    bias_a, bias_b = rng.normal(size=8), rng.normal(size=8) * 3
    m = router_metrics(torch.tensor(w_a), torch.tensor(w_b), torch.tensor(bias_a), torch.tensor(bias_b))
    assert m.epsilon == pytest.approx(direct_epsilon(w_b), rel=1e-12)
    assert m.epsilon_base == pytest.approx(direct_epsilon(w_a), rel=1e-12)
    assert m.cosine_similarity == pytest.approx(pairwise_cosines(w_b).mean(), rel=1e-12, abs=1e-15)
    assert m.cosine_similarity_base == pytest.approx(pairwise_cosines(w_a).mean(), rel=1e-12, abs=1e-15)
    assert m.bias_spread == pytest.approx(bias_b.max() - bias_b.min(), rel=1e-15)
    assert m.bias_spread_base == pytest.approx(bias_a.max() - bias_a.min(), rel=1e-15)
    assert m.bias_std == pytest.approx(np.std(bias_b), rel=1e-12)
    assert m.bias_std_base == pytest.approx(np.std(bias_a), rel=1e-12)
    no_bias = router_metrics(torch.tensor(w_a), torch.tensor(w_b))
    assert no_bias.bias_spread is None and no_bias.bias_std is None


def test_more_experts_than_hidden_size_report_min_e_d_values():
    rng = np.random.default_rng(67)
    w_a = rng.normal(size=(12, 5))
    w_b = w_a + 1e-3 * rng.normal(size=(12, 5))
    m = router_metrics(torch.tensor(w_a), torch.tensor(w_b))
    want = svdvals(w_b - w_a)[:5]
    assert m.dwr_singular_values.shape == (5,)
    np.testing.assert_allclose(m.dwr_singular_values.numpy(), want, rtol=1e-6)
    assert float(m.dwr.normalized_entropy) == pytest.approx(spectrum_stats(want, 5)["normalized_entropy"], rel=1e-6)


def test_unchanged_router_is_reported_unchanged_without_nan():
    w = torch.tensor(np.random.default_rng(71).normal(size=(6, 10)))
    m = router_metrics(w, w.clone())
    assert bool(m.dwr.unchanged) and m.dwr_rel_norm == 0.0
    for field in ("entropy", "normalized_entropy", "effective_rank", "stable_rank", "frobenius_norm"):
        assert float(getattr(m.dwr, field)) == 0.0, field


def test_non_finite_router_update_gives_nan_spectrum_not_garbage():
    w_a = torch.tensor(np.random.default_rng(73).normal(size=(4, 6)))
    w_b = w_a.clone()
    w_b[2, 3] = float("nan")
    m = router_metrics(w_a, w_b)
    assert torch.isnan(m.dwr_singular_values).all() and math.isnan(float(m.dwr.entropy))
