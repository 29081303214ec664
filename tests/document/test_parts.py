"""Schema 2: a long report's pairs in an append-only file beside it. It loads
as the same report as schema 1; a re-run of the same run appends only the
new pairs; a write cut short (a killed writer, a full disk) leaves the
report as it was; schema 1 files, indented or not, still load."""

import dataclasses
import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ckptscan import __version__, scan_run
from ckptscan.errors import CkptScanError
from ckptscan.live.report_file import ReportFile
from ckptscan.document import parts
from ckptscan.document.writing import report_json, write_json
from ckptscan.document.reading import as_json_values, load_report, read_json_file, report_from_dict
from ckptscan.document.plain import report_dict
from ckptscan.schema.results import Resume

FIXTURE = Path(__file__).parent / "fixtures" / "schema1-healthy.json"
PER_HEAD = "flagged+newest"


@pytest.fixture(scope="module")
def grown(runs, tmp_path_factory):
    """The collapse run scanned on all but its last two checkpoints, then
    again in the same directory once one more is there: a nightly re-run."""
    run, root = runs["collapse"], tmp_path_factory.mktemp("grown")
    checkpoints = sorted((p for p in run.iterdir() if p.name.startswith("checkpoint-")),
                         key=lambda p: int(p.name.split("-")[1]))
    growing = root / "run"
    growing.mkdir()
    for p in run.iterdir():
        if p not in checkpoints[-2:]:
            (growing / p.name).symlink_to(p)
    before = scan_run(growing)
    (growing / checkpoints[-2].name).symlink_to(checkpoints[-2])
    return before, scan_run(growing)


@pytest.fixture(autouse=True)
def every_report_is_long(monkeypatch):
    """The test runs are a few pairs of 3 layers: schema 2 from the first layer result."""
    monkeypatch.setattr(parts, "PARTS_LAYERS", 0)


def as_read(report, per_head=PER_HEAD):
    """The report as a schema-1 file of it reads back: the reference a schema-2 file must equal."""
    return report_from_dict(as_json_values(report_dict(report, per_head)))


def document(path):
    return json.loads(path.read_text())


def parts_file(path):
    return path.parent / document(path)["pairs"]["parts"]["file"]


@pytest.mark.parametrize("per_head", ["all", PER_HEAD])
def test_a_long_report_is_schema_2_and_loads_as_its_schema_1_file_does(reports, tmp_path, per_head):
    report = reports["loss"]
    write_json(report, tmp_path / "report.json", per_head)
    (tmp_path / "v1.json").write_text(report_json(report, per_head))
    assert load_report(tmp_path / "report.json") == load_report(tmp_path / "v1.json") == as_read(report, per_head)
    # What the file holds, read back: the dict of its schema-1 file, every key and value.
    assert document(tmp_path / "report.json")["schema_version"] == 2
    assert read_json_file(tmp_path / "report.json") == json.loads(report_json(report, per_head))


def test_the_document_holds_every_key_of_schema_1_and_the_pairs_as_documented(reports, tmp_path):
    report = reports["loss"]
    write_json(report, tmp_path / "report.json", PER_HEAD)
    doc = document(tmp_path / "report.json")
    assert list(doc) == list(json.loads(report_json(report, PER_HEAD)))  # the same keys, in order
    assert doc["schema_version"] == 2 and doc["summary"] == report_dict(report, PER_HEAD)["summary"]
    pairs = doc["pairs"]
    assert set(pairs) == {"count", "encoding", "fingerprint", "newest", "parts"}
    assert (pairs["count"], pairs["encoding"]) == (len(report.pairs), "columns-gzip")
    assert set(pairs["parts"]) == {"file", "bytes", "count", "chunks", "digest"}
    assert pairs["parts"]["file"].startswith("report.json.pairs-") and pairs["parts"]["count"] == len(report.pairs) - 1
    (count, size, _sha), = pairs["parts"]["chunks"]
    on_disk = parts_file(tmp_path / "report.json").stat().st_size
    assert (count, size) == (len(report.pairs) - 1, pairs["parts"]["bytes"]) == (count, on_disk)


