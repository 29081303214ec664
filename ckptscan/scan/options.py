"""How a scan computes its metrics: `ScanOptions`, and which of its settings
can change a number (the cache's key) and which only schedule the work."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Sequence

import torch

from ckptscan.layouts import HeadOverrides, TensorMap


@dataclass(frozen=True)
class ScanOptions:
    """How metrics are computed. Frozen: a scan's options never change under it.

    Every field either can change a number, and is then listed in
    `cache_key()`, or only schedules the work (`SCHEDULING`); a test fails
    when a new field is neither, so the cache cannot serve numbers computed
    with other settings."""

    compute_dtype: torch.dtype = torch.float32
    overrides: HeadOverrides = field(default_factory=HeadOverrides)
    layers: Sequence[int] | None = None  # None: every layer
    device: str = "cpu"  # "cpu", "cuda", "cuda:N" or "auto" (cuda when available)
    heads: Sequence[int] | None = None  # None: every query head; else these (and their KV heads)
    tensor_map: TensorMap | None = None  # user regex -> role map replacing the layout resolvers
    full_spectrum: bool = False  # whole-matrix ΔW_q/ΔW_k spectra, O(d³) per layer
    workers: int | None = None  # layer worker threads; None: min(2, CPUs)
    # torch intra-op threads while the scan runs (set once, restored after);
    # None: CPUs / workers. Live mode passes its trainer's own count.
    threads: int | None = None

    def __post_init__(self) -> None:
        for name in ("layers", "heads"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, tuple(int(v) for v in value))

    def cache_key(self) -> dict[str, str]:
        """The settings that can change a metric, as stable strings."""
        tensor_map = self.tensor_map
        return {
            "compute_dtype": str(self.compute_dtype),
            "overrides": repr(self.overrides),
            "layers": repr(self.layers),
            "device": self.device,
            "heads": repr(self.heads),
            "tensor_map": "null" if tensor_map is None else json.dumps(
                {"patterns": {k: p.pattern for k, p in sorted(tensor_map.patterns.items())},
                 "settings": tensor_map.settings}, sort_keys=True, default=str),
            "full_spectrum": repr(self.full_spectrum),
        }


# ScanOptions fields that only schedule the work: they never change a number.
SCHEDULING = ("workers", "threads")

# Top-k for expert load when the config does not say (Mixtral's value).
DEFAULT_TOP_K = 2
