"""The CUSUM of detection/changepoint.py against textbook values.

For i.i.d. N(μ, 1) observations, a one-sided CUSUM with reference value k and
threshold h has average run length (ARL) given by Siegmund's approximation
    ARL(μ) ≈ (exp(-2Δb) + 2Δb - 1) / (2Δ²),   Δ = μ - k,  b = h + 1.166,
accurate to a few percent for these parameters (Montgomery, Introduction to
Statistical Quality Control, §9.1: k = 0.5, h = 5 gives ARL0 ≈ 938 and
ARL1 ≈ 10.4 at a 1σ shift). The expected values below come from the
formula, not from the code under test.
"""

import math

import numpy as np
import pytest

from ckptscan.detection.changepoint import Cusum, change_point, first_crossing


def siegmund_arl(mu: float, k: float, h: float) -> float:
    delta, b = mu - k, h + 1.166
    return (math.exp(-2 * delta * b) + 2 * delta * b - 1) / (2 * delta ** 2)


def run_length(cusum: Cusum, zs: np.ndarray, h: float) -> int:
    c = 0.0
    for i, z in enumerate(zs.tolist()):
        c = cusum.step(c, z)
        if c >= h:
            return i + 1
    return len(zs)


def test_siegmund_formula_gives_the_textbook_values():
    assert siegmund_arl(0.0, 0.5, 5.0) == pytest.approx(938, rel=0.01)
    assert siegmund_arl(1.0, 0.5, 5.0) == pytest.approx(10.4, rel=0.01)


def test_in_control_average_run_length_matches_siegmund():
    rng = np.random.default_rng(0)
    lengths = [run_length(Cusum(0.5), rng.standard_normal(20_000), 5.0) for _ in range(300)]
    # The run length is roughly exponential: the standard error of the mean of 300 is ~6 %.
    assert np.mean(lengths) == pytest.approx(siegmund_arl(0.0, 0.5, 5.0), rel=0.2)


def test_detection_delay_after_a_one_sigma_shift_matches_siegmund():
    rng = np.random.default_rng(1)
    lengths = [first_crossing(Cusum(0.5).run((rng.standard_normal(200) + 1.0).tolist()), 5.0) + 1
               for _ in range(2000)]
    assert np.mean(lengths) == pytest.approx(siegmund_arl(1.0, 0.5, 5.0), rel=0.05)


def test_statistic_by_hand():
    # C = max(0, C + min(z, cap) - k): 0.2 and -4 leave 0; 2 adds 1.5; 10 is capped to 3 and adds 2.5;
    # 0 takes 0.5 off; a missing point changes nothing; -9 floors C at 0.
    stats = Cusum(drift=0.5, cap=3.0).run([0.2, -4.0, 2.0, 10.0, 0.0, None, -9.0])
    assert stats == [0.0, 0.0, 1.5, 4.0, 3.5, None, 0.0]


def test_a_persistent_small_shift_crosses_where_no_single_point_would():
    zs = [0.0] * 30 + [2.0] * 10  # each point 2 σ: far below a 4 σ single-point rule
    stats = Cusum(drift=1.0).run(zs)
    crossing = first_crossing(stats, 5.0)
    assert crossing == 34  # 1 σ net per point: 5 after five points
    assert change_point(stats, crossing) == 30  # the change-point estimate is where the shift began


def test_change_point_stops_at_unjudged_points():
    stats = [None, None, 1.0, 2.0, 3.0]
    assert change_point(stats, 4) == 2
    assert first_crossing(stats, 10.0) is None
