"""The defaults are the calibrated values (experiments/calibration.json,
written by `python -m experiments.calibrate --write` from the healthy
calibration runs), rounded up to one decimal: a hand edit of either shows here.

The CUSUM levels and the single-reference factor may stay above the newest
fit, never below it: the 30-run fit (generation 2's four seeds per recipe and
generation 3) pools 30-pair and 80-pair runs, and its CUSUM quantile (4.38)
is below what a held-out 80-pair healthy run reached (5.0), so the 18-run
levels were kept (docs/calibration.md)."""

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
    assert t.cusum_alert >= rounded_up(c["cusum specific"]["alert"])  # monitors that may alert alone, 1 %
    # Warnings: at least the specific monitors' 10 % quantile, at most the alert level (the warn-only
    # monitors' own 10 % quantile lies above it: their CUSUM past cusum_alert warns, capped, anyway).
    assert rounded_up(c["cusum specific"]["warn"]) <= t.cusum_warn <= t.cusum_alert
    assert t.pooled_cusum_alert >= rounded_up(c["pooled_cusum specific"]["alert"])
    assert rounded_up(c["pooled_cusum specific"]["warn"]) <= t.pooled_cusum_warn <= t.pooled_cusum_alert


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
    assert t.reference_scale_factor >= rounded_up(c["reference_scale_factor"])
    assert c["reference_scale_factor"] == round(c["thresholds"]["reference departure"]["alert"] / t.alert_sigma, 3)
    assert max(c["thresholds"]["reference departure"]["healthy_maxima"]) < t.alert_sigma * t.reference_scale_factor


def test_band_scales_are_the_calibrated_spread_around_a_band_of_healthy_runs():
    """Each healthy calibration run against the band of the other healthy runs
    of its recipe, warm-up pairs included: the defaults are the calibrated
    factors, rounded up, and no such run reaches an alert."""
    c = json.loads(CALIBRATION.read_text())
    t = Thresholds()
    assert t.band_scale_factor == rounded_up(c["band_scale_factor"])
    assert t.band_state_scale_factor == rounded_up(c["band_state_scale_factor"])
    for kind, factor in (("band departure, update monitors", t.band_scale_factor),
                         ("band departure, state monitors", t.band_state_scale_factor)):
        assert max(c["thresholds"][kind]["healthy_maxima"]) < t.alert_sigma * factor


def test_layer_band_levels_are_the_calibrated_quantiles_of_the_layer_mean():
    """The same leave-one-out bands: the largest mean departure of a layer's
    attention update monitors on two pairs in a row, per healthy run; the
    defaults are its Gumbel 10 % and 1 % quantiles, rounded up, and no
    healthy calibration run reaches the alert."""
    c = json.loads(CALIBRATION.read_text())
    t = Thresholds()
    assert t.layer_band_warn == rounded_up(c["layer_band_warn"])
    assert t.layer_band_alert == rounded_up(c["layer_band_alert"])
    assert (c["layer_band_warn"], c["layer_band_alert"]) == (
        c["thresholds"]["band departure, layer mean"]["warn"], c["thresholds"]["band departure, layer mean"]["alert"])
    assert max(c["thresholds"]["band departure, layer mean"]["healthy_maxima"]) < t.layer_band_alert


def test_run_band_levels_are_the_calibrated_quantiles_of_the_run_mean():
    """The same bands: the largest mean over layers of those layer means, on
    two pairs in a row, per healthy run; the defaults are its quantiles,
    rounded up, and no healthy calibration run reaches the alert."""
    c = json.loads(CALIBRATION.read_text())
    t = Thresholds()
    assert t.run_band_warn == rounded_up(c["run_band_warn"])
    assert t.run_band_alert == rounded_up(c["run_band_alert"])
    assert (c["run_band_warn"], c["run_band_alert"]) == (
        c["thresholds"]["band departure, run mean"]["warn"], c["thresholds"]["band departure, run mean"]["alert"])
    assert max(c["thresholds"]["band departure, run mean"]["healthy_maxima"]) < t.run_band_alert
