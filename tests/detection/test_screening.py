"""References are screened before they judge a run: one that alerts against
the other references (or, alone, on its own history) is left out, with a
note; healthy references are all kept; the screened report is judged as
against the kept references alone."""

import dataclasses
import json

import pytest

from ckptscan.detection.judge import judge
from ckptscan.detection.reference import reference_from_reports
from ckptscan.detection.rules import Thresholds, assess_report
from ckptscan.detection.screening import first_alert, screen_references
from ckptscan.pipeline.metrics import Metrics
from ckptscan.document.writing import report_json
from detection.helpers import MODEL, run_report


def faulty(seed, from_pair=0, layer=1):
    """Δ2 and ΔW entropies of one layer 0.25 low from pair `from_pair` (a fault from step 0 by default)."""
    low = lambda base: lambda i, n: base - (0.25 if n == layer and i >= from_pair else 0.0)  # noqa: E731
    return run_report(20, seed=seed, noise=0.01, d2n=low(0.55), dwq=low(0.8), dwk=low(0.8))


def healthy(seed):
    return run_report(20, seed=seed, noise=0.01)


def first_alert_by_the_rules(report, others, t):
    """What `first_alert` must give: the report judged by `assess_report`
    against the others' band (or alone), on a copy; its first alerting pair."""
    copy = dataclasses.replace(report, settings=dict(report.settings), pairs=[
        dataclasses.replace(p, layers=[dataclasses.replace(layer) for layer in p.layers]) for p in report.pairs])
    assess_report(copy, t, reference_from_reports(others, t.warmup_pairs, t.warmup_steps) if others else None)
    for pair in copy.pairs:
        found = [f for layer in pair.layers for f in layer.findings if f.severity == "alert"]
        if found:
            return pair.to_step, found[0].family
    return None


@pytest.mark.parametrize("seed", range(4))
def test_first_alert_is_the_rules_first_alert_and_leaves_the_report_unchanged(seed):
    t = Thresholds()
    runs = [healthy(10 * seed + k) for k in range(3)] + [faulty(10 * seed + 3, from_pair=seed * 3)]
    for i, report in enumerate(runs):
        others = [r for j, r in enumerate(runs) if j != i]
        before = report_json(report)
        assert first_alert(report, others, [None] * len(others), t) == first_alert_by_the_rules(report, others, t)
        assert report_json(report) == before
    assert first_alert(runs[3], runs[:3], [None] * 3, t) is not None  # the fault does alert


def test_healthy_references_are_all_kept_in_order():
    references = [healthy(seed) for seed in (1, 2, 3)]
    screened = screen_references(references, ["a", "b", "c"], Thresholds())
    assert screened.reports == references and screened.paths == ["a", "b", "c"]
    assert screened.left_out == [] and screened.notes == []


def test_a_faulty_reference_among_healthy_ones_is_left_out_with_a_note():
    references = [healthy(1), faulty(2), healthy(3)]
    screened = screen_references(references, ["a", "bad", None], Thresholds())
    assert screened.reports == [references[0], references[2]] and screened.paths == ["a", None]
    step, family = first_alert(references[1], [references[0], references[2]], ["a", None], Thresholds())
    assert family == "attention"
    assert screened.left_out == ["bad"]
    assert screened.notes == [f"reference bad is left out: it alerts against the band of the other references "
                              f"(attention, step {step}), so it is not a healthy run to judge against"]


def test_a_lone_reference_is_judged_on_its_own_history_and_none_is_used_when_all_alert():
    lone = faulty(2, from_pair=10)  # a fault its own history sees
    screened = screen_references([lone], ["bad.json"], Thresholds())
    assert screened.reports == [] and screened.left_out == ["bad.json"]
    assert "it alerts on its own history (attention" in screened.notes[0]
    assert screened.notes[1] == "every reference alerts: the run is judged against its own history only"
    run = faulty(5)
    metrics = Metrics("run", MODEL, [], run.pairs)
    against_it = judge(metrics, Thresholds(), lone, reference_path="bad.json")
    own = judge(metrics, Thresholds())
    assert json.loads(report_json(against_it))["pairs"] == json.loads(report_json(own))["pairs"]
    assert against_it.settings["reference_left_out"] == ["bad.json"] and "reference" not in against_it.settings


def test_the_screened_judgement_is_the_judgement_against_the_kept_references():
    references = [healthy(1), healthy(2), faulty(3), healthy(4)]
    run = faulty(5)
    metrics = Metrics("run", MODEL, [], run.pairs)
    screened = judge(metrics, Thresholds(), references, reference_path=["a", "b", "bad", "c"])
    kept = judge(metrics, Thresholds(), [references[i] for i in (0, 1, 3)], reference_path=["a", "b", "c"])
    assert screened.settings["reference_left_out"] == ["bad"]
    assert [repr(p) for p in screened.pairs] == [repr(p) for p in kept.pairs]
    assert repr(screened.summary) == repr(kept.summary)
    unscreened = judge(metrics, Thresholds(), references, reference_path=["a", "b", "bad", "c"], screen=False)
    assert "reference_left_out" not in unscreened.settings and len(unscreened.settings["reference_runs"]) == 4


def test_a_reference_is_judged_from_the_end_of_its_own_lr_warm_up():
    late = faulty(2, from_pair=10)
    t = Thresholds()
    assert first_alert(late, [], [], t) is not None
    late.settings["lr_warmup_end_step"] = 10_000  # beyond its last pair: nothing is judged but numerics
    assert first_alert(late, [], [], t) is None
