"""A reference is one type from the request to the judge: `ReferenceRun`,
its report and where it came from. Every source a request names (a report
file, a run directory, a report object, a `ReferenceRun`) resolves to one;
the run spec holds them as they are; the older shapes (`RunSpec.reference`
and `.reference_path`, one report or lists; `load_reference`'s tuple;
`pipeline.request.Reference`) still work, and warn where they are given."""

import warnings

import pytest

import ckptscan.pipeline.request as request_module
from ckptscan.detection.reference import ReferenceRun
from ckptscan.pipeline.api import resolve_references, scan_run
from ckptscan.pipeline.request import ScanRequest
from ckptscan.pipeline.run import RunSpec, load_reference, reference_run, resolve_run
from ckptscan.document.writing import report_json, write_json

from run_factory import write_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("reference-run")
    judged, healthy = write_run(root / "judged", count=8, seed=1), write_run(root / "healthy", count=8, seed=2)
    saved = root / "healthy.json"
    write_json(scan_run(healthy, config=None), saved)
    return judged, healthy, saved


def test_every_source_resolves_to_a_reference_run(runs):
    judged, healthy, saved = runs
    given = ReferenceRun(scan_run(healthy, config=None), "named/by/caller")
    report = scan_run(healthy, config=None)
    resolved = resolve_references(ScanRequest(references=(saved, healthy, report, given), config=None))
    assert all(type(run) is ReferenceRun for run in resolved.references)
    assert [run.path for run in resolved.references] == [str(saved), str(healthy), None, "named/by/caller"]
    assert resolved.references[2].report is report and resolved.references[3] is given
    assert resolved.references[2].name == str(healthy)  # no file: named by the run its report was made of


def test_the_spec_holds_the_reference_runs_and_the_old_shapes_read_from_them(runs):
    judged, healthy, saved = runs
    one = resolve_references(ScanRequest(references=(saved,), config=None))
    spec = resolve_run(judged, one)
    assert spec.references == one.references and type(spec.references) is tuple
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # reading the old shape is not deprecated: `judge` takes it
        assert spec.reference is one.references[0].report and spec.reference_path == str(saved)
    band = resolve_references(ScanRequest(references=(saved, healthy), config=None))
    spec = resolve_run(judged, band)
    assert spec.reference == [run.report for run in band.references]
    assert spec.reference_path == [str(saved), str(healthy)]
    spec = resolve_run(judged, config=None)
    assert spec.references == () and spec.reference is None and spec.reference_path is None


def test_a_report_file_named_below_the_entry_points_is_read_into_a_reference_run(runs):
    judged, _, saved = runs
    spec = resolve_run(judged, ScanRequest(references=(str(saved),), config=None))
    (run,) = spec.references
    assert type(run) is ReferenceRun and run.path == str(saved) and run.report.pairs
    assert reference_run(run) is run


def test_the_old_shapes_given_to_a_run_spec_still_work_with_a_deprecation_warning(runs):
    _, _, saved = runs
    report = load_reference_quietly(saved)[0]
    with pytest.warns(DeprecationWarning, match="reference and reference_path .* are deprecated"):
        spec = RunSpec("run", "x", [], [], reference=report, reference_path=str(saved))
    assert spec.references == (ReferenceRun(report, str(saved)),)
    with pytest.warns(DeprecationWarning, match="give its references"):
        spec = RunSpec("run", "x", [], [], None, None, [report, report], ["a", None])  # positionally, as before
    assert spec.references == (ReferenceRun(report, "a"), ReferenceRun(report, None))
    with pytest.warns(DeprecationWarning, match="reference and reference_path"):
        spec.reference = report
    assert spec.references == (ReferenceRun(report, "a"),)  # its path kept
    with pytest.warns(DeprecationWarning, match="reference and reference_path"):
        spec.reference_path = "b"
    assert spec.references == (ReferenceRun(report, "b"),)


def load_reference_quietly(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return load_reference(path)


def test_load_reference_and_the_old_reference_name_warn_and_still_work(runs):
    _, _, saved = runs
    with pytest.warns(DeprecationWarning, match="load_reference is deprecated: reference_run"):
        report, path = load_reference(saved)
    assert path == str(saved) and report == reference_run(saved).report
    with pytest.warns(DeprecationWarning, match="pipeline.request.Reference is deprecated.*ReferenceRun"):
        old = request_module.Reference
    assert old is ReferenceRun  # the same class: old code's isinstance checks and constructions hold
    with pytest.raises(AttributeError):
        request_module.NoSuchName  # noqa: B018


def test_a_request_takes_a_reference_run_alone_or_among_others():
    run = ReferenceRun(None, "p")  # type: ignore[arg-type]  # the report is not looked at here
    assert ScanRequest.of(reference=run).references == (run,)
    assert ScanRequest.of(reference=[run, "b.json"]).references == (run, "b.json")


def test_a_run_judged_against_reference_runs_is_judged_as_against_their_names(runs):
    judged, healthy, saved = runs
    by_name = scan_run(judged, reference=[saved, healthy], config=None)
    resolved = resolve_references(ScanRequest(references=(saved, healthy), config=None)).references
    by_run = scan_run(judged, reference=list(resolved), config=None)
    assert report_json(by_run) == report_json(by_name)
    assert by_name.settings["reference_runs"] == [str(saved), str(healthy)]
