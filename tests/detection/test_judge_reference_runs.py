"""The judge is given the references as `ReferenceRun`s (a run spec's
`references`), and judges exactly as with the older shape (a report or
several, with `reference_path`): same report, same basis; both shapes at
once is a TypeError."""

import pytest

from ckptscan.detection.judge import SeriesJudge, judge, reference_identity
from ckptscan.detection.reference import ReferenceRun
from ckptscan.document.writing import report_json
from detection.helpers import random_metrics


def with_reference(seeds):
    for seed in seeds:
        metrics, thresholds, reference = random_metrics(seed, max_pairs=12)
        if reference is not None:
            return metrics, thresholds, reference
    raise AssertionError("no random run with a reference among these seeds")


@pytest.mark.parametrize("seed", range(0, 32, 8))
def test_reference_runs_judge_as_the_reports_and_paths_they_hold(seed):
    metrics, thresholds, reference = with_reference(range(seed, seed + 8))
    runs = (ReferenceRun(reference, "healthy.json"),)
    assert report_json(judge(metrics, thresholds, runs)) == \
        report_json(judge(metrics, thresholds, reference, reference_path="healthy.json"))
    band = (ReferenceRun(reference, "a.json"), ReferenceRun(reference, None))
    assert report_json(judge(metrics, thresholds, band)) == \
        report_json(judge(metrics, thresholds, [reference, reference], reference_path=["a.json", None]))
    assert reference_identity(band) == reference_identity([reference, reference], ["a.json", None])
    assert reference_identity(runs) == reference_identity(reference, "healthy.json")


def test_the_judge_reads_the_older_shape_from_its_reference_runs():
    _, thresholds, reference = with_reference(range(40))
    one = SeriesJudge(thresholds, (ReferenceRun(reference, "a.json"),))
    assert one.reference is reference and one.reference_path == "a.json"
    band = SeriesJudge(thresholds, [reference, reference], ["a.json"])
    assert band.references == (ReferenceRun(reference, "a.json"), ReferenceRun(reference, None))
    assert band.reference == [reference, reference] and band.reference_path == ["a.json", None]
    assert SeriesJudge(thresholds).references == () and SeriesJudge(thresholds).reference is None


def test_reference_runs_with_paths_beside_them_are_refused():
    _, thresholds, reference = with_reference(range(40))
    with pytest.raises(TypeError, match="as ReferenceRun objects, or as reports"):
        SeriesJudge(thresholds, (ReferenceRun(reference, "a.json"),), "a.json")
    with pytest.raises(TypeError, match="as ReferenceRun objects, or as reports"):
        SeriesJudge(thresholds, [ReferenceRun(reference, "a.json"), reference])
