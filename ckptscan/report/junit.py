"""JUnit XML of a report, for CI test reports (Jenkins, GitLab, GitHub actions).

One test case per (layer, family): classname `ckptscan.layer_{i}`, name the
family, for the layers that have it (`FamilySpec.has`: attention for every
layer with attention, router for MoE layers, a family with its own values
for the layers it has them for, numeric for every layer). A case fails when a finding of its family in its
layer reaches the gate level (`--fail-on`, default alert); the failure's
message is the first such finding (earliest step, most severe first), its
text lists the case's warn/alert findings with their steps (the first 40). Warnings below
the gate level leave the case passing and are listed in the suite's
system-out, with the verdict and rollback candidate. A run that could not
be judged (summary status "not_judged") fails every case at the levels
not_judged and warn, with the reason, and says so in system-out at
--fail-on alert (the default).

The document satisfies the strict Apache Ant JUnit schema (every required
attribute and element; no <skipped>, which Ant's schema lacks) and so the
lenient schema of Jenkins' xUnit plugin too: tests/report/ validates both.
The report holds no durations: times are 0.
"""

from __future__ import annotations

import datetime
import re
import socket
from pathlib import Path
from xml.etree import ElementTree as ET

from ckptscan.system.output import write_output
from ckptscan.errors import CkptScanError
from ckptscan.monitors import registry
from ckptscan.schema.results import (DEFAULT_FAIL_ON, FAIL_ON_LEVELS, NOT_JUDGED, SEVERITIES, Finding, ScanReport,
                                     reaches)

GATE_LEVELS = FAIL_ON_LEVELS
BODY_LINES = 40  # findings listed in a failure's text; a long run would bury the first ones
NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def junit_xml(report: ScanReport, fail_on: str = DEFAULT_FAIL_ON, timestamp: datetime.datetime | None = None,
              hostname: str | None = None) -> str:
    """The report as a JUnit XML document (`fail_on`: the severity that fails a case)."""
    if fail_on not in GATE_LEVELS:
        raise CkptScanError(f"--fail-on must be one of {', '.join(GATE_LEVELS)}, not {fail_on!r}")
    cases = _cases(report)
    width = len(str(max((layer for layer, _ in cases), default=0)))
    stamp = (timestamp or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y-%m-%dT%H:%M:%S")
    where = report.settings.get("run") or (report.pairs[0].to_path if report.pairs else "")

    suite = ET.Element("testsuite", {
        "name": f"ckptscan {report.command} {where}".strip(), "package": "ckptscan", "id": "0",
        "timestamp": stamp, "hostname": hostname or socket.gethostname() or "localhost", "time": "0",
    })
    properties = ET.SubElement(suite, "properties")
    for name, value in _properties(report, fail_on):
        ET.SubElement(properties, "property", {"name": name, "value": value})
    failures, below_gate = 0, []
    unjudged_fails = report.summary.status == NOT_JUDGED and _at_least(NOT_JUDGED, fail_on)
    for (layer, family), found in cases.items():
        case = ET.SubElement(suite, "testcase", {"name": family, "classname": f"ckptscan.layer_{layer:0{width}d}",
                                                 "time": "0"})
        failing = [(step, f) for step, f in found if _at_least(f.severity, fail_on)]
        if failing:
            failures += 1
            step, first = min(failing, key=lambda sf: (sf[0] is None, sf[0] or 0, -SEVERITIES.index(sf[1].severity)))
            failure = ET.SubElement(case, "failure", {"message": f"{_at(step)}: {first.message}",
                                                      "type": f"{first.family}.{first.monitor}.{first.severity}"})
            lines = [_line(layer, step, f) for step, f in found if _at_least(f.severity, "warn")]
            more = [f"… and {len(lines) - BODY_LINES} more (see the JSON report)"] if len(lines) > BODY_LINES else []
            failure.text = "\n".join(lines[:BODY_LINES] + more)
        elif unjudged_fails:
            # Nothing fired, but nothing could be judged either: a pass would say "healthy".
            failures += 1
            failure = ET.SubElement(case, "failure", {"message": f"not judged: {report.summary.not_judged_reason}",
                                                      "type": f"{family}.{NOT_JUDGED}"})
            failure.text = report.summary.message
        else:
            below_gate += [_line(layer, step, f) for step, f in found if _at_least(f.severity, "warn")]
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(failures))
    suite.set("errors", "0")
    ET.SubElement(suite, "system-out").text = "\n".join(_summary_lines(report) + below_gate)
    ET.SubElement(suite, "system-err").text = ""

    # Ant's schema allows no attributes on <testsuites>; the totals are on the suite.
    root = ET.Element("testsuites")
    root.append(suite)
    ET.indent(root)
    document = '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
    # A control character in a tensor name or path would make the file unreadable XML.
    return NOT_XML.sub("\ufffd", document)


def write_junit(document: str, path: str | Path) -> None:
    """Write a `junit_xml` document (made once, so stdout and file are the same bytes)
    by `system.output`'s rules: `-` and the process's own descriptors in place, a file
    atomically (it wrote a file named `-` into the working directory)."""
    try:
        write_output(path, document)
    except OSError as e:
        raise CkptScanError(f"cannot write the JUnit report: {e.strerror or e}", path=path) from None


def _cases(report: ScanReport) -> dict[tuple[int, str], list[tuple[int | None, Finding]]]:
    """(layer, family) -> its findings with their steps, in report order;
    a family is a case of a layer only where the layer has it."""
    has: dict[int, set[str]] = {}
    listed = registry.finding_specs()
    for pair in report.pairs:
        for result in pair.layers:
            has.setdefault(result.layer, set()).update(family.name for family in listed if family.has(result))
    cases: dict[tuple[int, str], list[tuple[int | None, Finding]]] = {
        (layer, family.name): [] for layer in sorted(has) for family in listed if family.name in has[layer]}
    for pair in report.pairs:
        for result in pair.layers:
            for f in result.findings:
                cases.setdefault((result.layer, f.family), []).append((pair.to_step, f))
    return cases


def _properties(report: ScanReport, fail_on: str) -> list[tuple[str, str]]:
    from ckptscan import __version__

    s = report.summary
    props = [("ckptscan.version", __version__), ("command", report.command), ("status", s.status),
             ("fail_on", fail_on), ("model.family", report.model.family or "unknown")]
    props += [(f"first_alert_step.{family}", str(step)) for family, step in s.first_alert_step.items()
              if step is not None]
    if s.rollback_candidate is not None:
        props.append(("rollback_candidate", s.rollback_candidate.path))
    if s.judged_pairs is not None:
        props.append(("judged_pairs", str(s.judged_pairs)))
    return props


def _summary_lines(report: ScanReport) -> list[str]:
    s = report.summary
    lines = [f"{s.status.upper()}: {s.message}"]
    if s.rollback_candidate is not None:
        lines.append(f"rollback candidate: {s.rollback_candidate.path} (step {s.rollback_candidate.step})")
    lines += [f"not judged: {item}" for item in s.not_judged]
    lines += [f"skipped: {item}" for item in report.skipped]
    return lines


def _at_least(severity: str, level: str) -> bool:
    return reaches(severity, level)


def _at(step: int | None) -> str:
    return f"step {step}" if step is not None else "the pair"


def _line(layer: int, step: int | None, f: Finding) -> str:
    return f"layer {layer}, {_at(step)}, {f.family} {f.severity} ({f.monitor}): {f.message}"
