"""The layer-band and run-band rules: a layer's attention update monitors
judged together against a band of references, and the mean of that over the
layers (detection/layer_band.py)."""

import math
import random

import numpy as np
import pytest

from ckptscan.detection.judge import judge
from ckptscan.detection.layer_band import layer_band
from ckptscan.detection.thresholds import Thresholds
from ckptscan.pipeline.metrics import Metrics
from detection.helpers import MODEL, run_report
from detection.test_reference import brute_force_band


def shifted_run(seed, shift, layer=1, pairs=20):
    """A run whose attention update monitors in `layer` all sit `shift` below
    the healthy level from the first pair (each by the same amount)."""
    low = lambda base: lambda i, n: base - (shift if n == layer else 0.0)  # noqa: E731
    return run_report(pairs, seed=seed, noise=0.01, d2n=low(0.55), dwq=low(0.8), dwk=low(0.8))


def layer_band_findings(report, rule="layer_band"):
    return {(p.to_step, layer.layer): f for p in report.pairs for layer in p.layers for f in layer.findings
            if f.rule == rule}


def brute_force_means(run, references, layer):
    """Per pair, the mean departure of the layer's `layer_band` monitors from
    the band of `references` (band sigmas, factor 1), in float64 numpy."""
    means = []
    for index, pair in enumerate(run.pairs):
        departures = []
        for monitor in layer_band():
            series = [([float(p.to_step) for p in r.pairs], [monitor.read(p.layers[layer]) for p in r.pairs])
                      for r in references]
            center, scale = brute_force_band(series, float(pair.to_step), 5, monitor.spec.min_scale, 1.0)
            y = monitor.read(pair.layers[layer])
            assert monitor.spec.bad == "low" and not monitor.spec.log
            departures.append((center - y) / scale)
        means.append(float(np.mean(departures)))
    return means


@pytest.mark.parametrize("seed", range(8))
def test_the_statistic_is_the_mean_band_departure_on_two_pairs_in_a_row(seed):
    """Every layer-band finding's score is the smaller of two consecutive
    pairs' mean departures, as the float64 brute force computes them, and a
    finding is raised exactly where that reaches layer_band_warn."""
    rng = random.Random(seed)
    references = [run_report(20, seed=100 * seed + k, noise=0.01) for k in range(3)]
    run = shifted_run(100 * seed + 7, shift=rng.uniform(0.0, 0.03))
    t = Thresholds(layer_band_warn=1.5, layer_band_alert=2.5)
    found = layer_band_findings(judge(Metrics("run", MODEL, [], run.pairs), t, references))
    for layer in range(2):
        means = brute_force_means(run, references, layer)
        for index in range(1, len(means)):
            both = min(means[index], means[index - 1])
            finding = found.get((run.pairs[index].to_step, layer))
            if both >= t.layer_band_warn:
                assert finding is not None and finding.score == pytest.approx(both, rel=1e-9, abs=1e-12)
                assert finding.severity == ("alert" if both >= t.layer_band_alert else "warn")
                assert finding.onset_step == run.pairs[index - 1].to_step
            else:
                assert finding is None


def test_a_layer_whose_monitors_all_depart_a_little_alerts_before_any_one_monitor_does():
    """Each monitor alone stays under its band alert (4.2 band σ at the
    default factor, on two pairs in a row) for the first pairs; their mean
    reaches layer_band_alert on the second and third pair (judged from the
    first: a band judges the warm-up): the layer alerts at step 300, on the
    faulty layer only, before any single monitor. (The run-band rule is set
    aside: in a model of two layers, one layer's fault moves it by half.)"""
    references = [run_report(20, seed=s, noise=0.01) for s in (1, 2, 3)]
    run = shifted_run(4, shift=0.06)
    report = judge(Metrics("run", MODEL, [], run.pairs), Thresholds(run_band_warn=50, run_band_alert=50), references)
    band_alerts = sorted((step, layer) for (step, layer), f in layer_band_findings(report).items()
                         if f.severity == "alert")
    assert band_alerts[0] == (300, 1) and {layer for _, layer in band_alerts} == {1}
    per_monitor = [p.to_step for p in report.pairs for layer in p.layers for f in layer.findings
                   if f.severity == "alert" and f.rule != "layer_band"]
    assert min(per_monitor, default=math.inf) > 300
    assert report.summary.first_alert_step["attention"] == 300


