"""The CUSUM defaults are the calibrated values (experiments/calibration.json,
written by `python -m experiments.calibrate --write` from the healthy
calibration runs), rounded up to one decimal: a hand edit of either shows here."""

import json
import math
from pathlib import Path

from ckptscan.detection.rules import Thresholds

CALIBRATION = Path(__file__).resolve().parents[2] / "experiments" / "calibration.json"


def rounded_up(x: float) -> float:
    return math.ceil(x * 10 - 1e-9) / 10


def test_cusum_defaults_are_the_calibrated_thresholds():
    c = json.loads(CALIBRATION.read_text())["thresholds"]
    t = Thresholds()
    assert t.cusum_alert == rounded_up(c["cusum specific"]["alert"])  # monitors that may alert alone, 1 %
    assert t.cusum_warn == rounded_up(c["cusum all"]["warn"])  # every sequential monitor, 10 %
    assert t.pooled_cusum_alert == rounded_up(c["pooled_cusum specific"]["alert"])
    assert t.pooled_cusum_warn == rounded_up(c["pooled_cusum specific"]["warn"])


def test_no_healthy_calibration_run_reaches_an_alert():
    c = json.loads(CALIBRATION.read_text())["thresholds"]
    t = Thresholds()
    assert max(c["cusum specific"]["healthy_maxima"]) < t.cusum_alert
    assert max(c["pooled_cusum specific"]["healthy_maxima"]) < t.pooled_cusum_alert


def test_reference_scale_is_the_calibrated_spread_between_healthy_runs():
    """Two healthy runs of one recipe (other seed) differ by this many of one
    run's sigmas at the calibrated 1 % rate; the default is it, rounded up."""
    c = json.loads(CALIBRATION.read_text())
    t = Thresholds()
    assert t.reference_scale_factor == rounded_up(c["reference_scale_factor"])
    assert c["reference_scale_factor"] == round(c["thresholds"]["reference departure"]["alert"] / t.alert_sigma, 3)
    assert max(c["thresholds"]["reference departure"]["healthy_maxima"]) < t.alert_sigma * t.reference_scale_factor
