"""The false-alarm threshold: the (1 - rate) quantile of a Gumbel law fitted to per-run maxima."""

import math

import numpy as np
import pytest
from detection.helpers import run_report

from ckptscan.detection.rules import Thresholds
from experiments.calibrate import band_runs, calibrate, gumbel_quantile, gumbel_threshold
from experiments.corpus import load_manifest
from experiments.judge import band_maxima


def test_recovers_the_quantile_of_a_known_gumbel_law():
    mu, beta = 3.0, 0.5
    maxima = np.random.default_rng(0).gumbel(mu, beta, 20_000).tolist()
    exact = mu - beta * math.log(-math.log(0.99))  # 5.300
    assert gumbel_quantile(maxima, 0.01) == pytest.approx(exact, rel=0.01)


def test_never_below_the_largest_maximum_seen():
    maxima = [1.0, 1.1, 1.2, 9.0]
    assert gumbel_threshold(maxima, 0.5) == 9.0
    assert gumbel_threshold([2.0], 0.01) == 2.0


def test_the_band_is_calibrated_leave_one_out_on_recipes_with_three_healthy_runs(tmp_path, corpus_run):
    """A recipe with three or more healthy calibration runs (here generation
    3's; ll2's two seeds of this corpus make none): each of its runs is
    judged against the band of the others, and each band factor is the
    Gumbel quantile of their maxima over alert_sigma (below 1 where healthy
    runs stray less than 6 band sigmas)."""
    names = [f"g3-ll6-bf16-cos-i50-s{s}-healthy" for s in (0, 1, 2)] + [f"ll2-fp32-wsd-s{s}-healthy" for s in (0, 1)]
    runs = [corpus_run(tmp_path, name, run_report(25, seed=k), {}) for k, name in enumerate(names)]
    bands = band_runs(load_manifest(), runs)
    assert [(run.name, [b.name for b in band]) for run, band in bands] == [
        (names[0], names[1:3]), (names[1], [names[0], names[2]]), (names[2], names[0:2])]
    result = calibrate([tmp_path], 0.01, 0.1, partial=True)
    assert result["band_runs"] == names[:3]
    for kind, factor in (("band departure, update monitors", "band_scale_factor"),
                         ("band departure, state monitors", "band_state_scale_factor")):
        measured = band_maxima(bands)[kind]
        assert result["thresholds"][kind]["healthy_maxima"] == [round(m, 3) for m in measured]
        alert = round(gumbel_threshold(measured, 0.01), 3)
        assert result["thresholds"][kind]["alert"] == alert
        assert result[factor] == round(alert / Thresholds().alert_sigma, 3)
    assert len(result["thresholds"]["reference departure"]["healthy_maxima"]) == 5  # every run has another seed


def test_no_band_without_three_healthy_runs_of_a_recipe(tmp_path, corpus_run):
    runs = [corpus_run(tmp_path, f"g3-ll6-bf16-cos-i50-s{s}-healthy", run_report(25, seed=s), {}) for s in (0, 2)]
    assert band_runs(load_manifest(), runs) == []
    result = calibrate([tmp_path], 0.01, 0.1, partial=True)
    assert "band_scale_factor" not in result and "band_state_scale_factor" not in result
    assert not any(kind.startswith("band departure") for kind in result["thresholds"])