def test_a_reader_of_schema_1_sees_version_2_and_no_list_of_pairs(reports, tmp_path):
    """What a script written for schema 1 sees; ckptscan before 2 refuses it
    ("newer than this ckptscan reads: upgrade ckptscan"), and the document
    without its pairs file is refused as one clear error."""
    write_json(reports["loss"], tmp_path / "report.json", PER_HEAD)
    doc = document(tmp_path / "report.json")
    assert doc["schema_version"] == 2 and isinstance(doc["pairs"], dict)
    with pytest.raises(CkptScanError, match="its pairs are not a list"):
        report_from_dict(doc)
    parts_file(tmp_path / "report.json").unlink()
    with pytest.raises(CkptScanError, match=r"report's pairs.*is missing"):
        load_report(tmp_path / "report.json")


def test_a_short_report_and_one_to_a_pipe_stay_schema_1(reports, tmp_path, monkeypatch):
    monkeypatch.setattr(parts, "PARTS_LAYERS", parts.layer_results(reports["loss"]))
    write_json(reports["loss"], tmp_path / "short.json", PER_HEAD)
    assert document(tmp_path / "short.json")["schema_version"] == 1 and os.listdir(tmp_path) == ["short.json"]
    monkeypatch.setattr(parts, "PARTS_LAYERS", 0)
    read, write = os.pipe()
    got = []
    reader = threading.Thread(target=lambda: got.append(os.fdopen(read, "rb").read()))
    reader.start()
    write_json(reports["loss"], f"/dev/fd/{write}", PER_HEAD)
    os.close(write)
    reader.join()
    assert json.loads(got[0])["schema_version"] == 1


def test_a_rerun_of_the_same_run_appends_only_its_new_pairs(grown, tmp_path):
    before, after = grown
    path = tmp_path / "report.json"
    write_json(before, path, PER_HEAD)
    file, old_bytes = parts_file(path), parts_file(path).read_bytes()
    write_json(after, path, PER_HEAD)
    assert parts_file(path) == file and file.read_bytes()[:len(old_bytes)] == old_bytes  # appended to
    chunks = document(path)["pairs"]["parts"]["chunks"]
    # The pair that was the newest, and none other: the new one is the document's newest.
    assert [c[0] for c in chunks] == [len(before.pairs) - 1, len(after.pairs) - len(before.pairs)]
    assert load_report(path) == as_read(after)
    # The same report written whole is the same report.
    write_json(after, tmp_path / "whole.json", PER_HEAD)
    assert len(document(tmp_path / "whole.json")["pairs"]["parts"]["chunks"]) == 1
    assert load_report(tmp_path / "whole.json") == load_report(path)
    # A re-run with no new checkpoint appends nothing.
    write_json(after, path, PER_HEAD)
    assert document(path)["pairs"]["parts"]["chunks"] == chunks and load_report(path) == as_read(after)


@pytest.mark.parametrize("per_head", ["all", PER_HEAD])
def test_the_fingerprint_is_what_earlier_versions_wrote_so_their_files_are_appended_to(reports, tmp_path, per_head):
    """The fingerprint as it was computed before the format had its own package
    (from a report stripped of pairs, checkpoints and skipped): a file that an
    earlier build of this version wrote is the same run, and is appended to."""
    report = reports["loss"]
    head = report_dict(dataclasses.replace(report, pairs=[], checkpoints=[], skipped=[]), per_head)
    same = {"tool": __version__, "encoding": parts.ENCODING, "command": report.command, "per_head": per_head,
            **{name: head[name] for name in ("model", "settings", "thresholds", "probe")}}
    write_json(report, tmp_path / "report.json", per_head)
    assert document(tmp_path / "report.json")["pairs"]["fingerprint"] == \
        hashlib.sha256(json.dumps(same, sort_keys=True, allow_nan=False).encode()).hexdigest()


def test_another_run_or_other_settings_write_new_parts_and_remove_the_old(grown, tmp_path):
    before, after = grown
    path = tmp_path / "report.json"
    write_json(before, path, PER_HEAD)
    first = parts_file(path)
    write_json(after, path, "all")  # another --per-head: another fingerprint
    assert parts_file(path) != first and not first.exists() and load_report(path) == as_read(after, "all")
    second = parts_file(path)
    changed = dataclasses.replace(after, thresholds={**after.thresholds, "made_up": 1.0})
    write_json(changed, path, "all")
    assert parts_file(path) != second and not second.exists()
    assert load_report(path) == as_read(changed, "all")


