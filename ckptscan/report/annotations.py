"""GitHub Actions workflow annotations of a report (`::error …::`, `::warning …::`).

Printed by trend and diff when GITHUB_ACTIONS=true, on stderr (the runner
reads workflow commands from both streams, and stdout may carry the JSON or
JUnit report). First the verdict, then one annotation per (layer, family)
with a warn/alert finding: its first finding at its worst severity, titled
with the layer, family and step, pointing at the newer checkpoint of that
pair. Severities at the gate level (`--fail-on`) are errors, others
warnings. GitHub shows at most 10 of each kind per step, so the most severe
and earliest come first.
"""

from __future__ import annotations

from ckptscan.schema.results import DEFAULT_FAIL_ON, NOT_JUDGED, SEVERITIES, Finding, ScanReport, reaches
from ckptscan.schema.results import status_word


def github_annotations(report: ScanReport, fail_on: str = DEFAULT_FAIL_ON) -> list[str]:
    """The workflow command lines, without newlines."""
    def kind(severity: str) -> str:
        return "error" if reaches(severity, fail_on) else "warning"

    lines = []
    s = report.summary
    if s.status in ("warn", NOT_JUDGED, "alert"):
        title = f"ckptscan {report.command}: {status_word(s.status)}"
        lines.append(_command(kind(s.status), {"title": title}, s.message))
    firsts: dict[tuple[int, str], tuple[int | None, str, Finding]] = {}
    for pair in report.pairs:
        for layer in pair.layers:
            for f in layer.findings:
                if f.severity not in ("warn", "alert"):
                    continue
                held = firsts.get((layer.layer, f.family))
                if held is None or SEVERITIES.index(f.severity) > SEVERITIES.index(held[2].severity):
                    firsts[(layer.layer, f.family)] = (pair.to_step, pair.to_path, f)
    ranked = sorted(firsts.items(), key=lambda item: (-SEVERITIES.index(item[1][2].severity),
                                                      item[1][0] is None, item[1][0] or 0, item[0]))
    for (number, family), (step, path, f) in ranked:
        where = f" at step {step}" if step is not None else ""
        properties = {"title": f"ckptscan: layer {number} {family} {f.severity}{where}"}
        if path:
            properties = {"file": path, **properties}
        lines.append(_command(kind(f.severity), properties, f"{f.message} ({f.monitor})"))
    return lines


def _command(kind: str, properties: dict[str, str], message: str) -> str:
    props = ",".join(f"{key}={_escape_property(value)}" for key, value in properties.items())
    return f"::{kind} {props}::{_escape_data(message)}"


# The runner's escaping rules (actions/toolkit, core/src/command.ts).
def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")
