"""`ReferenceRun` (a reference's report and where it came from) and the
judge's `Expectations` of them: `expectations(runs)` is what
`reference_from_reports(reports, paths)`, the older two-list shape, gives,
and the older shapes convert to reference runs one to one."""

import pytest

import ckptscan.detection.reference as reference
from ckptscan.detection.reference import (
    Expectations,
    ReferenceRun,
    expectations,
    reference_from_report,
    reference_from_reports,
    reference_runs,
)
from ckptscan.errors import CkptScanError
from detection.helpers import run_report


def members(expected):
    return [(m.path, m.steps, m.all_steps, m.interval, m.lrs, m.layers, m.all_layers) for m in expected.members]


def test_the_expectations_of_runs_are_those_of_their_reports_and_paths():
    a, b = run_report(12, seed=1), run_report(10, interval=200, seed=2)
    b.settings["run"] = "runs/b"
    runs = [ReferenceRun(a, "a.json"), ReferenceRun(b)]
    expected = expectations(runs, 2, 0)
    old = reference_from_reports([a, b], 2, 0, ["a.json", None])
    assert type(expected) is Expectations and expected.path == old.path == "a.json, runs/b"
    assert expected.model == old.model and members(expected) == members(old)
    assert [m.path for m in expected.members] == [run.name for run in runs]
    alone = reference_from_report(a, 3, 0, "a.json")
    assert members(alone) == members(expectations([ReferenceRun(a, "a.json")], 3, 0))
    # The warm-up is the thresholds': it moves the pairs a member is known by.
    assert members(expectations(runs, 5, 0)) != members(expected)


def test_a_run_without_a_path_or_a_run_setting_is_the_reference_report():
    assert ReferenceRun(run_report(3)).name == "the reference report"
    assert ReferenceRun(run_report(3), "").name == "the reference report"


def test_no_reference_run_is_an_error():
    with pytest.raises(CkptScanError, match="no reference report given"):
        expectations([], 2, 0)


def test_the_older_shapes_convert_to_reference_runs_one_to_one():
    a, b = run_report(3, seed=1), run_report(3, seed=2)
    assert reference_runs(None) == ()
    assert reference_runs(a, "a.json") == (ReferenceRun(a, "a.json"),)
    assert reference_runs(a) == (ReferenceRun(a, None),)
    assert reference_runs([a, b], ["a.json", None]) == (ReferenceRun(a, "a.json"), ReferenceRun(b, None))
    assert reference_runs([a, b], ["a.json"]) == (ReferenceRun(a, "a.json"), ReferenceRun(b, None))
    assert reference_runs([a, b], "a.json") == (ReferenceRun(a, "a.json"), ReferenceRun(b, None))


def test_a_reference_run_is_frozen():
    run = ReferenceRun(run_report(3), "a.json")
    with pytest.raises(AttributeError):
        run.path = "b.json"  # type: ignore[misc]


def test_the_expectations_old_name_is_the_same_class_with_a_deprecation_warning():
    with pytest.warns(DeprecationWarning, match="detection.reference.Reference is deprecated: it is Expectations"):
        assert reference.Reference is Expectations
    with pytest.raises(AttributeError):
        reference.NoSuchName  # noqa: B018
