"""`--wandb PROJECT[/RUN]`: the report in a Weights & Biases run.

One W&B run per scanned run: its id is a hash of the run's location
(`destinations.run_key`), so a nightly re-run resumes the same W&B run;
RUN names it (default: the run directory's name). What is written:

- per pair, at its newer step, the TensorBoard scalars (`{monitor}/layer_{i}`,
  `ckptscan/{family}_severity` 0 ok … 3 alert, `ckptscan/{family}_flagged_layers`,
  `ckptscan/status`, `ckptscan/loss`);
- at the newest step, two tables: `ckptscan/verdict` (one row: status,
  message, first family and step, rollback candidate) and `ckptscan/findings`
  (step, layer, family, severity, monitor, value, message);
- the run summary: `ckptscan/verdict`, `ckptscan/first_alert_step`,
  `ckptscan/first_alert_family`, `ckptscan/rollback_candidate`,
  `ckptscan/newest_step`.

Only steps newer than the run's `ckptscan/newest_step` are logged (W&B
steps only increase within a run): online, the resumed run's summary says
which; offline (WANDB_MODE=offline, synced later), a small file beside the
offline runs in the wandb directory does, as the server is not asked.

Mode, entity, directory and credentials are W&B's own (WANDB_MODE,
WANDB_ENTITY, WANDB_DIR, WANDB_API_KEY). Needs `wandb`
(`pip install 'ckptscan[wandb]'`).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from ckptscan.errors import CkptScanError
from ckptscan.report.destinations import require_package, run_key, run_location
from ckptscan.report.tensorboard import report_points
from ckptscan.schema.results import ScanReport

NEWEST = "ckptscan/newest_step"
FINDINGS_COLUMNS = ["step", "layer", "family", "severity", "monitor", "value", "message"]
VERDICT_COLUMNS = ["status", "message", "first_alert_family", "first_alert_step", "rollback_candidate",
                   "rollback_step"]


def require_wandb() -> None:
    """Before any long scan: --wandb needs the package (exit 2 with the fix)."""
    require_package("wandb", "--wandb", "wandb", "wandb")


def parse_target(target: str) -> tuple[str, str | None]:
    """'PROJECT' or 'PROJECT/RUN' → (project, run name or None)."""
    project, _, name = target.partition("/")
    if not project or "/" in name:
        raise CkptScanError(f"--wandb takes PROJECT or PROJECT/RUN, not {target!r}")
    return project, name or None


def write_wandb(report: ScanReport, target: str) -> tuple[int, int]:
    """Append the report's new steps to its W&B run in PROJECT (resumed or
    created). Returns (steps written, steps that were already there)."""
    project, name = parse_target(target)
    require_wandb()
    import wandb

    key = run_key(report)
    location = run_location(report)
    run = wandb.init(project=project, id=key, name=name or Path(location.split(" ")[-1]).name, resume="allow",
                     job_type="ckptscan", config={"ckptscan_run": location},
                     # A run of its own even inside a training process that has one (live mode).
                     reinit="create_new", settings=wandb.Settings(silent=True, console="off"))
    try:
        marker = Path(run.settings.wandb_dir) / f"ckptscan-{re.sub(r'[^A-Za-z0-9_.-]', '_', project)}-{key}.json"
        newest = _newest_step(run, marker)
        points = [p for p in report_points(report) if not isinstance(p.value, str)]
        rows: dict[int, dict[str, Any]] = defaultdict(dict)
        for point in points:
            if point.step > newest:
                rows[point.step][point.tag] = point.value
        steps = {p.step for p in points}
        if rows:
            last = max(rows)
            rows[last]["ckptscan/verdict"] = wandb.Table(columns=VERDICT_COLUMNS, data=[_verdict_row(report)])
            rows[last]["ckptscan/findings"] = wandb.Table(columns=FINDINGS_COLUMNS, data=_finding_rows(report))
            for step in sorted(rows):
                run.log(rows[step], step=step)
        s = report.summary
        newest_now = max(steps | {newest})
        run.summary.update({
            "ckptscan/verdict": s.status,
            "ckptscan/first_alert_family": s.first_family,
            "ckptscan/first_alert_step": s.first_alert_step.get(s.first_family) if s.first_family else None,
            "ckptscan/rollback_candidate": s.rollback_candidate.path if s.rollback_candidate is not None else None,
            NEWEST: newest_now,
        })
        if run.offline:
            marker.write_text(json.dumps({NEWEST: newest_now}))
    finally:
        run.finish()
    return len(rows), len(steps - set(rows))


def _newest_step(run: Any, marker: Path) -> int:
    """The newest step the W&B run already has (-1: none)."""
    if run.resumed:
        return int(run.summary.get(NEWEST, -1))
    if run.offline and marker.is_file():
        return int(json.loads(marker.read_text())[NEWEST])
    return -1


def _verdict_row(report: ScanReport) -> list[Any]:
    s = report.summary
    rollback = s.rollback_candidate
    return [s.status, s.message, s.first_family, s.first_alert_step.get(s.first_family) if s.first_family else None,
            rollback.path if rollback is not None else None, rollback.step if rollback is not None else None]


def _finding_rows(report: ScanReport) -> list[list[Any]]:
    return [[pair.to_step, layer.layer, f.family, f.severity, f.monitor, f.value, f.message]
            for pair in report.pairs for layer in pair.layers for f in layer.findings]
