"""The self-baseline series rule on synthetic series: step changes, slow
drifts, warm-up ramps, LR-schedule-like scale changes, noise and NaN."""

import math
import random

import pytest

from ckptscan.detection.series import (
    Expectation,
    SeriesSettings,
    SeriesSpec,
    first_judged,
    robust_center_scale,
    theil_sen_slope,
    track,
)

LOW = SeriesSpec("low", min_scale=0.01)  # e.g. a normalised entropy
LOW_DRIFTING = SeriesSpec("low", min_scale=0.01, follow_trend=True)  # e.g. routing entropy
HIGH_LOG = SeriesSpec("high", min_scale=0.05, follow_trend=True, log=True)  # e.g. the logit bound
SETTINGS = SeriesSettings(warn_sigma=4.0, alert_sigma=6.0, consecutive=2, window=8, min_points=5, start=2)


def noisy(values, sigma, seed):
    rng = random.Random(seed)
    return [v + rng.gauss(0, sigma) for v in values]


def states(points):
    return [p.state for p in points]


def first(points, state):
    return next((i for i, p in enumerate(points) if p.state == state), None)


def test_step_change_alerts_after_consecutive_pairs_with_onset():
    values = noisy([0.55] * 20 + [0.35] * 10, 0.01, seed=1)
    points = track(range(30), values, LOW, SETTINGS)
    assert first(points, "warn") == 20  # at once: a departure beyond alert_sigma
    assert first(points, "alert") == 21  # the second departing pair confirms
    alert = points[21]
    assert alert.onset == 20
    assert alert.excess >= 6 and alert.rule in ("trend", "level")
    assert alert.value < alert.alert_at < alert.warn_at < alert.expected


def test_single_outlier_warns_but_is_not_an_alert():
    values = noisy([0.55] * 30, 0.01, seed=2)
    values[15] = 0.2
    points = track(range(30), values, LOW, SETTINGS)
    assert points[15].excess > 6 and points[15].state == "warn"
    assert set(states(points[16:])) == {"ok"}


def test_departure_on_the_good_side_is_ignored():
    values = noisy([0.5] * 15 + [0.8] * 15, 0.01, seed=3)
    assert "alert" not in states(track(range(30), values, LOW, SETTINGS))


@pytest.mark.parametrize("seed", range(20))
def test_pure_noise_raises_no_alarm(seed):
    values = noisy([0.5] * 60, 0.02, seed)
    assert set(states(track(range(60), values, LOW, SETTINGS))) <= {"warmup", "baseline", "ok"}


def test_warm_up_ramp_then_plateau_is_healthy():
    # Healthy Δ2 entropy: low and rising just after warm-up, then flat.
    ramp = [0.25 + 0.35 * (1 - math.exp(-i / 3)) for i in range(40)]
    points = track(range(40), noisy(ramp, 0.01, seed=4), LOW, SETTINGS)
    assert set(states(points)) <= {"warmup", "baseline", "ok"}


def test_slow_healthy_decline_is_followed_on_a_drifting_monitor():
    # Routing entropy falling steadily as experts specialise: 0.9 -> 0.6 over 60 pairs.
    values = noisy([0.9 - 0.005 * i for i in range(60)], 0.005, seed=5)
    points = track(range(60), values, LOW_DRIFTING, SETTINGS)
    assert set(states(points)) <= {"warmup", "baseline", "ok"}


def test_decelerating_healthy_decline_is_followed():
    values = noisy([0.6 + 0.3 * math.exp(-i / 15) for i in range(60)], 0.005, seed=6)
    assert "alert" not in states(track(range(60), values, LOW_DRIFTING, SETTINGS))


def test_departure_from_a_healthy_trend_alerts():
    # The same steady decline, then a collapse from pair 40.
    values = [0.9 - 0.005 * i for i in range(40)] + [0.7 - 0.04 * i for i in range(1, 21)]
    points = track(range(60), noisy(values, 0.005, seed=7), LOW_DRIFTING, SETTINGS)
    alert = first(points, "alert")
    assert alert is not None and 40 <= alert <= 43
    assert points[alert].rule == "trend"


