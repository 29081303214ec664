"""Routing entropy and load statistics against a direct numpy computation."""

import math

import numpy as np
import pytest
import torch

from ckptscan.monitors.routing import LOW_ENTROPY_FLOOR, routing_stats


def numpy_routing(x, w, top_k, scoring="softmax", bias=None, floor=LOW_ENTROPY_FLOOR):
    """The definitions of monitors.md, written out token by token in numpy."""
    x, w = np.asarray(x, dtype=np.float64), np.asarray(w, dtype=np.float64)
    num_experts = w.shape[0]
    entropies, counts = [], np.zeros(num_experts)
    for token in x:
        z = w @ token
        if scoring == "softmax":
            scores = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        else:
            with np.errstate(over="ignore"):  # exp(-z) = inf gives σ = 0, as it should
                scores = 1.0 / (1.0 + np.exp(-z))
        p = scores / scores.sum()
        entropies.append(-sum(pe * math.log(pe) for pe in p if pe > 0))
        choice = scores + (0.0 if bias is None else np.asarray(bias, dtype=np.float64))
        for e in np.argsort(-choice)[:top_k]:
            counts[e] += 1
    h = np.array(entropies)
    load = counts / (len(x) * top_k)
    return {
        "entropy": h.mean(),
        "entropy_p05": np.percentile(h, 5),
        "entropy_norm": (h / math.log(num_experts)).mean(),
        "low_entropy_share": (h / math.log(num_experts) < floor).mean(),
        "load": load,
        "load_cv": load.std() / load.mean(),
        "dead_experts": int((counts == 0).sum()),
    }


def assert_matches(stats, expected):
    for name in ("entropy", "entropy_p05", "entropy_norm", "low_entropy_share", "load_cv"):
        assert getattr(stats, name) == pytest.approx(expected[name], rel=1e-10, abs=1e-12), name
    np.testing.assert_allclose(stats.load.numpy(), expected["load"], rtol=0, atol=1e-15)
    assert stats.dead_experts == expected["dead_experts"]


def random_case(seed, tokens=200, dim=24, experts=8, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, dim, generator=gen, dtype=torch.float64)
    w = torch.randn(experts, dim, generator=gen, dtype=torch.float64) * scale / math.sqrt(dim)
    return x, w


@pytest.mark.parametrize("seed, top_k, scale", [(0, 2, 1.0), (1, 1, 3.0), (2, 3, 0.3), (3, 2, 10.0)])
def test_softmax_router_matches_numpy(seed, top_k, scale):
    x, w = random_case(seed, scale=scale)
    stats = routing_stats(x, w, top_k)
    assert_matches(stats, numpy_routing(x, w, top_k))
    assert stats.tokens == 200 and stats.top_k == top_k
    assert stats.load.sum() == pytest.approx(1.0)


@pytest.mark.parametrize("seed", [4, 5])
def test_sigmoid_router_with_selection_bias_matches_numpy(seed):
    x, w = random_case(seed, experts=16, scale=2.0)
    bias = torch.randn(16, generator=torch.Generator().manual_seed(seed + 100), dtype=torch.float64) * 0.3
    stats = routing_stats(x, w, 4, scoring="sigmoid", selection_bias=bias)
    assert_matches(stats, numpy_routing(x, w, 4, scoring="sigmoid", bias=bias))


def test_selection_bias_moves_load_but_not_the_distribution():
    x, w = random_case(6, experts=8)
    bias = torch.zeros(8, dtype=torch.float64)
    bias[5] = 10.0  # far above any sigmoid score: expert 5 is picked by every token
    plain = routing_stats(x, w, 2, scoring="sigmoid")
    biased = routing_stats(x, w, 2, scoring="sigmoid", selection_bias=bias)
    assert biased.entropy == plain.entropy and biased.entropy_p05 == plain.entropy_p05
    assert float(biased.load[5]) == 0.5  # one of the two selections of every token
    assert float(plain.load[5]) < 0.5


def test_sigmoid_and_softmax_differ_on_the_same_logits():
    # Guards against the sigmoid branch silently falling back to softmax.
    x, w = random_case(7, scale=3.0)
    assert routing_stats(x, w, 2).entropy != pytest.approx(routing_stats(x, w, 2, scoring="sigmoid").entropy)


def test_uniform_router_has_entropy_ln_e():
    x, _ = random_case(8)
    stats = routing_stats(x, torch.zeros(8, 24, dtype=torch.float64), 2)
    assert stats.entropy == pytest.approx(math.log(8), rel=1e-14)
    assert stats.entropy_norm == pytest.approx(1.0, rel=1e-14)
    assert stats.low_entropy_share == 0.0


def test_collapsed_router_has_low_entropy_and_dead_experts():
    gen = torch.Generator().manual_seed(9)
    x = torch.rand(100, 16, generator=gen, dtype=torch.float64) + 0.5  # positive inputs
    w = torch.zeros(8, 16, dtype=torch.float64)
    w[0], w[1] = 5.0, 4.0  # experts 0 and 1 win every token by a wide margin
    stats = routing_stats(x, w, 2)
    assert stats.entropy < 1e-4 and stats.low_entropy_share == 1.0
    assert stats.dead_experts == 6
    assert stats.load_cv == pytest.approx(math.sqrt(8 / 2 - 1))  # the most uneven top-2 load
    assert_matches(stats, numpy_routing(x, w, 2))


def test_float32_product_agrees_with_float64():
    x, w = random_case(10, tokens=500, dim=256, experts=32, scale=2.0)
    exact = routing_stats(x, w, 2)
    fast = routing_stats(x.float(), w.float(), 2, compute_dtype=torch.float32)
    assert fast.entropy == pytest.approx(exact.entropy, rel=1e-5)
    assert fast.entropy_p05 == pytest.approx(exact.entropy_p05, rel=1e-4)


def test_huge_logits_stay_finite_and_rank_without_ties():
    # Logits ~1e4: exp overflows without log-space care, and p (or σ) saturates
    # so that ranking p itself would tie; the ranking of W x is the exact one.
    x, w = random_case(11, scale=1e4)
    z = x.numpy() @ w.numpy().T
    counts = np.bincount(np.argsort(-z, axis=1)[:, :2].reshape(-1), minlength=8)
    for scoring in ("softmax", "sigmoid"):
        stats = routing_stats(x, w, 2, scoring=scoring)
        expected = numpy_routing(x, w, 2, scoring=scoring)
        assert math.isfinite(stats.entropy) and stats.entropy >= 0
        for name in ("entropy", "entropy_p05", "entropy_norm", "low_entropy_share"):
            assert getattr(stats, name) == pytest.approx(expected[name], rel=1e-9, abs=1e-12), name
        np.testing.assert_array_equal(stats.load.numpy(), counts / 400)


@pytest.mark.parametrize(
    "x_shape, w_shape, top_k, scoring, message",
    [
        ((10, 8), (4, 9), 2, "softmax", "do not match"),
        ((10, 8), (4, 8), 5, "softmax", "top-k 5"),
        ((10, 8), (4, 8), 0, "softmax", "top-k 0"),
        ((10, 8), (1, 8), 1, "softmax", "at least two experts"),
        ((0, 8), (4, 8), 2, "softmax", "no tokens"),
        ((10, 8), (4, 8), 2, "tanh", "scoring"),
    ],
)
def test_bad_arguments(x_shape, w_shape, top_k, scoring, message):
    with pytest.raises(ValueError, match=message):
        routing_stats(torch.ones(x_shape), torch.ones(w_shape), top_k, scoring=scoring)
