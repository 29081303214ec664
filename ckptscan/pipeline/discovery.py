"""Find the checkpoints of a run directory and order them by step.

A run is a folder of checkpoint folders whose names carry the step
(`checkpoint-N` HF Trainer, `global_stepN` DeepSpeed, `iter_NNNNNNN`
Megatron, `step-N` torchtitan and litgpt, `stepN` OLMo-core, `step_N`
accelerate's examples, a bare `N` with Orbax's `_CHECKPOINT_METADATA`; also
litgpt's `final/`), of accelerate's
`checkpoint_K` folders (K counts saves), or of checkpoint files (Lightning
`epoch=E-step=N.ckpt` and `last.ckpt`, plain `step_N.pt`). Where a framework
records the step inside the checkpoint (Lightning `global_step`, DeepSpeed
`global_steps`, litgpt `step_count`, torchtitan `train_state`, a step counter
registered with accelerate), that step orders the run, whatever the name
says. Pointer files (`latest`, `latest_checkpointed_iteration.txt`) are not
checkpoints. What looks like a checkpoint but cannot be used is listed in
`Run.skipped` with the reason and its kind (`schema.results.SKIPPED_KINDS`): temporary
directories and checkpoints newer than the framework's "latest" pointer are
"in_progress" (the framework says they are still being written); a
checkpoint that does not open is "corrupt" (truncated, a damaged header, a
missing shard: nothing marks it as still being written, so a gate must not
pass over it); a second checkpoint of the same step (Lightning's
`last.ckpt` or litgpt's `final/`, copies of the newest one) is "duplicate";
one whose step is neither in its name nor recorded inside is "no_step".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Collection, overload

from ckptscan.errors import CkptScanError
from ckptscan.readers import Checkpoint, open_checkpoint, open_each, step_from_name
from ckptscan.readers.steps import (ACCELERATE, CHECKPOINT_FILE_SUFFIXES, NESTED, file_step,
                                     looks_like_run, orbax_step)
from ckptscan.storage import RemotePath, as_path
from ckptscan.schema.results import CORRUPT, DUPLICATE, IN_PROGRESS, NO_STEP

if TYPE_CHECKING:
    from ckptscan.pipeline.opened import OpenedRecord
# Pointer files naming the newest complete checkpoint: DeepSpeed writes `latest`
# (`global_stepN`) and Megatron `latest_checkpointed_iteration.txt` (N or
# "release") after every shard is on disk.
POINTERS = {"latest": re.compile(r"^global_step(\d+)$"), "latest_checkpointed_iteration.txt": re.compile(r"^(\d+)$")}
# Staging names around a checkpoint name: HF Trainer's tmp-checkpoint-N, and
# N.tmp / N-tmp / tmp_N from other writers.
TEMPORARY = re.compile(r"^(tmp[-_.]|\.tmp[-_.]?)|([-_.]tmp\d*)$", re.IGNORECASE)
# litgpt's pretrain ends with out/final/lit_model.pth beside the step-N folders.
LITGPT_FINAL = "final"
# Lightning's copy of the newest checkpoint (`last.ckpt`, `last-v1.ckpt`).
LAST = re.compile(r"^last(-v\d+)?$")


@dataclass
class Run:
    path: Path | RemotePath
    checkpoints: list[Checkpoint]
    # Entries that looked like checkpoints but could not be used, with why.
    skipped: list[dict[str, str]] = field(default_factory=list)
    # What the user should know about the steps (save indices, names that disagree with the record).
    notes: list[str] = field(default_factory=list)


def discover_run(run_dir: str | Path | RemotePath, opened: OpenedRecord | None = None) -> Run:
    """Every usable checkpoint under `run_dir` (a directory or a URL prefix), ordered by step.

    `opened`: the checkpoints found whole last time (`ckptscan.pipeline.opened`); those
    unchanged since are not opened again, the others are and are recorded."""
    run_dir = run_directory(run_dir)
    folder = checkpoint_folder(run_dir)
    run = Run(run_dir, [])
    newest = newest_complete(folder)
    entries: list[Path | RemotePath] = sorted(folder.iterdir())
    # (entry, step in its name or None, accelerate save index or None)
    candidates: list[tuple[Path | RemotePath, int | None, int | None]] = []
    for entry in entries:
        step = step_from_name(entry.name)
        if step is None:
            step = orbax_step(entry)
        if step is not None and entry.is_dir():
            if newest is not None and step > newest:
                run.skipped.append({"path": str(entry), "reason": f"newer than the 'latest' pointer (step {newest}):"
                                    " still being written, or abandoned", "kind": IN_PROGRESS})
            else:
                candidates.append((entry, step, None))
        elif entry.is_dir() and step_from_name(TEMPORARY.sub("", entry.name)) is not None:
            run.skipped.append({"path": str(entry), "reason": "temporary directory (still being written, or "
                                "abandoned)", "kind": IN_PROGRESS})
        elif entry.is_dir() and (match := ACCELERATE.match(entry.name)):
            candidates.append((entry, None, int(match.group(1))))
        elif entry.name == LITGPT_FINAL and (entry / "lit_model.pth").is_file():
            candidates.append((entry, None, None))  # its step is recorded inside (step_count)
    if not candidates:  # a run saved as files, unless the folder is itself one checkpoint
        # A safetensors file is a save of the run only when its name has a step (step_100.safetensors):
        # model-00001-of-00002.safetensors is a shard of the folder's one checkpoint.
        files = [e for e in entries if e.is_file() and (e.suffix in CHECKPOINT_FILE_SUFFIXES or (
            e.suffix == ".safetensors" and file_step(e.name) is not None))]
        # Two files or more, each named with a step, are a run's saves even where they would open
        # together as one checkpoint (safetensors files side by side read as its shards).
        if sum(file_step(e.name) is not None for e in files) < 2:
            _refuse_single_checkpoint(folder)
        candidates = [(e, file_step(e.name), None) for e in files]
    found: list[tuple[int, int, str, Checkpoint]] = []
    for (entry, name_step, index), checkpoint in zip(candidates, _open_candidates([c[0] for c in candidates], opened)):
        if isinstance(checkpoint, CkptScanError):
            run.skipped.append({"path": str(entry), "reason": str(checkpoint), "kind": CORRUPT})
            continue
        step = _step(checkpoint, entry, name_step, index, run)
        if step is None:
            run.skipped.append({"path": str(entry), "reason": "no step in the name and none recorded inside",
                                "kind": NO_STEP})
            continue
        checkpoint.step = step
        found.append((step, bool(LAST.match(entry.stem)), entry.name, checkpoint))
    found.sort(key=lambda o: (o[0], o[1] or o[2] == LITGPT_FINAL, o[2]))
    for step, is_last, name, checkpoint in found:
        if run.checkpoints and run.checkpoints[-1].step == step:
            kept = run.checkpoints[-1].path.name
            if is_last or name == LITGPT_FINAL:
                reason = f"same step {step} as {kept} (a copy, e.g. Lightning's last.ckpt or litgpt's final/)"
            else:  # two saves claim one step (`checkpoint-100` beside `checkpoint-0100`): neither is a known copy
                reason = (f"{kept} is also step {step}: two checkpoints of this run claim it and only {kept} is "
                          f"read; rename or move the other")
            run.skipped.append({"path": str(checkpoint.path), "reason": reason, "kind": DUPLICATE})
            continue
        run.checkpoints.append(checkpoint)
    if not run.checkpoints:
        what = "no checkpoint could be opened" if candidates or run.skipped else \
            ("no checkpoint directories (checkpoint-N, global_stepN, iter_NNNNNNN, step-N, stepN, step_N, "
             "checkpoint_K) or checkpoint files (*.ckpt, *.pt, *.pth)")
        skipped = "; ".join(f"{Path(s['path']).name}: {s['reason']}" for s in run.skipped[:3])
        raise CkptScanError(f"{what} in this run directory" + (f" (skipped {skipped})" if skipped else ""),
                            path=run_dir)
    return run


def _open_candidates(entries: list[Path | RemotePath], opened: OpenedRecord | None
                     ) -> list[Checkpoint | CkptScanError]:
    """`open_each` of the entries the record does not know unchanged."""
    if opened is None:
        return open_each(entries)
    known = [opened.lookup(entry) for entry in entries]
    unknown = [entry for entry, checkpoint in zip(entries, known) if checkpoint is None]
    fresh = iter(open_each(unknown))
    outcomes: list[Checkpoint | CkptScanError] = []
    for entry, checkpoint in zip(entries, known):
        if checkpoint is not None:
            outcomes.append(checkpoint)
            continue
        outcome = next(fresh)
        if not isinstance(outcome, CkptScanError):
            opened.remember(entry, outcome)
        outcomes.append(outcome)
    opened.forget_others(entries)
    opened.save()
    return outcomes


def run_directory(run_dir: str | Path | RemotePath) -> Path | RemotePath:
    """`run_dir` as a path (`~` and `$VAR` expanded), checked to be a directory."""
    path = as_path(run_dir)
    if isinstance(path, RemotePath):
        # One listing of everything under the run prefix (beside its parent's), which every
        # checkpoint's open then reads from: no listing per checkpoint.
        path.list_with_parent()
    if not path.exists():
        raise CkptScanError("does not exist", path=path)
    if not path.is_dir():
        raise CkptScanError("is a file, not a run directory (of checkpoint-N/ folders or checkpoint files)", path=path)
    return path


def sweep_runs(directory: str | Path | RemotePath) -> list[Path | RemotePath] | None:
    """The runs of a sweep, in name order: a directory (or URL prefix) that
    holds no checkpoint itself but at least two subdirectories that are runs
    (`looks_like_run`); None for anything else (a run, or no run at all)."""
    path = as_path(directory)
    if not path.is_dir() or looks_like_run(path):
        return None
    runs = sorted(entry for entry in path.iterdir() if looks_like_run(entry))
    return runs if len(runs) >= 2 else None


def _step(checkpoint: Checkpoint, entry: Path | RemotePath, name_step: int | None, index: int | None,
          run: Run) -> int | None:
    """The step recorded inside the checkpoint, else the one in its name, else
    (accelerate's checkpoint_K) the save index K, said so in the run's notes."""
    recorded = checkpoint.meta.get("step_source")
    if recorded is not None:
        if name_step is not None and name_step != checkpoint.step:
            run.notes.append(f"{entry.name}: step {checkpoint.step} from the checkpoint's '{recorded}', not "
                             f"{name_step} from its name")
        return checkpoint.step
    if index is not None:
        if not any("save index" in n for n in run.notes):
            run.notes.append("checkpoint_K: K is accelerate's save index, not a training step (no step is recorded "
                             "inside; register a step counter with accelerator.register_for_checkpointing to "
                             "record one); steps shown are K")
        return index
    return name_step


# A local folder stays a Path (a watch lists it with os.listdir), a URL's a RemotePath.
@overload
def checkpoint_folder(run_dir: Path) -> Path: ...
@overload
def checkpoint_folder(run_dir: RemotePath) -> RemotePath: ...
def checkpoint_folder(run_dir: Path | RemotePath) -> Path | RemotePath:
    """`run_dir`, or its `checkpoint(s)/` subfolder when the checkpoints are there."""
    if any(step_from_name(e.name) is not None or ACCELERATE.match(e.name) or orbax_step(e) is not None
           for e in run_dir.iterdir()):
        return run_dir
    for name in NESTED:
        if (run_dir / name).is_dir():
            return run_dir / name
    return run_dir


def newest_complete(folder: Path | RemotePath, steps: Collection[int] | None = None) -> int | None:
    """The step the framework's pointer file names, if that checkpoint exists.
    `steps`: the steps of the folder's entries, when the caller has listed it
    (a watch looks often at a folder of thousands)."""
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
            listed = steps if steps is not None else {step_from_name(e.name) for e in folder.iterdir()}
            if step in listed:
                return step
    return None


def _refuse_single_checkpoint(run_dir: Path | RemotePath) -> None:
    """A directory that is itself one checkpoint (e.g. nanoGPT's out_dir, whose
    ckpt.pt is overwritten at each save) is not a run."""
    try:
        open_checkpoint(run_dir)
    except CkptScanError:
        return
    raise CkptScanError("this is a single checkpoint, not a run directory of checkpoint-N / global_stepN / "
                        "iter_NNNNNNN / step-N subdirectories or of checkpoint files (nanoGPT overwrites its one "
                        "ckpt.pt at each save)",
                        path=run_dir)
