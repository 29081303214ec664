"""Step numbers in the names of checkpoint folders.

Training frameworks name each save's folder after its step
(checkpoint-layouts.md §7). Readers take a checkpoint's step from there when
the framework records none inside; discovery and watch use the same names to
find a run's checkpoints and order them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ckptscan.storage import RemotePath

# Accelerate's checkpoint_{k} is a save counter, not a step, and is deliberately absent.
STEP_PATTERNS = [
    re.compile(r"^checkpoint-(\d+)$"),  # HF Trainer
    re.compile(r"^global_step(\d+)$"),  # DeepSpeed
    re.compile(r"^iter_(\d+)$"),  # Megatron
    re.compile(r"^step[-_]?(\d+)$"),  # torchtitan and litgpt (step-N), OLMo-core (stepN), accelerate examples (step_N)
]


def step_from_name(name: str) -> int | None:
    for pattern in STEP_PATTERNS:
        match = pattern.match(name)
        if match:
            return int(match.group(1))
    return None


# How a run folder holds its checkpoints, beyond the folder names above (a
# run's discovery and the run-folder checks of one pair, inputs/lineage.py):
# accelerate's ProjectConfiguration(automatic_checkpoint_naming=True): K is a save index.
ACCELERATE = re.compile(r"^checkpoint_(\d+)$")
# Where frameworks put checkpoints below the directory users name (torchtitan
# `dump/checkpoint/`, accelerate `project/checkpoints/`, Lightning `version_K/checkpoints/`).
NESTED = ("checkpoint", "checkpoints")
# Checkpoint files of a run saved as files (Lightning .ckpt, torch.save .pt/.pth).
CHECKPOINT_FILE_SUFFIXES = (".ckpt", ".pt", ".pth")
# A step in a file name: Lightning `epoch=0-step=200.ckpt`, `step_200.pt`, `iter-200.pth`.
FILE_STEP = re.compile(r"(?:^|[-_=.])(?:step|iter|global_step)[-_=]?(\d+)(?:$|[-_.])")


def file_step(name: str) -> int | None:
    """The step in a checkpoint file's name (`FILE_STEP`), or None."""
    match = FILE_STEP.search(name.rsplit(".", 1)[0])
    return int(match.group(1)) if match else None


def orbax_step(entry: Path | RemotePath) -> int | None:
    """Orbax's CheckpointManager names step folders by the bare step (`1000/`)."""
    from ckptscan.readers.orbax import CHECKPOINT_METADATA

    if entry.name.isdigit() and (entry / CHECKPOINT_METADATA).is_file():
        return int(entry.name)
    return None


def looks_like_run(path: Path | RemotePath) -> bool:
    """A directory holding checkpoints by any of the names a run's discovery knows."""
    if not path.is_dir():
        return False
    return any(step_from_name(e.name) is not None or ACCELERATE.match(e.name) or orbax_step(e) is not None or
               (e.name in NESTED and e.is_dir()) or (e.is_file() and e.suffix in CHECKPOINT_FILE_SUFFIXES)
               for e in path.iterdir())