def test_old_pairs_judged_otherwise_are_written_again(grown, tmp_path):
    before, after = grown
    path = tmp_path / "report.json"
    write_json(before, path, PER_HEAD)
    rejudged = dataclasses.replace(after, pairs=[dataclasses.replace(after.pairs[0], status="warn"),
                                                 *after.pairs[1:]])
    write_json(rejudged, path, PER_HEAD)
    assert len(document(path)["pairs"]["parts"]["chunks"]) == 1
    assert load_report(path) == as_read(rejudged)


def test_a_full_disk_while_appending_leaves_the_report_as_it_was(grown, tmp_path, monkeypatch):
    before, after = grown
    path = tmp_path / "report.json"
    write_json(before, path, PER_HEAD)
    real_append = parts._append

    def half_then_full(file, committed, chunk):
        real_append(file, committed, chunk[:len(chunk) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(parts, "_append", half_then_full)
    with pytest.raises(CkptScanError, match="No space left on device"):
        write_json(after, path, PER_HEAD)
    assert parts_file(path).stat().st_size > document(path)["pairs"]["parts"]["bytes"]  # half a chunk past it
    assert load_report(path) == as_read(before)
    monkeypatch.setattr(parts, "_append", real_append)
    write_json(after, path, PER_HEAD)  # the half chunk is cut off, the new one appended
    assert load_report(path) == as_read(after)


def test_a_full_disk_at_the_document_leaves_the_report_as_it_was(grown, tmp_path, monkeypatch):
    before, after = grown
    path = tmp_path / "report.json"
    write_json(before, path, PER_HEAD)
    real = parts.write_atomic

    def full(target, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(parts, "write_atomic", full)
    with pytest.raises(CkptScanError, match="No space left on device"):
        write_json(after, path, PER_HEAD)
    assert load_report(path) == as_read(before)
    # A report written whole that fails the same way leaves no parts file of its own behind.
    with pytest.raises(CkptScanError, match="No space left on device"):
        write_json(after, path, "all")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([path.name, parts_file(path).name])
    monkeypatch.setattr(parts, "write_atomic", real)
    write_json(after, path, PER_HEAD)
    assert load_report(path) == as_read(after)


KILLED_WRITER = """
import sys, time
from pathlib import Path
from ckptscan.document import parts
from ckptscan.document.writing import write_json
from ckptscan.document.reading import load_report

path, grown_json, marker = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
parts.PARTS_LAYERS = 0
real_append = parts._append

def half_then_hang(file, committed, chunk):
    real_append(file, committed, chunk[:len(chunk) // 2])
    marker.write_text("half written")
    time.sleep(120)

parts._append = half_then_hang
write_json(load_report(grown_json), path, sys.argv[4])
"""


def test_a_writer_killed_mid_append_leaves_the_report_as_it_was(grown, tmp_path):
    before, after = grown
    path, grown_json, marker = tmp_path / "report.json", tmp_path / "after-v1.json", tmp_path / "marker"
    grown_json.write_text(report_json(after, "all"))
    # Both written from files, as a re-run's process reads them: the same objects either side.
    write_json(report_from_dict(as_json_values(report_dict(before, "all"))), path, PER_HEAD)
    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(path), str(grown_json), str(marker), PER_HEAD],
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), "the writer never reached its append"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert parts_file(path).stat().st_size > document(path)["pairs"]["parts"]["bytes"]
    assert load_report(path) == as_read(before)
    write_json(load_report(grown_json), path, PER_HEAD)
    assert len(document(path)["pairs"]["parts"]["chunks"]) == 2 and load_report(path) == as_read(after)


def test_parts_that_are_not_the_ones_named_are_one_clear_error(reports, tmp_path):
    path = tmp_path / "report.json"
    write_json(reports["loss"], path, PER_HEAD)
    file = parts_file(path)
    whole = file.read_bytes()
    file.write_bytes(whole[:-10])
    with pytest.raises(CkptScanError, match="cut short"):
        load_report(path)
    file.write_bytes(whole[:-1] + bytes([whole[-1] ^ 1]))
    with pytest.raises(CkptScanError, match="does not hold the pairs it names"):
        load_report(path)


def test_a_gz_path_compresses_the_document(reports, tmp_path):
    write_json(reports["loss"], tmp_path / "report.json.gz", PER_HEAD)
    assert (tmp_path / "report.json.gz").read_bytes()[:2] == b"\x1f\x8b"
    assert load_report(tmp_path / "report.json.gz") == as_read(reports["loss"])


def test_a_schema_1_file_still_loads_and_as_schema_2_loads_the_same(tmp_path):
    """A report as ckptscan 0.2 wrote it (committed): its values bit for bit
    as the file's text gives them, then the same report through schema 2."""
    text = FIXTURE.read_text()
    assert json.loads(text)["schema_version"] == 1
    loaded = load_report(FIXTURE)
    assert as_json_values(report_dict(loaded, PER_HEAD)) == json.loads(text)
    write_json(loaded, tmp_path / "report.json", PER_HEAD)
    assert document(tmp_path / "report.json")["schema_version"] == 2
    assert load_report(tmp_path / "report.json") == loaded



def test_a_summary_key_added_since_is_left_out_again_for_a_file_without_it_and_null_kept_where_written(tmp_path):
    """`summary.resume` (issue 51) is absent from a file written before it: absent says not computed, where
    null says no plan (no alert). Written again, such a report stays without it; one that has it keeps it."""
    old = json.loads(FIXTURE.read_text())
    assert "resume" not in old["summary"]
    assert "resume" not in report_dict(report_from_dict(old))["summary"]
    write_json(report_from_dict(old), tmp_path / "old.json", PER_HEAD)
    assert "resume" not in document(tmp_path / "old.json")["summary"]
    today = {**old, "summary": {**old["summary"], "resume": None}}
    assert report_dict(report_from_dict(today))["summary"]["resume"] is None
    planned = report_from_dict(old)
    planned.summary.resume = Resume(checkpoint=None, reason="no saved checkpoint before the departure holds")
    assert report_dict(planned)["summary"]["resume"]["reason"] == "no saved checkpoint before the departure holds"

def test_the_live_report_file_of_a_long_run_is_schema_2_and_appends_each_step(grown, tmp_path):
    before, after = grown
    live = ReportFile(tmp_path / "report.json", PER_HEAD)
    live.write(before)
    live.write(after)
    assert [c[0] for c in document(tmp_path / "report.json")["pairs"]["parts"]["chunks"]] == \
        [len(before.pairs) - 1, len(after.pairs) - len(before.pairs)]
    assert load_report(tmp_path / "report.json") == as_read(after)


def test_trend_json_of_a_growing_run_appends_and_ckptscan_report_reads_it(runs, tmp_path):
    """The CLI's own path: `trend RUN --json FILE` each night, then `ckptscan report FILE`."""
    from typer.testing import CliRunner

    from ckptscan.cli import app

    runner, source, run, path = CliRunner(), runs["collapse"], tmp_path / "run", tmp_path / "report.json"
    checkpoints = sorted(source.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    run.mkdir()
    for p in source.iterdir():
        if p not in checkpoints[-2:]:
            (run / p.name).symlink_to(p)

    def trend():
        result = runner.invoke(app, ["trend", str(run), "--json", str(path), "--cache-dir", str(tmp_path / "cache"),
                                     "--quiet"])
        assert result.exit_code in (0, 1), result.output

    trend()
    (run / checkpoints[-2].name).symlink_to(checkpoints[-2])  # the night's new checkpoint
    trend()
    assert [c[0] for c in document(path)["pairs"]["parts"]["chunks"]] == [len(checkpoints) - 4, 1]
    assert document(path)["pairs"]["count"] == len(checkpoints) - 2
    result = runner.invoke(app, ["report", str(path), "--html", str(tmp_path / "report.html")])
    assert result.exit_code in (0, 1), result.output
    assert (tmp_path / "report.html").stat().st_size > 0
