"""Step numbers in the names of checkpoint folders.

Training frameworks name each save's folder after its step
(checkpoint-layouts.md §7). Readers take a checkpoint's step from there when
the framework records none inside; discovery and watch use the same names to
find a run's checkpoints and order them.
"""

from __future__ import annotations

import re

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