def test_one_reference_never_makes_a_layer_band_finding():
    run = shifted_run(4, shift=0.2)
    report = judge(Metrics("run", MODEL, [], run.pairs), Thresholds(), run_report(20, seed=1, noise=0.01))
    assert layer_band_findings(report) == {}
    assert math.isfinite(Thresholds().layer_band_alert)


def every_layer_shifted(seed, shifts, pairs=20, layers=4):
    """A run whose attention update monitors in layer n sit `shifts[n]` below the healthy level."""
    low = lambda base: lambda i, n: base - shifts[n]  # noqa: E731
    return run_report(pairs, layers=layers, seed=seed, noise=0.01, d2n=low(0.55), dwq=low(0.8), dwk=low(0.8))


@pytest.mark.parametrize("seed", range(8))
def test_the_run_statistic_is_the_mean_over_layers_of_the_layer_means_two_pairs_in_a_row(seed):
    """Every run-band finding's score is the smaller of two consecutive
    pairs' means over the layers of each layer's mean band departure (the
    float64 brute force); a finding is raised exactly where that reaches
    run_band_warn, on the layer whose own mean is largest."""
    rng = random.Random(seed)
    references = [run_report(20, layers=4, seed=100 * seed + k, noise=0.01) for k in range(3)]
    run = every_layer_shifted(100 * seed + 7, [rng.uniform(-0.005, 0.02) for _ in range(4)])
    t = Thresholds(run_band_warn=0.4, run_band_alert=1.2, layer_band_warn=50, layer_band_alert=50)
    found = layer_band_findings(judge(Metrics("run", MODEL, [], run.pairs), t, references), "run_band")
    per_layer = np.array([brute_force_means(run, references, layer) for layer in range(4)])
    means = per_layer.mean(axis=0)
    raised = 0
    for index in range(1, len(means)):
        both = min(means[index], means[index - 1])
        here = {layer: f for (step, layer), f in found.items() if step == run.pairs[index].to_step}
        if both >= t.run_band_warn:
            assert list(here) == [int(np.argmax(per_layer[:, index]))]
            finding = here[int(np.argmax(per_layer[:, index]))]
            assert finding.score == pytest.approx(both, rel=1e-9, abs=1e-12)
            assert finding.severity == ("alert" if both >= t.run_band_alert else "warn")
            assert finding.onset_step == run.pairs[index - 1].to_step
            raised += 1
        else:
            assert here == {}
    assert len(found) == raised


def test_a_fault_in_every_layer_alerts_through_the_run_before_any_layer():
    """Every layer 0.03 low: each layer's mean stays under layer_band_alert
    and each monitor under its band alert, while the mean over the four
    layers, steadier, passes run_band_alert from the first pairs."""
    references = [run_report(20, layers=4, seed=s, noise=0.01) for s in (1, 2, 3)]
    run = every_layer_shifted(4, [0.03] * 4)
    report = judge(Metrics("run", MODEL, [], run.pairs), Thresholds(), references)
    first_run_band = min(step for (step, _), f in layer_band_findings(report, "run_band").items()
                         if f.severity == "alert")
    others = [p.to_step for p in report.pairs for layer in p.layers for f in layer.findings
              if f.severity == "alert" and f.rule != "run_band"]
    assert first_run_band < min(others, default=math.inf)
    assert report.summary.first_alert_step["attention"] == first_run_band


def test_healthy_layers_straying_either_way_do_not_add_up():
    """Layers as far from the band as a healthy run's, half above and half
    below: the mean over them stays near 0 and the run never warns."""
    references = [run_report(20, layers=4, seed=s, noise=0.01) for s in (1, 2, 3)]
    run = every_layer_shifted(4, [0.02, -0.02, 0.02, -0.02])
    report = judge(Metrics("run", MODEL, [], run.pairs), Thresholds(), references)
    assert layer_band_findings(report, "run_band") == {}


def test_one_reference_never_makes_a_run_band_finding():
    run = every_layer_shifted(4, [0.1] * 4)
    report = judge(Metrics("run", MODEL, [], run.pairs), Thresholds(), run_report(20, layers=4, seed=1))
    assert layer_band_findings(report, "run_band") == {}
