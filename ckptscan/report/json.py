"""JSON report: the versioned, stable schema users' CI scripts parse.

Non-finite floats never reach the file (JSON has no NaN): they become null,
and the rule that saw them has already recorded a finding. Files are written
through `ckptscan.output`: atomically to a file, so a reader never sees half
a report, and straight through to a pipe, a device or stdout (`-`).

`ckptscan compare` (and `trend SWEEP/`) writes a sweep report, versioned
alike, whose `"command"` is `"compare"`: the worst status, then each run
ranked healthiest first with its whole report (`sweep_dict`).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import numbers
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckptscan import __version__
from ckptscan.errors import CkptScanError
from ckptscan.output import write_output
from ckptscan.results import SCHEMA_VERSION, ScanReport

if TYPE_CHECKING:
    from ckptscan.results import SweepReport


# A report with more layer and per-head results than this (an 80-layer run
# of a few hundred checkpoints) is written without indentation: the same
# keys, 40 % fewer bytes (docs/json-schema.md).
COMPACT_RESULTS = 100_000
# --per-head: which layers keep their per-head results in the report; "all"
# (the default) writes every one. The others leave `heads` empty elsewhere
# and say so in settings.per_head.
PER_HEAD = ("all", "flagged", "newest")


def report_dict(report: ScanReport, per_head: str = "all") -> dict[str, Any]:
    """The report as its JSON file holds it. `per_head` ("all", "flagged":
    only layers at warn or alert, "newest": only the newest pair's): which
    layers keep their per-head results, 86 % of a long report's bytes."""
    check_per_head(per_head)
    body = _plain(dataclasses.asdict(report))
    command = body.pop("command")
    _omit_empty_families(body)
    if per_head != "all":
        newest = len(body["pairs"]) - 1
        for index, pair in enumerate(body["pairs"]):
            for layer in pair["layers"]:
                if layer.get("attention") and not keeps_heads(per_head, layer["status"], index == newest):
                    layer["attention"]["heads"] = []
        body["settings"]["per_head"] = per_head
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "ckptscan", "version": __version__},
        "command": command,
        **body,
    }


def _omit_empty_families(body: dict[str, Any]) -> None:
    """A layer's `families` is written only when a registered family computed
    values: without one the report is what it was before the field existed."""
    for pair in body["pairs"]:
        for layer in pair["layers"]:
            if not layer["families"]:
                del layer["families"]


def keeps_heads(per_head: str, layer_status: str, newest: bool) -> bool:
    """Whether a layer keeps its per-head results under `per_head` (`newest`:
    the layer is in the report's newest pair)."""
    if per_head == "newest":
        return newest
    return per_head == "all" or layer_status in ("warn", "alert")


def check_per_head(per_head: str) -> None:
    if per_head not in PER_HEAD:
        raise CkptScanError(f"--per-head must be one of {', '.join(PER_HEAD)}, not {per_head!r}")


def compact(report: ScanReport) -> bool:
    """Whether the report is long enough to be written without indentation."""
    results = 0
    for pair in report.pairs:
        for layer in pair.layers:
            results += 1 + (len(layer.attention.heads) if layer.attention is not None else 0)
        if results > COMPACT_RESULTS:
            return True
    return False


def report_json(report: ScanReport, per_head: str = "all") -> str:
    data = report_dict(report, per_head)
    if compact(report):
        return json.dumps(data, separators=(",", ":"), allow_nan=False) + "\n"
    return json.dumps(data, indent=2, allow_nan=False) + "\n"


def write_json(report: ScanReport, path: str | Path, per_head: str = "all") -> None:
    """The report to `path` (see the module docstring); gzip-compressed when
    the path ends in .gz (`load_report` reads either)."""
    text = report_json(report, per_head)
    try:
        write_output(path, gzip.compress(text.encode(), 6, mtime=0) if str(path).endswith(".gz") else text)
    except OSError as e:
        raise CkptScanError(f"cannot write the JSON report: {e.strerror or e}", path=path) from None


def sweep_dict(sweep: SweepReport) -> dict[str, Any]:
    """The sweep report: {schema_version, tool, command: "compare",
    summary: {status, runs, message}, notes, left_out, runs: [{rank, path,
    status, first_alert_step, first_warn_step, family, references, report}]},
    each `report` the run's whole report judged against its `references`;
    `left_out`: the runs that alert against all the others, left out of the
    others' bands."""
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "ckptscan", "version": __version__},
        "command": "compare",
        "summary": {"status": sweep.status, "runs": len(sweep.runs), "message": sweep_message(sweep)},
        "notes": list(sweep.notes),
        "left_out": list(sweep.left_out),
        "runs": [{"rank": run.rank, "path": run.path, "status": run.status,
                  "first_alert_step": run.first_alert_step, "first_warn_step": run.first_warn_step,
                  "family": run.family, "references": list(run.references), "report": report_dict(run.report)}
                 for run in sweep.runs],
    }


def sweep_message(sweep: SweepReport) -> str:
    """One line: how many runs reached each status, and the worst run."""
    alerted, warned, unjudged = (sum(run.status == status for run in sweep.runs)
                                 for status in ("alert", "warn", "not_judged"))
    worst = sweep.runs[-1]
    if not alerted and not warned and not unjudged:
        return f"HEALTHY: none of the {len(sweep.runs)} runs departed from the others"
    reached = ", ".join(([f"{alerted} alerted"] if alerted else []) + ([f"{warned} warned"] if warned else [])
                        + ([f"{unjudged} could not be judged yet"] if unjudged else []))
    when = f" at step {worst.first_step}" if worst.first_step is not None else ""
    return (f"{sweep.status.upper()}: of {len(sweep.runs)} runs, {reached}; the worst: {worst.path} "
            f"({worst.family or 'its'} {worst.status}{when})")


def write_sweep_json(sweep: SweepReport, path: str | Path) -> None:
    try:
        write_output(path, json.dumps(sweep_dict(sweep), indent=2, allow_nan=False) + "\n")
    except OSError as e:
        raise CkptScanError(f"cannot write the JSON report: {e.strerror or e}", path=path) from None


def _plain(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral):  # numpy integers too
        return int(value)
    if isinstance(value, numbers.Real):  # numpy floats too, which json cannot encode
        value = float(value)
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
