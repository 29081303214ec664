"""Tensors of a checkpoint known to open, read only if they are asked for.

A re-run of a long `trend` finds most of its checkpoints unchanged since
they were last opened and validated, and needs only their paths, steps,
files and config (every pair of them is cached). Opening 2,000 of them again
(each index, config and header parsed and checked) was a quarter of such a
re-run. `ckptscan.pipeline.opened.OpenedRecord` says which are unchanged; each comes
back as a `Checkpoint` whose tensors are a `DeferredSource`, which opens the
checkpoint the first time a tensor, a shape or the list of names is asked for.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import torch

from ckptscan.readers.base import TensorSource
from ckptscan.readers.opening import open_checkpoint


class DeferredSource:
    """`open_checkpoint(path).tensors`, opened on first use (once, thread-safe)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._opened: TensorSource | None = None
        self._lock = threading.Lock()

    def keys(self) -> list[str]:
        return self.opened().keys()

    def shape(self, name: str) -> tuple[int, ...]:
        return self.opened().shape(name)

    def dtype(self, name: str) -> str:
        return self.opened().dtype(name)

    def get(self, name: str, rows: tuple[int, int] | None = None) -> torch.Tensor:
        return self.opened().get(name, rows)

    def __getattr__(self, name: str) -> Any:
        # What a format adds to the four calls (safetensors' `prefetch`); only
        # reached for names this class lacks, never for the private ones.
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.opened(), name)

    def opened(self) -> TensorSource:
        with self._lock:
            if self._opened is None:
                self._opened = open_checkpoint(self.path).tensors
            return self._opened
