"""The JSON report of a long run stays loadable: written without indentation
past COMPACT_RESULTS, gzip-compressed when its path ends in .gz, per-head
results limited on request; every form loads back as the same report."""

import dataclasses
import gzip
import json

import pytest

from ckptscan.errors import CkptScanError
from ckptscan.live.report_file import ReportFile
from ckptscan.report import json as report_json_module
from ckptscan.report.json import report_dict, report_json, write_json
from ckptscan.report.load import load_report


def heads(data):
    """(pair index, layer) of every layer whose per-head results the JSON holds."""
    return [(i, layer["layer"]) for i, pair in enumerate(data["pairs"]) for layer in pair["layers"]
            if layer["attention"] and layer["attention"]["heads"]]


def test_a_long_report_is_written_without_indentation_and_loads_back_the_same(reports, monkeypatch, tmp_path):
    report = reports["loss"]
    indented = report_json(report)
    monkeypatch.setattr(report_json_module, "COMPACT_RESULTS", 10)
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


def test_per_head_results_are_kept_for_all_layers_unless_limited(reports):
    report = reports["loss"]
    everything = report_dict(report)
    assert report_dict(report, "all") == everything and "per_head" not in everything["settings"]
    assert len(heads(everything)) == sum(len(pair.layers) for pair in report.pairs)

    flagged = report_dict(report, "flagged")
    assert heads(flagged) == [(i, layer.layer) for i, pair in enumerate(report.pairs) for layer in pair.layers
                              if layer.status in ("warn", "alert")]
    assert heads(flagged) and flagged["settings"]["per_head"] == "flagged"

    newest = report_dict(report, "newest")
    assert heads(newest) == [(len(report.pairs) - 1, layer.layer) for layer in report.pairs[-1].layers]
    # Nothing else changes: the same keys, the other values equal.
    for limited in (flagged, newest):
        del limited["settings"]["per_head"]
        for pair, full in zip(limited["pairs"], everything["pairs"]):
            for layer, whole in zip(pair["layers"], full["layers"]):
                layer["attention"]["heads"] = whole["attention"]["heads"]
        assert limited == everything
    with pytest.raises(CkptScanError, match="--per-head"):
        report_dict(report, "some")


def test_the_live_report_file_follows_the_compact_layout(reports, monkeypatch, tmp_path):
    report = reports["loss"]
    file = ReportFile(tmp_path / "live.json")
    assert file.text(report) == report_json(report)
    monkeypatch.setattr(report_json_module, "COMPACT_RESULTS", 10)
    assert file.text(report) == report_json(report) and "\n" not in file.text(report).rstrip("\n")
