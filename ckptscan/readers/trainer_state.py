"""The learning rates a Hugging Face Trainer logged, from the
`trainer_state.json` it writes into every `checkpoint-N/` folder.

`log_history` holds one entry per logging step (`{"step": s, "loss": …,
"learning_rate": …}`) and the evaluations' entries (no `learning_rate`:
passed over). The Trainer takes `_get_learning_rate()` right after the
optimizer step, before the scheduler's, then counts the step: entry `s`'s
rate is the one update s used, the update that turned checkpoint s − 1
into s (transformers `Trainer._inner_training_loop`). A pair's mean LR is
the mean over the entries from_step < s ≤ to_step. Checkpoint N's file
holds the history up to N, so a pair reads the newer checkpoint's."""

from __future__ import annotations

import math
from pathlib import Path

from ckptscan.errors import CkptScanError
from ckptscan.readers.bounded import MAX_INDEX_BYTES, load_json
from ckptscan.storage import RemotePath

TRAINER_STATE = "trainer_state.json"


def read_lr_history(folder: Path | RemotePath) -> list[tuple[int, float]] | None:
    """(step, learning rate) of every logged entry of `folder`'s
    trainer_state.json that has both, in step order; None without the file
    or without any such entry. A history grows with the run (hundreds of
    bytes an entry): it is read within the shard-index limit."""
    path = folder / TRAINER_STATE
    if not path.is_file():
        return None
    state = load_json(path, MAX_INDEX_BYTES, "trainer state")
    history = state.get("log_history") if isinstance(state, dict) else None
    if history is None:
        return None
    if not isinstance(history, list):
        raise CkptScanError(f"'log_history' is {type(history).__name__}, expected a list", path=path)
    found: dict[int, float] = {}
    for number, entry in enumerate(history):
        if not isinstance(entry, dict) or "learning_rate" not in entry:
            continue
        step, lr = entry.get("step"), entry["learning_rate"]
        if isinstance(step, bool) or not isinstance(step, int):
            raise CkptScanError(f"log_history[{number}]: step {step!r} is not an integer", path=path)
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr < 0:
            raise CkptScanError(f"log_history[{number}]: learning_rate {lr!r} is not a finite rate ≥ 0", path=path)
        found[step] = float(lr)  # a step logged twice (a resumed run): its last entry
    return sorted(found.items()) or None


def interval_lr(history: list[tuple[int, float]], from_step: int | None, to_step: int | None) -> float | None:
    """Mean logged learning rate of the updates between the two checkpoints
    (entries from_step < s ≤ to_step); None when no entry lies there."""
    if from_step is None or to_step is None:
        return None
    values = [lr for step, lr in history if from_step < step <= to_step]
    return sum(values) / len(values) if values else None
