"""The false-alarm threshold: the (1 - rate) quantile of a Gumbel law fitted to per-run maxima."""

import math

import numpy as np
import pytest

from experiments.calibrate import gumbel_quantile, gumbel_threshold


def test_recovers_the_quantile_of_a_known_gumbel_law():
    mu, beta = 3.0, 0.5
    maxima = np.random.default_rng(0).gumbel(mu, beta, 20_000).tolist()
    exact = mu - beta * math.log(-math.log(0.99))  # 5.300
    assert gumbel_quantile(maxima, 0.01) == pytest.approx(exact, rel=0.01)


def test_never_below_the_largest_maximum_seen():
    maxima = [1.0, 1.1, 1.2, 9.0]
    assert gumbel_threshold(maxima, 0.5) == 9.0
    assert gumbel_threshold([2.0], 0.01) == 2.0
