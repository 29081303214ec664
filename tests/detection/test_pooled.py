"""Evidence pooled over layers: per-layer departures summed and divided by √L."""

import math

import pytest

from ckptscan.detection.rules import Thresholds, assess_report, pooled_departures
from ckptscan.detection.series import Point
from detection.helpers import alerts, run_report


def verdicts(*layers):
    return [{"delta2_entropy_norm": [Point("ok", 0.5, excess=e, own_excess=e) if e is not None
                                     else Point("warmup", 0.5) for e in excesses]} for excesses in layers]


def test_pooled_departure_is_the_capped_sum_over_root_layers():
    pooled = pooled_departures(verdicts([1.0, 9.0, None], [2.0, -9.0, None], [3.0, 2.0, 4.0]),
                               "delta2_entropy_norm", cap=6.0)
    assert pooled[0] == pytest.approx(6.0 / math.sqrt(3))
    assert pooled[1] == pytest.approx((6.0 - 6.0 + 2.0) / math.sqrt(3))  # each layer capped to ±6
    assert pooled[2] == pytest.approx(4.0)  # only one layer judged on that pair
    assert pooled_departures(verdicts([1.0]), "routing_entropy_norm", cap=6.0) == []


def test_departures_from_a_reference_run_are_not_pooled():
    """A reference run's offset persists (seed, data order): the pooled CUSUM
    adds up departures from each layer's own history only."""
    both = [{"delta2_entropy_norm": [Point("ok", 0.5, excess=5.0, own_excess=0.5)]} for _ in range(4)]
    assert pooled_departures(both, "delta2_entropy_norm", cap=6.0) == [pytest.approx(4 * 0.5 / 2)]


def test_a_small_shift_in_every_layer_alerts_through_the_pooled_cusum_only():
    # Every one of 8 layers drifts 0.02 down (about 1.5 robust σ each, never a warning alone).
    report = run_report(30, layers=8, noise=0.0, d2n=lambda i, n: 0.55 if i < 15 else 0.535)
    assess_report(report, Thresholds())
    found = alerts(report, "attention")
    assert found, "the pooled CUSUM should alert"
    assert {f.rule for _, _, f in found} == {"pooled_cusum"}
    step, _, finding = found[0]
    assert finding.onset_step == 1600 and step <= 1800
    assert finding.threshold == Thresholds().pooled_cusum_alert and finding.score >= finding.threshold
