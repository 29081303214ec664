"""`ScanRequest`: one value says what to scan and how to judge it. Its
fields are the keywords the library has always taken, so a request and the
same keywords resolve the same spec; a reference is resolved once, up front
(a run scanned once however often it is named, a report file read), and a
run left unresolved below the entry points is an error, not a call back up."""

import warnings

import pytest

from ckptscan.pipeline.api import reference_scanner, resolve_references, scan, scan_run
from ckptscan.errors import CkptScanError
from ckptscan.document.writing import write_json
from ckptscan.detection.reference import ReferenceRun
from ckptscan.pipeline.request import AUTO, ScanRequest, reference_sources
from ckptscan.pipeline.run import resolve_run
from ckptscan.scan import ScanOptions

from run_factory import write_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("request")
    return write_run(root / "judged", count=8, seed=1), write_run(root / "healthy", count=8, seed=2)


def test_the_defaults_are_the_cli_defaults():
    request = ScanRequest()
    assert (request.stride, request.base, request.probe, request.loss_log, request.config) == \
        (1, "previous", AUTO, AUTO, AUTO)
    assert request.references == () and request.settings == () and request.options == ScanOptions()


def test_of_takes_one_reference_or_several_and_any_sequence_of_settings():
    assert ScanRequest.of(reference="a.json").references == ("a.json",)
    assert ScanRequest.of(reference=["a/", "b/"], settings=["k=1"]).references == ("a/", "b/")
    assert ScanRequest.of(settings=["k=1"]).settings == ("k=1",)
    assert reference_sources(None) == ()


def test_a_request_and_its_fields_as_keywords_resolve_the_same_spec(runs):
    judged, _ = runs
    by_request = resolve_run(judged, ScanRequest(stride=2, base="first", loss_log=None, config=None))
    by_keywords = resolve_run(judged, stride=2, base="first", loss_log=None, config=None)
    assert by_request.pairs == by_keywords.pairs == [(0, 2), (0, 4), (0, 6)]
    assert by_request.pairing == by_keywords.pairing
    with pytest.raises(TypeError, match="not both: stride"):
        resolve_run(judged, ScanRequest(), stride=2)


def test_a_reference_run_is_scanned_once_up_front_however_often_it_is_named(runs):
    judged, healthy = runs
    request = resolve_references(ScanRequest(references=(healthy, str(healthy)), config=None))
    first, second = request.references
    assert isinstance(first, ReferenceRun) and first is second and first.path == str(healthy)
    # The reference's report is the one `scan_run` of it gives, judged alone.
    alone = scan_run(healthy, config=None)
    assert [p.status for p in first.report.pairs] == [p.status for p in alone.pairs]
    spec = resolve_run(judged, request)
    assert spec.reference_path == [str(healthy), str(healthy)]


def test_a_report_file_is_read_up_front_and_judges_as_the_run_it_came_from(runs, tmp_path):
    judged, healthy = runs
    write_json(scan_run(healthy, config=None), tmp_path / "healthy.json")
    from_file = resolve_references(ScanRequest(references=(tmp_path / "healthy.json",), config=None))
    from_run = resolve_references(ScanRequest(references=(healthy,), config=None))
    a = scan(resolve_run(judged, from_file), from_file)
    b = scan(resolve_run(judged, from_run), from_run)
    assert [(p.status, [layer.status for layer in p.layers]) for p in a.pairs] == \
        [(p.status, [layer.status for layer in p.layers]) for p in b.pairs]


def test_an_unresolved_reference_run_is_an_error_not_a_scan(runs):
    judged, healthy = runs
    with pytest.raises(CkptScanError, match="is a run: a reference run is scanned before the spec is made"):
        resolve_run(judged, ScanRequest(references=(healthy,), config=None))


def test_the_old_scan_reference_callback_still_works_with_a_deprecation_warning(runs):
    judged, healthy = runs
    scanned = []

    def scan_reference(run_dir):
        scanned.append(run_dir)
        return scan_run(run_dir, config=None)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spec = resolve_run(judged, reference=healthy, config=None, scan_reference=scan_reference)
    assert scanned == [str(healthy)] and spec.reference_path == str(healthy)
    assert any(issubclass(w.category, DeprecationWarning) and "scan_reference" in str(w.message) for w in caught)


def test_the_old_reference_scanner_warns_at_its_caller_and_still_scans_the_reference(runs):
    """`reference_scanner` (deprecated for `resolve_references`): a DeprecationWarning naming what replaces it,
    raised at the line that called it, and the callback it returns still gives the reference run's report."""
    _, healthy = runs
    with pytest.warns(DeprecationWarning, match=r"reference_scanner is deprecated.*resolve_references") as caught:
        scan_reference = reference_scanner(config=None)
    assert [w.filename for w in caught if issubclass(w.category, DeprecationWarning)] == [__file__]
    report = scan_reference(str(healthy))
    alone = scan_run(healthy, config=None)
    assert [(p.from_step, p.to_step, p.status) for p in report.pairs] == \
        [(p.from_step, p.to_step, p.status) for p in alone.pairs]
