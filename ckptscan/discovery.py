"""Find the checkpoints of a run directory and order them by step.

Checkpoint directories carry their step in their name (`checkpoint-N` HF
Trainer, `global_stepN` DeepSpeed, `iter_NNNNNNN` Megatron, `step-N`
torchtitan, `stepN` OLMo-core). Pointer files (`latest`,
`latest_checkpointed_iteration.txt`) are not checkpoints. What looks like a
checkpoint but cannot be used is listed in `Run.skipped` with the reason:
temporary directories, checkpoints newer than the framework's "latest"
pointer (still being written), checkpoints that do not open (missing shards,
no index, no model files), and Accelerate's `checkpoint_K`, whose K counts
saves, not steps.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ckptscan.errors import CkptScanError
from ckptscan.readers import Checkpoint, open_checkpoint, step_from_name
from ckptscan.storage import as_path

# Pointer files naming the newest complete checkpoint: DeepSpeed writes `latest`
# (`global_stepN`) and Megatron `latest_checkpointed_iteration.txt` (N or
# "release") after every shard is on disk.
POINTERS = {"latest": re.compile(r"^global_step(\d+)$"), "latest_checkpointed_iteration.txt": re.compile(r"^(\d+)$")}
# Staging names around a checkpoint name: HF Trainer's tmp-checkpoint-N, and
# N.tmp / N-tmp / tmp_N from other writers.
TEMPORARY = re.compile(r"^(tmp[-_.]|\.tmp[-_.]?)|([-_.]tmp\d*)$", re.IGNORECASE)
ACCELERATE = re.compile(r"^checkpoint_(\d+)$")
# Where frameworks put checkpoints below the directory users name (torchtitan
# `dump/checkpoint/`, Accelerate `project/checkpoints/`).
NESTED = ("checkpoint", "checkpoints")


@dataclass
class Run:
    path: Path
    checkpoints: list[Checkpoint]
    # Entries that looked like checkpoints but could not be used, with why.
    skipped: list[dict[str, str]] = field(default_factory=list)


def discover_run(run_dir: str | Path) -> Run:
    """Every usable checkpoint under `run_dir` (a directory or a URL prefix), ordered by step."""
    run_dir = as_path(run_dir)
    if not run_dir.is_dir():
        raise CkptScanError("not a run directory", path=run_dir)
    folder = _checkpoint_folder(run_dir)
    run = Run(run_dir, [])
    newest = _newest_complete(folder)
    candidates = []
    for entry in sorted(folder.iterdir()):
        step = step_from_name(entry.name)
        if step is not None and entry.is_dir():
            if newest is not None and step > newest:
                run.skipped.append({"path": str(entry), "reason": f"newer than the 'latest' pointer (step {newest}):"
                                    " still being written, or abandoned"})
            else:
                candidates.append((step, entry))
        elif entry.is_dir() and step_from_name(TEMPORARY.sub("", entry.name)) is not None:
            run.skipped.append({"path": str(entry), "reason": "temporary directory (still being written, or "
                                "abandoned)"})
        elif ACCELERATE.match(entry.name) and entry.is_dir():
            run.skipped.append({"path": str(entry), "reason": "Accelerate checkpoint_K: K counts saves, not "
                                "training steps; pass these checkpoints explicitly to compare them"})
    for step, entry in sorted(candidates, key=lambda c: (c[0], c[1].name)):
        try:
            checkpoint = open_checkpoint(entry)
        except CkptScanError as e:
            run.skipped.append({"path": str(entry), "reason": str(e)})
            continue
        checkpoint.step = step
        run.checkpoints.append(checkpoint)
    if not run.checkpoints:
        if not candidates and not run.skipped:
            _refuse_single_checkpoint(run_dir)
        what = "no checkpoint could be opened" if candidates or run.skipped else \
            "no checkpoint directories (checkpoint-N, global_stepN, iter_NNNNNNN, step-N, stepN)"
        skipped = "; ".join(f"{Path(s['path']).name}: {s['reason']}" for s in run.skipped[:3])
        raise CkptScanError(f"{what} in this run directory" + (f" (skipped {skipped})" if skipped else ""),
                            path=run_dir)
    return run


def _checkpoint_folder(run_dir: Path) -> Path:
    """`run_dir`, or its `checkpoint(s)/` subfolder when the checkpoints are there."""
    if any(step_from_name(e.name) is not None for e in run_dir.iterdir()):
        return run_dir
    for name in NESTED:
        if (run_dir / name).is_dir():
            return run_dir / name
    return run_dir


def _newest_complete(folder: Path) -> int | None:
    """The step the framework's pointer file names, if that checkpoint exists."""
    for name, pattern in POINTERS.items():
        pointer = folder / name
        if not pointer.is_file():
            continue
        try:
            match = pattern.match(pointer.read_text(encoding="utf-8").strip())
        except (OSError, UnicodeDecodeError):
            continue
        if match:
            step = int(match.group(1))
            if any(step_from_name(e.name) == step for e in folder.iterdir()):
                return step
    return None


def _refuse_single_checkpoint(run_dir: Path) -> None:
    """A directory that is itself one checkpoint (e.g. nanoGPT's out_dir, whose
    ckpt.pt is overwritten at each save) is not a run."""
    try:
        open_checkpoint(run_dir)
    except CkptScanError:
        return
    raise CkptScanError("this is a single checkpoint, not a run directory of checkpoint-N / global_stepN / "
                        "iter_NNNNNNN / step-N subdirectories (nanoGPT overwrites its one ckpt.pt at each save)",
                        path=run_dir)
