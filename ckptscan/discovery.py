"""Find the checkpoints of a run directory and order them by step."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ckptscan.errors import CkptScanError
from ckptscan.readers import Checkpoint, open_checkpoint, step_from_name


@dataclass
class Run:
    path: Path
    checkpoints: list[Checkpoint]
    # Entries that looked like checkpoints but could not be used, with why.
    skipped: list[dict[str, str]] = field(default_factory=list)


def discover_run(run_dir: str | Path) -> Run:
    """Every checkpoint directory under `run_dir` whose name carries a step
    (checkpoint-N, global_stepN, iter_NNNNNNN, step-N, stepN), ordered by step.

    A checkpoint that cannot be opened (incomplete, corrupt) is skipped with
    its reason rather than failing the whole run.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CkptScanError("not a run directory", path=run_dir)
    candidates = sorted(
        (step, entry) for entry in run_dir.iterdir() if (step := step_from_name(entry.name)) is not None
    )
    run = Run(run_dir, [])
    for step, entry in candidates:
        try:
            run.checkpoints.append(open_checkpoint(entry))
        except CkptScanError as e:
            run.skipped.append({"path": str(entry), "reason": str(e)})
    if not run.checkpoints:
        what = "no checkpoint could be opened" if candidates else "no checkpoint directories (checkpoint-N, step-N, …)"
        raise CkptScanError(f"{what} in this run directory", path=run_dir)
    return run
