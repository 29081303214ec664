"""The loss- and grad-norm-spike baselines against a direct numpy computation."""

import math

import numpy as np
import pytest

from experiments.baselines import SpikeDetector


def numpy_z(values: np.ndarray, smooth: int, history: int, i: int) -> float:
    smoothed = np.convolve(values, np.ones(smooth) / smooth)[: len(values)]
    smoothed[: smooth - 1] = [values[: k + 1].mean() for k in range(smooth - 1)]  # shorter windows at the start
    past = smoothed[i - smooth - history + 1: i - smooth + 1]
    return (smoothed[i] - past.mean()) / past.std()


def test_z_scores_match_numpy():
    rng = np.random.default_rng(0)
    values = 2.0 + 0.05 * rng.standard_normal(400)
    values[350:] += 0.3  # a spike
    detector = SpikeDetector("loss", "loss", log=False, smooth=10, history=200, start=100)
    scores = dict(detector.scores(list(range(400)), values.tolist()))
    assert min(scores) == 209  # the first step with 200 smoothed values before its window
    for step in (209, 300, 352, 399):
        assert scores[step] == pytest.approx(numpy_z(values, 10, 200, step), rel=1e-9)
    expected = next(i for i in range(209, 400) if numpy_z(values, 10, 200, i) >= 5.0)
    assert 350 <= expected < 360  # the spike, within one smoothing window
    assert detector.first_alarm(list(range(400)), values.tolist(), threshold=5.0) == expected
    later = next(i for i in range(361, 400) if numpy_z(values, 10, 200, i) >= 5.0)
    assert detector.first_alarm(list(range(400)), values.tolist(), threshold=5.0, after=360) == later


def test_log_scale_and_non_finite_values():
    detector = SpikeDetector("grad", "grad_norm", log=True, smooth=1, history=4, start=0)
    values = [1.0, 2.0, 1.0, 2.0, 4.0, None]
    scores = dict(detector.scores(list(range(6)), values))
    logs = np.log([1.0, 2.0, 1.0, 2.0])
    assert scores[4] == pytest.approx((math.log(4.0) - logs.mean()) / logs.std())
    assert scores[5] == math.inf  # a NaN/null is an alarm at once
