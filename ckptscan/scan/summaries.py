"""Monitor numbers as the report's Python floats: None where no number means
anything (a head whose weights did not change has no spectrum; a value
that overflowed is not a measurement)."""

from __future__ import annotations

import torch


def values_or_none(values: torch.Tensor, unchanged: torch.Tensor) -> list[float | None]:
    return [None if same else value for value, same in zip(values.tolist(), unchanged.tolist())]


def mean_of_changed(values: torch.Tensor, unchanged: torch.Tensor) -> float | None:
    kept = values[~unchanged]
    return float(kept.mean()) if kept.numel() else None


def min_of_changed(values: torch.Tensor, unchanged: torch.Tensor) -> float | None:
    kept = values[~unchanged]
    return float(kept.min()) if kept.numel() else None


def finite_or_none(value: float) -> float | None:
    return value if value == value and abs(value) != float("inf") else None
