"""Monitor numbers as the report's Python floats: None where no number means
anything (a head whose weights did not change has no spectrum; a value
that overflowed is not a measurement)."""

from __future__ import annotations

import torch


def mean_of_changed(values: torch.Tensor, unchanged: torch.Tensor) -> float | None:
    kept = values[~unchanged]
    return float(kept.mean()) if kept.numel() else None


def finite_or_none(value: float) -> float | None:
    return value if value == value and abs(value) != float("inf") else None