def test_trend_away_from_the_alarm_side_is_not_extrapolated():
    # Rising then flat: extrapolating the rise would call the plateau a fall.
    values = [0.3 + 0.03 * i for i in range(12)] + [0.63] * 30
    points = track(range(42), noisy(values, 0.005, seed=8), LOW_DRIFTING, SETTINGS)
    assert "warn" not in states(points) and "alert" not in states(points)


def test_slow_fault_on_a_stationary_monitor_is_caught_by_the_level_rule():
    # A drift too slow for the trailing baseline to see pair by pair.
    values = [0.55] * 20 + [0.55 - 0.006 * i for i in range(1, 41)]
    points = track(range(60), noisy(values, 0.004, seed=9), LOW, SETTINGS)
    alert = first(points, "alert")
    assert alert is not None and alert > 20
    assert points[alert].rule == "level"


def test_lr_schedule_scale_changes_on_a_log_monitor():
    # A norm that grows with warm-up then shrinks with decay (x10 overall) is not a departure upward.
    schedule = [min(1.0, (i + 1) / 5) * (0.1 + 0.9 * (1 + math.cos(math.pi * i / 60)) / 2) for i in range(60)]
    values = noisy([10 * s for s in schedule], 0.0, seed=10)
    points = track(range(60), values, HIGH_LOG, SETTINGS)
    assert "alert" not in states(points)


def test_log_monitor_alerts_on_growth_and_reports_in_its_own_units():
    values = [5.0 * (1 + 0.01 * ((-1) ** i)) for i in range(20)] + [5.0 * 1.6 ** k for k in range(1, 6)]
    points = track(range(25), values, HIGH_LOG, SETTINGS)
    alert = first(points, "alert")
    assert alert is not None and 20 <= alert <= 21
    assert points[alert].expected == pytest.approx(5.0, rel=0.05)
    assert points[alert].alert_at > points[alert].expected


def test_nan_and_none_are_missing_and_do_not_break_a_streak():
    values = noisy([0.55] * 20, 0.01, seed=11) + [0.3, float("nan"), None, 0.3, 0.3]
    points = track(range(25), values, LOW, SETTINGS)
    assert points[21].state == points[22].state == "missing"
    assert points[23].state == "alert" and points[23].onset == 20


def test_warm_up_points_are_not_judged_nor_used():
    values = [0.05, 0.1] + noisy([0.55] * 20, 0.01, seed=12)
    points = track(range(22), values, LOW, SETTINGS)
    assert states(points)[:2] == ["warmup", "warmup"]
    assert states(points)[2:7] == ["baseline"] * 5
    assert set(states(points)[7:]) == {"ok"}


def test_departing_points_do_not_teach_the_baseline():
    values = noisy([0.55] * 20, 0.01, seed=13) + [0.3] * 20
    points = track(range(40), values, LOW, SETTINGS)
    assert all(p.state == "alert" for p in points[21:])
    assert all(p.expected > 0.5 for p in points[21:])


def test_reference_judges_from_the_first_pair_after_warm_up():
    # A fault present from the start: no self-baseline can see it; a healthy reference does.
    values = noisy([0.2] * 20, 0.01, seed=14)
    reference = [Expectation(0.55, 0.02)] * 20
    points = track(range(20), values, LOW, SETTINGS, reference)
    assert points[3].state == "alert" and points[3].rule == "reference"
    assert "alert" not in states(track(range(20), values, LOW, SETTINGS))


def test_robust_helpers_against_brute_force():
    values = [0.1, 0.4, 0.2, 0.9, 0.3]
    center, scale = robust_center_scale(values, 0.0)
    assert center == 0.3
    assert scale == pytest.approx(1.4826 * sorted(abs(v - 0.3) for v in values)[2])
    assert robust_center_scale([1.0] * 5, 0.01) == (1.0, 0.01)
    xs, ys = [0, 1, 2, 3, 4], [0.0, 2.0, 4.0, 100.0, 8.0]  # one outlier on the line y = 2x
    assert theil_sen_slope(xs, ys) == 2.0


