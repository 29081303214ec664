"""The sweep report: `ckptscan compare` (and `trend SWEEP/`) writes one,
versioned alike, whose `"command"` is `"compare"`: the worst status, then
each run ranked healthiest first with its whole report (`sweep_dict`, each
run's report the document of `plain.report_dict`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ckptscan import __version__
from ckptscan.document.plain import report_dict
from ckptscan.errors import CkptScanError
from ckptscan.schema.results import SCHEMA_VERSION, SweepReport
from ckptscan.system.output import write_output


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
