"""GitHub workflow annotations: printed on stderr only when GITHUB_ACTIONS=true,
the verdict first, then one per (layer, family) at warn or above, errors at
the gate level; the runner's escaping round-trips any message and path."""

import copy
import json
import re

from typer.testing import CliRunner

from ckptscan.cli import app
from ckptscan.report.annotations import github_annotations
from ckptscan.document.plain import report_dict

runner = CliRunner()
COMMAND = re.compile(r"^::(error|warning) ([^:]*)::(.*)$")
RANK = {"info": 1, "warn": 2, "alert": 3}


def unescape(text):
    """The runner's unescaping (actions/runner ActionCommand.cs), the inverse of toolkit's escaping."""
    for escaped, plain in (("%0D", "\r"), ("%0A", "\n"), ("%3A", ":"), ("%2C", ","), ("%25", "%")):
        text = text.replace(escaped, plain)
    return text


def parse(line):
    kind, props, message = COMMAND.match(line).groups()
    properties = dict(item.split("=", 1) for item in props.split(","))
    return kind, {k: unescape(v) for k, v in properties.items()}, unescape(message)


def first_findings(data):
    """From the JSON report: per (layer, family), its first finding at its worst warn/alert severity."""
    firsts = {}
    for pair in data["pairs"]:
        for layer in pair["layers"]:
            for f in layer["findings"]:
                key, rank = (layer["layer"], f["family"]), RANK[f["severity"]]
                if rank >= 2 and (key not in firsts or rank > RANK[firsts[key][1]["severity"]]):
                    firsts[key] = (pair, f)
    return firsts


def test_verdict_then_one_annotation_per_flagged_layer_and_family(reports):
    report = reports["loss"]
    data = json.loads(json.dumps(report_dict(report)))
    lines = github_annotations(report, "alert")
    kind, props, message = parse(lines[0])
    assert kind == "error" and props["title"] == "ckptscan trend: ALERT" and message == data["summary"]["message"]
    firsts = first_findings(data)
    assert len(lines) == 1 + len(firsts) and firsts
    seen = set()
    for line in lines[1:]:
        kind, props, message = parse(line)
        layer, family = re.match(r"ckptscan: layer (\d+) (\w+) ", props["title"]).groups()
        pair, f = firsts[(int(layer), family)]
        seen.add((int(layer), family))
        assert kind == ("error" if f["severity"] == "alert" else "warning")
        assert props["file"] == pair["to_path"]
        assert props["title"] == f"ckptscan: layer {layer} {family} {f['severity']} at step {pair['to_step']}"
        assert message == f"{f['message']} ({f['monitor']})"
    assert seen == set(firsts)
    kinds = [parse(line)[0] for line in lines[1:]]
    assert kinds == sorted(kinds)  # errors before warnings: GitHub keeps only 10 of each


def test_warn_gate_makes_warnings_errors_and_a_healthy_run_is_silent(reports):
    assert all(line.startswith("::error ") for line in github_annotations(reports["loss"], "warn"))
    assert github_annotations(reports["healthy"], "alert") == []


def test_escaping_round_trips_percent_newlines_colons_and_commas(reports):
    report = copy.deepcopy(reports["loss"])
    pair = next(p for p in report.pairs if any(f.severity == "alert" for layer in p.layers for f in layer.findings))
    pair.to_path = "gs://bucket/run,1/ckpt:100%"
    finding = next(f for layer in pair.layers for f in layer.findings if f.severity == "alert")
    finding.message = "50% of heads\ncollapsed:: see, here\r"
    lines = github_annotations(report, "alert")
    assert all("\n" not in line and "\r" not in line for line in lines)
    parsed = [parse(line) for line in lines]
    assert any(props.get("file") == "gs://bucket/run,1/ckpt:100%"
               and message == f"50% of heads\ncollapsed:: see, here\r ({finding.monitor})"
               for _, props, message in parsed)


def test_cli_prints_annotations_on_stderr_only_under_github_actions(runs, monkeypatch):
    args = ["trend", str(runs["collapse"]), "--format", "json", "-q"]
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    plain = runner.invoke(app, args)
    assert plain.exit_code == 1 and "::error" not in plain.output
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    result = runner.invoke(app, args)
    assert result.exit_code == 1
    json.loads(result.stdout)  # stdout stays the report alone
    commands = [line for line in result.stderr.splitlines() if line.startswith("::")]
    assert commands == github_annotations(_report_of(result.stdout), "alert")


def _report_of(text):
    from ckptscan.document.reading import report_from_dict

    return report_from_dict(json.loads(text))