@pytest.mark.parametrize("from_steps, pairs, steps, expected", [
    ([0, 100, 200, 300], 2, 0, 2),
    ([0, 100, 200, 300], 0, 150, 2),
    ([0, 100, 200, 300], 1, 1000, 4),
    ([0, 100], 5, 0, 2),
])
def test_first_judged(from_steps, pairs, steps, expected):
    assert first_judged(from_steps, pairs, steps) == expected


CUSUM = SeriesSettings(warn_sigma=4.0, alert_sigma=6.0, consecutive=2, window=8, min_points=5, start=2,
                       cusum_drift=1.0, cusum_cap=6.0, cusum_warn=4.8, cusum_alert=5.7)


def test_cusum_catches_a_slow_decline_that_no_single_point_makes_a_warning():
    # Flat at 0.55 (noise below the resolution, so sigma is min_scale inflated for few points), then
    # falling 0.012 a pair for good: each point under the 4 σ single-point warning, but it keeps
    # leaving the trailing median behind, and the CUSUM adds the departures up.
    values = [0.55] * 20 + [0.55 - 0.012 * (i + 1) for i in range(10)]
    points = track(range(30), values, LOW, CUSUM)
    alert = first(points, "alert")
    assert alert == 24  # 5 pairs into the decline
    warned = first(points, "warn")
    assert warned == 23 and points[warned].rule == "cusum"
    assert all(p.excess is None or p.excess < CUSUM.warn_sigma for p in points[:warned + 1])
    assert points[alert].rule == "cusum" and points[alert].cusum >= CUSUM.cusum_alert
    assert points[alert].onset == 21  # the change-point estimate: where the decline began to count
    # Without the sequential rule the same points are quiet until the decline is 4 σ deep.
    quiet = track(range(30), values, LOW, SETTINGS)
    assert set(states(quiet[:warned + 1])) <= {"warmup", "baseline", "ok"}


def test_a_small_step_that_then_holds_is_not_accumulated():
    """A healthy entropy settles to a new level 2-3 σ off its early one (a
    wider model saved every 50 steps does, for thousands of steps): the trend
    follows it and the CUSUM, which adds up departures from the trend only,
    stays under its alert; the frozen level still judges each point alone."""
    values = [0.55] * 20 + [0.52] * 40
    points = track(range(60), values, LOW, CUSUM)
    assert first(points, "alert") is None
    assert max(p.cusum for p in points if p.cusum is not None) < CUSUM.cusum_alert
    assert any(p.rule == "level" and p.excess > 2 for p in points[40:])


def test_cusum_stays_at_zero_on_a_noisy_healthy_series():
    values = noisy([0.55] * 60, 0.01, seed=7)
    points = track(range(60), values, LOW, CUSUM)
    assert "alert" not in states(points)
    assert max(p.cusum for p in points if p.cusum is not None) < CUSUM.cusum_warn


def test_a_monitor_can_opt_out_of_the_cusum():
    values = [0.55] * 20 + [0.52] * 10
    spec = SeriesSpec("low", min_scale=0.01, sequential=False)
    points = track(range(30), values, spec, CUSUM)
    assert "alert" not in states(points) and all(p.cusum is None for p in points)


def test_a_reference_offset_is_judged_point_by_point_not_accumulated():
    # A healthy run that sits 3 reference-sigmas below its reference for good
    # (another seed): each point is far under the reference rule's warn level,
    # and the CUSUM, which accumulates departures from the run's own history
    # only, stays quiet. The same offset in the run's own history would alert.
    values = noisy([0.55] * 30, 0.002, seed=3)
    reference = [Expectation(0.58, 0.01)] * 30
    points = track(range(30), values, LOW, CUSUM, reference)
    assert set(states(points)) <= {"warmup", "ok"}
    assert max(p.excess for p in points if p.excess is not None) == pytest.approx(3.0, abs=1.0)
    assert all(p.cusum == 0 for p in points if p.cusum is not None)
    assert all(p.own_excess is None or p.own_excess < 2 for p in points)
