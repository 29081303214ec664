"""Judging pair by pair from a carried state gives the one-shot report."""

import dataclasses
import json

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from ckptscan.detection.judge import SeriesJudge, judge
from ckptscan.detection.rules import Thresholds
from ckptscan.detection.state import JudgeState
from ckptscan.errors import CkptScanError
from ckptscan.document.writing import report_json
from detection.helpers import random_metrics, run_report
from ckptscan.pipeline.metrics import Metrics


def prefix(metrics, count):
    return dataclasses.replace(metrics, pairs=metrics.pairs[:count])


def assert_same_report(got, want):
    """Field by field (repr: NaN equals NaN), then the JSON bytes."""
    assert len(got.pairs) == len(want.pairs)
    for index, (a, b) in enumerate(zip(got.pairs, want.pairs)):
        assert repr(a) == repr(b), f"pair {index} differs"
    for name in ("summary", "settings", "thresholds", "checkpoints", "skipped", "command", "probe"):
        assert repr(getattr(got, name)) == repr(getattr(want, name)), name
    assert report_json(got) == report_json(want)


def saved_and_restored(judging, thresholds, reference):
    """A new SeriesJudge going on from `judging`'s state, through JSON (as trend's cache and watch keep it)."""
    text = json.dumps(judging.state.to_dict(), allow_nan=True)
    resumed = SeriesJudge(thresholds, reference, "ref.json")
    state = JudgeState.from_dict(json.loads(text), judging.state.thresholds, judging.state.reference,
                                 resumed.basis(judging.state.thresholds))
    resumed.start(state, judging.judged)
    return resumed


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), resume=st.floats(0, 1))
@example(seed=1_560_428_662, resume=0.0)  # a log-judged threshold past exp's range: it overflowed
def test_judging_pair_by_pair_gives_the_one_shot_report_at_every_pair(seed, resume):
    """Random runs (NaN and infinite values, layers without attention or
    router, an extra layer in some pairs, unnamed checkpoints, a restart
    whose steps go back, a reference run), one pair at a time, the state
    saved as JSON and restored midway: every report is the one-shot judge's."""
    metrics, thresholds, reference = random_metrics(seed, max_pairs=16)
    judging = SeriesJudge(thresholds, reference, "ref.json")
    restart_at = max(2, int(resume * len(metrics.pairs)))
    for count in range(1, len(metrics.pairs) + 1):
        if count == restart_at:
            judging = saved_and_restored(judging, thresholds, reference)
        got = judging.report(prefix(metrics, count))
        assert_same_report(got, judge(prefix(metrics, count), thresholds, reference, reference_path="ref.json"))


def test_a_series_of_one_pair_is_its_warm_up_and_stays_so_as_it_grows():
    """A run's lone pair is its first, in the warm-up, which the floors leave alone (healthy runs dip
    toward them at the end of the LR ramp): not judged, before and after the run grows."""
    report = run_report(2, d2n=lambda i, n: 0.1)
    metrics = Metrics("run", report.model, [], report.pairs)
    judging = SeriesJudge()
    assert judging.report(prefix(metrics, 1)).pairs[0].status == "not_judged"
    grown = judging.report(metrics)
    assert grown.pairs[0].status == "not_judged" and grown.pairs[0].not_judged_reason == "warm-up (the first 2 pairs)"
    assert_same_report(judging.report(metrics), judge(metrics))


def test_a_changed_basis_judges_every_pair_again():
    """Thresholds (e.g. an LR warm-up end that moved as the loss log grew)
    change earlier verdicts: the state is dropped and the series judged anew."""
    report = run_report(12, d2n=lambda i, n: 0.55 if i < 8 else 0.3)
    metrics = Metrics("run", report.model, [], report.pairs)
    judging = SeriesJudge()
    judging.report(prefix(metrics, 10))
    judging.thresholds = Thresholds(warmup_steps=500)
    assert_same_report(judging.report(metrics), judge(metrics, Thresholds(warmup_steps=500)))


def test_a_saved_state_goes_on_only_under_the_same_thresholds_and_version():
    report = run_report(8)
    state = JudgeState(Thresholds())
    for pair in report.pairs:
        state.add(pair)
    data = json.loads(json.dumps(state.to_dict()))
    assert JudgeState.from_dict(data, Thresholds()).count == 8
    with pytest.raises(CkptScanError, match="other thresholds"):
        JudgeState.from_dict(data, Thresholds(warn_sigma=3.0))
    with pytest.raises(CkptScanError, match="version"):
        JudgeState.from_dict({**data, "version": 0}, Thresholds())


def test_the_state_does_not_grow_with_the_run():
    """What a pair costs is bounded by the state it reads: the same size after 60 pairs and after 400."""
    report = run_report(400, layers=3)
    state = JudgeState(Thresholds())
    sizes = {}
    for index, pair in enumerate(report.pairs, 1):
        state.add(pair)
        sizes[index] = len(json.dumps(state.to_dict()))
    assert sizes[400] <= sizes[60] * 1.05
