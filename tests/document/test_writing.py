"""The JSON report of a long run stays loadable: written without indentation
past COMPACT_RESULTS, gzip-compressed when its path ends in .gz; every form
loads back as the same report. `ckptscan.write_json` is the public name."""

import dataclasses
import gzip
import json

import pytest

import ckptscan
from ckptscan.document import writing
from ckptscan.document.reading import load_report
from ckptscan.document.writing import report_json, write_json
from ckptscan.errors import CkptScanError
from ckptscan.live.report_file import ReportFile

from document.test_plain import asdict_then_walk


def test_write_json_is_public_from_the_package():
    assert ckptscan.write_json is write_json and "write_json" in ckptscan.__all__


def test_a_long_report_is_written_without_indentation_and_loads_back_the_same(reports, monkeypatch, tmp_path):
    report = reports["loss"]
    indented = report_json(report)
    monkeypatch.setattr(writing, "COMPACT_RESULTS", 10)
    compact = report_json(report)
    assert "\n" not in compact.rstrip("\n") and len(compact) < 0.7 * len(indented)
    assert json.loads(compact) == json.loads(indented)
    write_json(report, tmp_path / "long.json")
    assert dataclasses.asdict(load_report(tmp_path / "long.json")) == \
        dataclasses.asdict(load_report_of(indented, tmp_path / "short.json"))


def load_report_of(text, path):
    path.write_text(text)
    return load_report(path)


def test_a_gz_path_is_written_gzip_compressed_and_loads_back_the_same(reports, tmp_path):
    report = reports["loss"]
    write_json(report, tmp_path / "report.json.gz")
    write_json(report, tmp_path / "report.json")
    packed = (tmp_path / "report.json.gz").read_bytes()
    assert gzip.decompress(packed).decode() == (tmp_path / "report.json").read_text()
    assert len(packed) < (tmp_path / "report.json").stat().st_size / 4
    assert dataclasses.asdict(load_report(tmp_path / "report.json.gz")) == \
        dataclasses.asdict(load_report(tmp_path / "report.json"))


def test_a_cut_gz_report_is_one_clear_error(reports, tmp_path):
    write_json(reports["loss"], tmp_path / "report.json.gz")
    (tmp_path / "cut.json.gz").write_bytes((tmp_path / "report.json.gz").read_bytes()[:200])
    with pytest.raises(CkptScanError, match="not valid JSON"):
        load_report(tmp_path / "cut.json.gz")


def test_the_live_report_file_follows_the_compact_layout(reports, monkeypatch, tmp_path):
    report = reports["loss"]
    file = ReportFile(tmp_path / "live.json")
    assert file.text(report) == report_json(report)
    monkeypatch.setattr(writing, "COMPACT_RESULTS", 10)
    assert file.text(report) == report_json(report) and "\n" not in file.text(report).rstrip("\n")


def test_only_the_heads_written_count_towards_the_compact_layout(reports, monkeypatch):
    report = reports["loss"]
    layers = sum(len(pair.layers) for pair in report.pairs)
    newest_heads = sum(len(layer.attention.heads) for layer in report.pairs[-1].layers)
    monkeypatch.setattr(writing, "COMPACT_RESULTS", layers + newest_heads)
    assert "\n  " in report_json(report, "newest")  # exactly at the limit: indented
    assert "\n" not in report_json(report, "all").rstrip("\n")


@pytest.mark.parametrize("per_head", ["all", "flagged+newest"])
def test_a_report_written_indented_before_loads_as_the_compact_one(reports, monkeypatch, tmp_path, per_head):
    """A file as ckptscan wrote it before (asdict, indented) and one written
    now (compact) load as the same ScanReport, field by field."""
    report = reports["loss"]
    (tmp_path / "before.json").write_text(json.dumps(asdict_then_walk(report, per_head), indent=2) + "\n")
    monkeypatch.setattr(writing, "COMPACT_RESULTS", 10)
    write_json(report, tmp_path / "now.json", per_head)
    assert "\n" not in (tmp_path / "now.json").read_text().rstrip("\n")
    assert load_report(tmp_path / "before.json") == load_report(tmp_path / "now.json")
