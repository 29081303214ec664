"""What the folders say about two checkpoints of a pair: one run or two.

The weights alone cannot always tell two runs apart: runs started from one
initialisation (one seed, a shared checkpoint-0) stay related for thousands
of steps, so a pair across them reads as one run's update, too large
(detection/provenance.py). Where the two checkpoints sit tells more. A pair
is of two runs when all of this holds:

- the two checkpoints sit in different folders, each of which looks like a
  run (checkpoint-N siblings: the names `discover_run` knows);
- the newer checkpoint's run holds its *own* checkpoint at the older one's
  step, and that checkpoint is not the older one: its weights differ (a
  fork or copy of the older run, which is one run's history, has the same
  weights there), or, where it cannot be read, the two runs' loss logs
  (`train_log.jsonl`, or the checkpoints' `trainer_state.json`) disagree at
  or before that step.

A resumed run written into a new folder holds no checkpoint of its own at
the step it resumed from, and its log starts after it: no evidence, so the
pair is judged on its weights as before. Local paths only: a URL pair is
judged on its weights.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from ckptscan.errors import CkptScanError

# Relative difference ‖x − y‖/‖x‖ under which two checkpoints' tensors are one
# state: a copy re-saved in another dtype differs by its rounding (2⁻⁸ for
# bf16), two states of different runs by the training between them (order 1).
SAME_STATE = 1e-2
# Rows read of each matrix: every tensor that trained differently differs in
# its first rows, and reading only those keeps the comparison of a large
# model's two checkpoints to megabytes.
COMPARED_ROWS = 4


def other_run_evidence(older: str, older_step: int | None, newer: str) -> str | None:
    """Why the checkpoints `older` and `newer` are of two runs, in words, or
    None when their folders do not tell (one folder, no run folders, no own
    checkpoint or log of the newer run at the older step, a URL)."""
    a, b = Path(older), Path(newer)
    if older_step is None or "://" in older or "://" in newer or not (a.exists() and b.exists()):
        return None
    run_a, run_b = a.resolve().parent, b.resolve().parent
    if run_a == run_b or not (_is_run_folder(run_a) and _is_run_folder(run_b)):
        return None
    own = _own_checkpoint(run_b, older_step, a)
    if own is not None:
        difference = _difference(a, own)
        if difference is not None:
            if difference < SAME_STATE:
                return None  # the newer run passed through this very state: a fork or a copy of the older run
            return (f"{run_b.name}/ and {run_a.name}/ are two run folders: {run_b.name}/ holds its own step "
                    f"{older_step} ({own.name}), whose weights differ from {older}'s (relative difference "
                    f"{difference:.2f} in the first rows of the matrices both hold)")
    for what, log_a, log_b in (("loss logs", _run_log(run_a), _run_log(run_b)),
                               ("trainer states", _trainer_log(a), _trainer_log(b))):
        parted = _first_disagreement(log_a, log_b, older_step)
        if parted is not None:
            return (f"{run_b.name}/ and {run_a.name}/ are two run folders, and their {what} part at step "
                    f"{parted}, at or before step {older_step}")
    return None


def _is_run_folder(folder: Path) -> bool:
    from ckptscan.readers.steps import looks_like_run

    return looks_like_run(folder)


def _own_checkpoint(run: Path, step: int, older: Path) -> Path | None:
    """The entry of `run` named for `step` (checkpoint-1700, step_1700.pt), unless it is `older` itself."""
    from ckptscan.readers.steps import file_step, step_from_name

    for entry in sorted(run.iterdir()):
        name_step = step_from_name(entry.name)
        if name_step is None and entry.is_file():
            name_step = file_step(entry.name)
        if name_step == step and not _same_file(entry, older):
            return entry
    return None


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _difference(a: Path, b: Path) -> float | None:
    """The largest ‖x − y‖/‖x‖ over the first rows of every matrix both
    checkpoints hold with one shape (float64); None when either does not
    open or they share none."""
    import torch

    from ckptscan.readers import open_checkpoint

    try:
        first, second = open_checkpoint(a), open_checkpoint(b)
        shared = sorted(set(first.tensors.keys()) & set(second.tensors.keys()))
        worst: float | None = None
        for name in shared:
            shape = first.tensors.shape(name)
            if len(shape) < 2 or shape != second.tensors.shape(name):
                continue
            rows = (0, min(shape[0], COMPARED_ROWS))
            x = first.tensors.get(name, rows).to(torch.float64)
            y = second.tensors.get(name, rows).to(torch.float64)
            norm = float(torch.linalg.vector_norm(x))
            if not math.isfinite(norm) or norm == 0.0:
                continue  # a zero row (padding) or non-finite weights tell nothing here
            difference = float(torch.linalg.vector_norm(x - y)) / norm
            worst = difference if worst is None or not difference <= worst else worst
    except CkptScanError:
        return None
    return worst


def _run_log(run: Path) -> dict[int, float]:
    """Step → loss from the run folder's loss log; empty without a readable one."""
    from ckptscan.inputs.loss_log import DEFAULT_LOSS_LOG, read_loss_log

    try:
        log = read_loss_log(run / DEFAULT_LOSS_LOG)
    except CkptScanError:
        return {}
    return dict(zip(log.steps, log.losses))


def _trainer_log(checkpoint: Path) -> dict[int, float]:
    """Step → loss from a Hugging Face checkpoint's trainer_state.json
    `log_history`; empty without a readable one."""
    from ckptscan.readers.bounded import MAX_INDEX_BYTES, load_json
    from ckptscan.readers.trainer_state import TRAINER_STATE

    path = checkpoint / TRAINER_STATE
    if not path.is_file():
        return {}
    try:
        state = load_json(path, MAX_INDEX_BYTES, "trainer state")
    except CkptScanError:
        return {}
    history = state.get("log_history") if isinstance(state, dict) else None
    return {entry["step"]: float(entry["loss"]) for entry in history or []
            if isinstance(entry, dict) and isinstance(entry.get("step"), int)
            and isinstance(entry.get("loss"), (int, float))}


def _first_disagreement(a: dict[int, float], b: dict[int, float], step: int) -> int | None:
    """The first step at or before `step` logged in both with different losses."""
    for s in sorted(set(a) & set(b)):
        if s > step:
            return None
        if a[s] != b[s] and not (math.isnan(a[s]) and math.isnan(b[s])):
            return s
    return None
