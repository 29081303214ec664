"""judge(): detection runs once, on a copy; the report carries what each series
point was judged against; the monitors never touch torch's thread count."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ckptscan.detection.judge import judge
from ckptscan.detection.rules import Thresholds
from ckptscan.pipeline.metrics import compute
from ckptscan.pipeline.run import resolve_run
from ckptscan.document.plain import report_dict
from run_factory import write_run


@pytest.fixture(scope="module")
def metrics(tmp_path_factory):
    run = write_run(tmp_path_factory.mktemp("judge") / "run", count=16, collapse_layer=1, collapse_from=1000)
    return compute(resolve_run(run))


def test_judge_leaves_the_metrics_untouched_and_is_repeatable(metrics):
    before = [[dataclasses.asdict(layer) for layer in pair.layers] for pair in metrics.pairs]
    first = report_dict(judge(metrics, Thresholds()))
    second = report_dict(judge(metrics, Thresholds()))
    assert first == second
    assert [[dataclasses.asdict(layer) for layer in pair.layers] for pair in metrics.pairs] == before
    assert all(not layer.findings for pair in metrics.pairs for layer in pair.layers)


def test_each_judged_point_records_its_expectation_and_levels(metrics):
    report = judge(metrics, Thresholds())
    alert = next(f for p in report.pairs for f in p.layers[1].findings
                 if f.severity == "alert" and f.rule in ("trend", "level"))
    pair = next(p for p in report.pairs if alert in p.layers[1].findings)
    point = pair.layers[1].judgements[alert.monitor]
    assert point.state == "alert" and point.value == alert.value and point.rule == alert.rule
    assert point.expected == alert.baseline and point.alert_at == alert.threshold
    # A CUSUM alert records the statistic it reached and the calibrated level it crossed.
    cusum = next(f for p in report.pairs for f in p.layers[1].findings if f.severity == "alert" and f.rule == "cusum")
    at = next(p for p in report.pairs if cusum in p.layers[1].findings).layers[1].judgements[cusum.monitor]
    assert cusum.threshold == Thresholds().cusum_alert and at.cusum == cusum.score >= cusum.threshold
    # The alert level lies on the alarm side of the expectation, beyond the warn level.
    assert point.value <= point.alert_at < point.warn_at < point.expected
    healthy = report.pairs[-1].layers[0].judgements["delta2_entropy_norm"]
    assert healthy.state == "ok" and healthy.warn_at < healthy.expected


def test_thresholds_change_the_verdict_not_the_metrics(metrics):
    lax_thresholds = Thresholds(warn_sigma=50, alert_sigma=60, delta2_entropy_norm_floor=0.0, cusum_warn=500,
                                cusum_alert=600, pooled_cusum_warn=500, pooled_cusum_alert=600)
    strict, lax = judge(metrics, Thresholds()), judge(metrics, lax_thresholds)
    assert strict.summary.status == "alert" and lax.summary.status != "alert"
    assert [p.layers[1].attention for p in strict.pairs] == [p.layers[1].attention for p in lax.pairs]


def test_the_monitors_never_set_torch_threads():
    """Thread policy is decided once at the scan's edge (ScanOptions.threads):
    a process-wide change inside the math would serialise the layer workers."""
    monitors = Path(__file__).resolve().parents[2] / "ckptscan" / "monitors"
    for source in monitors.glob("*.py"):
        text = source.read_text()
        assert "set_num_threads" not in text and "Lock(" not in text, source


def test_a_run_without_pairs_is_not_judged_and_says_why(metrics):
    """A library caller may judge a run of one checkpoint (the CLI refuses it):
    the verdict says there was nothing to compare, never a StopIteration."""
    report = judge(dataclasses.replace(metrics, pairs=[]), Thresholds())
    assert report.summary.status == "not_judged"
    assert report.summary.not_judged_reason == "no pair of checkpoints to compare"
    assert report.summary.message.startswith("NOT JUDGED: none of the 0 pairs could be judged yet: no pair of checkpoints")
