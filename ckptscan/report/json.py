"""JSON report: the versioned, stable schema users' CI scripts parse.

Non-finite floats never reach the file (JSON has no NaN): they become null,
and the rule that saw them has already recorded a finding. Files are written
through `ckptscan.system.output`: atomically to a file, so a reader never sees half
a report, and straight through to a pipe, a device or stdout (`-`).

`ckptscan compare` (and `trend SWEEP/`) writes a sweep report, versioned
alike, whose `"command"` is `"compare"`: the worst status, then each run
ranked healthiest first with its whole report (`sweep_dict`).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckptscan import __version__
from ckptscan.errors import CkptScanError
from ckptscan.system.output import write_output
from ckptscan.report.plain import PER_HEAD, check_per_head, keeps_heads, plain, plain_pair, report_dict
from ckptscan.schema.results import SCHEMA_VERSION, ScanReport

if TYPE_CHECKING:
    from ckptscan.schema.results import SweepReport

# What this module has always offered; built in `report/plain.py`.
__all__ = ["COMPACT_RESULTS", "PER_HEAD", "check_per_head", "compact", "keeps_heads", "plain", "plain_pair",
           "report_dict", "report_json", "sweep_dict", "sweep_message", "write_json", "write_sweep_json"]


# A report writing more layer and per-head results than this (a 16-layer
# run past ~120 pairs, an 80-layer, 64-head diff) is written without
# indentation: the same keys, 40 % fewer bytes, and json's C encoder, which
# cannot indent, instead of its Python one (10x slower; docs/json-schema.md).
COMPACT_RESULTS = 2_000


def compact(report: ScanReport, per_head: str = "all") -> bool:
    """Whether the report is long enough to be written without indentation:
    more than COMPACT_RESULTS layer and per-head results written."""
    results, newest = 0, len(report.pairs) - 1
    for index, pair in enumerate(report.pairs):
        for layer in pair.layers:
            results += 1
            if layer.attention is not None and keeps_heads(per_head, layer.status, index == newest):
                results += len(layer.attention.heads)
        if results > COMPACT_RESULTS:
            return True
    return False


def report_json(report: ScanReport, per_head: str = "all") -> str:
    data = report_dict(report, per_head)
    if compact(report, per_head):
        return json.dumps(data, separators=(",", ":"), allow_nan=False) + "\n"
    # The indenting encoder is Python's own (the C one cannot indent), 10x slower: for short reports only.
    return json.dumps(data, indent=2, allow_nan=False) + "\n"


def write_json(report: ScanReport, path: str | Path, per_head: str = "all") -> None:
    """The report to `path` (see the module docstring); gzip-compressed when
    the path ends in .gz (`load_report` reads either). A long report to a
    file is schema 2, its pairs in a file beside it that a re-run of the
    same run appends to (`report/parts.py`); a short one, or one to stdout,
    a pipe or a device, is schema 1."""
    from ckptscan.report import parts

    check_per_head(per_head)
    try:
        if str(path) != "-" and parts.uses_parts(report, Path(path)):
            parts.write_parts(report, Path(path), per_head)
            return
        text = report_json(report, per_head)
        write_output(path, gzip.compress(text.encode(), 6, mtime=0) if str(path).endswith(".gz") else text)
    except OSError as e:
        raise CkptScanError(f"cannot write the JSON report: {e.strerror or e}", path=path) from None
    if str(path) != "-" and Path(path).is_file():
        parts.remove_stale_parts(Path(path))  # those of a schema-2 report this one replaced


def sweep_dict(sweep: SweepReport, per_head: str = "all") -> dict[str, Any]:
    """The sweep report: {schema_version, tool, command: "compare",
    summary: {status, runs, message}, notes, left_out, runs: [{rank, path,
    status, first_alert_step, first_warn_step, family, references, report}]},
    each `report` the run's whole report judged against its `references`;
    `left_out`: the runs that alert against all the others, left out of the
    others' bands; `per_head` as in `report_dict`, for each run's report."""
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "ckptscan", "version": __version__},
        "command": "compare",
        "summary": {"status": sweep.status, "runs": len(sweep.runs), "message": sweep_message(sweep)},
        "notes": list(sweep.notes),
        "left_out": list(sweep.left_out),
        "runs": [{"rank": run.rank, "path": run.path, "status": run.status,
                  "first_alert_step": run.first_alert_step, "first_warn_step": run.first_warn_step,
                  "family": run.family, "references": list(run.references), "report": report_dict(run.report, per_head)}
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


def write_sweep_json(sweep: SweepReport, path: str | Path, per_head: str = "all") -> None:
    try:
        write_output(path, json.dumps(sweep_dict(sweep, per_head), indent=2, allow_nan=False) + "\n")
    except OSError as e:
        raise CkptScanError(f"cannot write the JSON report: {e.strerror or e}", path=path) from None
