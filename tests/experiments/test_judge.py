"""Re-judging stored runs against one reference or a band, and the band's calibration statistic."""

import dataclasses
import json

import pytest
from detection.helpers import run_report

from ckptscan.detection.rules import Thresholds
from experiments.judge import band_maxima, judge_run, reference_maxima


def stored(tmp_path, name, report):
    """A corpus run directory holding `report` as its metrics.json."""
    run = tmp_path / name
    run.mkdir()
    (run / "metrics.json").write_text(json.dumps(dataclasses.asdict(report)))
    return run


@pytest.fixture
def corpus(tmp_path):
    """Three healthy runs of one recipe (other noise seeds) and a run whose
    layer-1 Δ2 entropy sits 0.15 below theirs from the first pair on."""
    healthy = [stored(tmp_path, f"healthy-{seed}", run_report(30, seed=seed)) for seed in (1, 2, 3)]
    low = run_report(30, seed=4, d2n=lambda i, n: 0.55 - (0.15 if n == 1 else 0.0))
    return healthy, stored(tmp_path, "low", low)


def reference_alerts(report):
    return [(p.to_step, layer.layer, f.monitor) for p in report.pairs for layer in p.layers for f in layer.findings
            if f.severity == "alert" and f.rule == "reference"]


def test_one_reference_directory_or_a_list_of_one_judge_alike(corpus):
    healthy, low = corpus
    alone, listed = judge_run(low, Thresholds(), None, healthy[0]), judge_run(low, Thresholds(), None, healthy[:1])
    assert reference_alerts(alone) == reference_alerts(listed)
    assert alone.summary == listed.summary
    assert "reference_runs" not in alone.settings


def test_several_reference_directories_make_a_band(corpus):
    healthy, low = corpus
    banded = judge_run(low, Thresholds(), None, healthy[:2])
    assert banded.settings["reference_runs"] == [str(h) for h in healthy[:2]]
    assert {layer for _, layer, _ in reference_alerts(banded)} == {1}
    assert reference_alerts(judge_run(healthy[2], Thresholds(), None, healthy[:2])) == []


def test_the_band_statistic_is_the_factor_at_which_the_band_stops_alerting(corpus):
    """band_maxima's update-monitor value m (the run departs in Δ2 entropy):
    with band_scale_factor just under m / alert_sigma the band alerts on the
    run, just over it, it does not."""
    healthy, low = corpus
    maxima = band_maxima([(low, healthy[:2])])
    (m,) = maxima["band departure, update monitors"]
    t = Thresholds(band_state_scale_factor=100.0)  # the state monitors kept out of it
    assert m / t.alert_sigma > 1
    under = judge_run(low, dataclasses.replace(t, band_scale_factor=0.99 * m / t.alert_sigma), None, healthy[:2])
    over = judge_run(low, dataclasses.replace(t, band_scale_factor=1.01 * m / t.alert_sigma), None, healthy[:2])
    assert reference_alerts(under) and not reference_alerts(over)
    assert list(maxima) == ["band departure, update monitors", "band departure, state monitors",
                            "band departure, layer mean", "band departure, run mean"]


def layer_band_alerts(report):
    return [(p.to_step, layer.layer) for p in report.pairs for layer in p.layers for f in layer.findings
            if f.severity == "alert" and f.rule == "layer_band"]


def test_the_layer_band_statistic_is_the_level_at_which_the_rule_stops_alerting(corpus):
    """band_maxima's layer-mean value m: with layer_band_alert just under m
    the layer-band rule alerts on the run's faulty layer, just over it, it
    does not; the healthy runs' statistic is below the run's."""
    healthy, low = corpus
    (m,) = band_maxima([(low, healthy[:2])])["band departure, layer mean"]
    (h,) = band_maxima([(healthy[2], healthy[:2])])["band departure, layer mean"]
    assert m > h
    t = Thresholds()
    under = judge_run(low, dataclasses.replace(t, layer_band_warn=0.99 * m, layer_band_alert=0.99 * m), None,
                      healthy[:2])
    over = judge_run(low, dataclasses.replace(t, layer_band_warn=1.01 * m, layer_band_alert=1.01 * m), None,
                     healthy[:2])
    assert {layer for _, layer in layer_band_alerts(under)} == {1}
    assert layer_band_alerts(over) == []


def test_the_run_band_statistic_is_the_level_at_which_the_rule_stops_alerting(corpus):
    """band_maxima's run-mean value m: with run_band_alert just under m the
    run-band rule alerts, just over it, it does not."""
    healthy, low = corpus
    (m,) = band_maxima([(low, healthy[:2])])["band departure, run mean"]
    t = dataclasses.replace(Thresholds(), layer_band_warn=100, layer_band_alert=100)

    def run_band_alerts(level):
        report = judge_run(low, dataclasses.replace(t, run_band_warn=level, run_band_alert=level), None, healthy[:2])
        return [p.to_step for p in report.pairs for layer in p.layers for f in layer.findings
                if f.severity == "alert" and f.rule == "run_band"]
    assert run_band_alerts(0.99 * m) and not run_band_alerts(1.01 * m)


def test_one_reference_statistic_is_the_scale_at_which_it_stops_alerting(corpus):
    healthy, low = corpus
    (m,) = reference_maxima([(low, healthy[0])])
    t = Thresholds()
    under = judge_run(low, dataclasses.replace(t, reference_scale_factor=0.99 * m / t.alert_sigma), None, healthy[0])
    over = judge_run(low, dataclasses.replace(t, reference_scale_factor=1.01 * m / t.alert_sigma), None, healthy[0])
    assert reference_alerts(under) and not reference_alerts(over)
