"""JUnit XML: valid against Ant's strict JUnit schema (what Jenkins, GitLab
and the GitHub test-report actions read), one case per layer × family, the
failing cases exactly those the JSON report's findings say, with the
finding's message; `--format junit` and `--junit FILE` give the same bytes."""

import copy
import datetime
import json
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
import xmlschema
from typer.testing import CliRunner

from ckptscan.cli import app
from ckptscan.document.plain import report_dict
from ckptscan.document.writing import write_json
from ckptscan.report.junit import junit_xml

runner = CliRunner()
SCHEMA = xmlschema.XMLSchema(Path(__file__).parent / "schemas" / "junit-ant.xsd")
RANK = {"info": 1, "warn": 2, "alert": 3}


def expected_cases(data, fail_on):
    """From the JSON report: {(layer, family): first failing finding (step, message) or None}."""
    cases = {}
    for pair in data["pairs"]:
        for layer in pair["layers"]:
            cases.setdefault((layer["layer"], "numeric"), None)
            for family in ("attention", "router"):
                if layer[family] is not None:
                    cases.setdefault((layer["layer"], family), None)
            for family in layer.get("families", {}):  # registered families with values (output: the last layer)
                cases.setdefault((layer["layer"], family), None)
    for pair in data["pairs"]:  # in step order: the first failing finding wins
        for layer in pair["layers"]:
            for f in sorted(layer["findings"], key=lambda f: -RANK[f["severity"]]):
                if RANK[f["severity"]] >= RANK[fail_on] and cases[(layer["layer"], f["family"])] is None:
                    cases[(layer["layer"], f["family"])] = (pair["to_step"], f["message"])
    return cases


def parsed_cases(document):
    root = ET.fromstring(document)
    (suite,) = root.findall("testsuite")
    cases = {}
    for case in suite.findall("testcase"):
        layer = int(case.get("classname").removeprefix("ckptscan.layer_"))
        failure = case.find("failure")
        cases[(layer, case.get("name"))] = None if failure is None else failure.get("message")
    return suite, cases


@pytest.mark.parametrize("name", ["loss", "healthy"])
@pytest.mark.parametrize("fail_on", ["alert", "warn"])
def test_valid_junit_with_one_case_per_layer_and_family_failing_as_the_report_says(reports, name, fail_on):
    report = reports[name]
    data = json.loads(json.dumps(report_dict(report)))
    document = junit_xml(report, fail_on)
    SCHEMA.validate(document)
    suite, cases = parsed_cases(document)
    expected = expected_cases(data, fail_on)
    assert set(cases) == set(expected)
    for key, first in expected.items():
        if first is None:
            assert cases[key] is None, key
        else:
            assert cases[key] == f"step {first[0]}: {first[1]}", key
    failing = sum(v is not None for v in expected.values())
    counts = (int(suite.get("tests")), int(suite.get("failures")), int(suite.get("errors")))
    assert counts == (len(expected), failing, 0)
    properties = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert properties["status"] == data["summary"]["status"]
    assert data["summary"]["message"] in suite.find("system-out").text


def test_the_collapse_fails_its_layer_attention_case_and_nothing_else(reports):
    _, cases = parsed_cases(junit_xml(reports["loss"]))
    assert [key for key, failure in cases.items() if failure is not None] == [(1, "attention")]


def test_control_characters_and_markup_in_messages_stay_valid_xml(reports):
    report = copy.deepcopy(reports["loss"])
    finding = next(f for p in report.pairs for layer in p.layers for f in layer.findings if f.severity == "alert")
    finding.message = 'tensor "a<b>&c" \x00\x1b[31m ]]> done'
    document = junit_xml(report, timestamp=datetime.datetime(2026, 1, 2, 3, 4, 5), hostname="ci")
    SCHEMA.validate(document)
    assert 'tensor "a<b>&c" \ufffd\ufffd[31m ]]> done' in document.replace("&lt;", "<").replace("&gt;", ">") \
        .replace("&amp;", "&").replace("&quot;", '"')
    assert 'timestamp="2026-01-02T03:04:05"' in document and 'hostname="ci"' in document


def test_the_schema_is_not_vacuous(reports):
    """The fixture rejects what Ant's schema rejects: a missing required attribute, a stray element."""
    document = junit_xml(reports["loss"])
    assert not SCHEMA.is_valid(document.replace(' hostname="', ' host="'))
    assert not SCHEMA.is_valid(document.replace("<system-err", "<bogus /><system-err"))


def test_format_junit_and_junit_file_are_the_same_bytes(runs, tmp_path):
    path = tmp_path / "out" / "junit.xml"
    path.parent.mkdir()  # ckptscan creates no folder for a report file
    result = runner.invoke(app, ["trend", str(runs["collapse"]), "--format", "junit", "--junit", str(path), "-q"])
    assert result.exit_code == 1, result.output
    assert result.stdout == path.read_text(encoding="utf-8")
    SCHEMA.validate(result.stdout)


def test_report_command_writes_junit_from_a_saved_report(reports, tmp_path):
    write_json(reports["loss"], tmp_path / "report.json")
    path = tmp_path / "junit.xml"
    result = runner.invoke(app, ["report", str(tmp_path / "report.json"), "--junit", str(path), "--fail-on", "warn"])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "report.json").read_text())
    _, cases = parsed_cases(path.read_text(encoding="utf-8"))
    assert {k for k, v in cases.items() if v} == {k for k, v in expected_cases(data, "warn").items() if v}


def test_report_command_names_the_config_whose_fail_on_it_uses(reports, tmp_path, monkeypatch):
    write_json(reports["loss"], tmp_path / "report.json")
    (tmp_path / ".git").mkdir()  # the search for a config stops at a repository root
    (tmp_path / "ckptscan.toml").write_text('fail_on = "warn"\n')
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["report", "report.json", "--junit", "j.xml"])
    assert result.exit_code == 0, result.output
    assert f"using config {tmp_path / 'ckptscan.toml'}\n" in result.stderr
    quiet = runner.invoke(app, ["report", "report.json", "--junit", "j.xml", "--quiet"])
    assert "using config" not in quiet.stderr


def test_bad_fail_on_is_one_line_and_exit_2(reports, tmp_path):
    write_json(reports["loss"], tmp_path / "report.json")
    result = runner.invoke(app, ["report", str(tmp_path / "report.json"), "--junit", str(tmp_path / "j.xml"),
                                 "--fail-on", "sometimes"])
    assert result.exit_code == 2
    assert "Invalid value for '--fail-on'" in result.stderr and not (tmp_path / "j.xml").exists()


@pytest.mark.parametrize("fail_on, fails", [("warn", True), ("not_judged", True), ("alert", False)])
def test_a_run_not_judged_fails_every_case_below_alert_with_the_reason(reports, fail_on, fails):
    from ckptscan.detection.judge import judge
    from ckptscan.pipeline.metrics import Metrics

    young = reports["healthy"]
    report = judge(Metrics("run", young.model, young.checkpoints[:3], young.pairs[:2]))
    document = junit_xml(report, fail_on)
    SCHEMA.validate(document)
    suite, cases = parsed_cases(document)
    expected = "not judged: warm-up (the first 2 pairs)" if fails else None
    assert set(cases.values()) == {expected}
    assert int(suite.get("failures")) == (len(cases) if fails else 0)
    assert "NOT_JUDGED: NOT JUDGED: none of the 2 pairs could be judged yet" in suite.find("system-out").text
