"""The default executor: one layer per task, on a couple of threads of this
process (`ckptscan.system.parallel` says why threads and why two)."""

from __future__ import annotations

import threading
from typing import Callable, Iterator, Sequence, TypeVar

from ckptscan.system.parallel import exact_float32, ordered_map, plan_threads, torch_threads

T = TypeVar("T")
R = TypeVar("R")


class LocalExecutor:
    """`workers` threads (None: min(2, CPUs)), each with `threads` torch
    intra-op threads (None: CPUs / workers); `ScanOptions.workers/threads`."""

    def __init__(self, workers: int | None = None, threads: int | None = None) -> None:
        self.workers = workers
        self.threads = threads

    def group(self, layers: Sequence[int]) -> list[list[int]]:
        # Tasks in one process share the opened checkpoints: a task per layer
        # costs nothing, and keeps two layers' tensors in memory at most.
        return [[layer] for layer in layers]

    def map(self, fn: Callable[[T, threading.Event], R], items: Sequence[T]) -> Iterator[tuple[int, R]]:
        workers, threads = plan_threads(len(items), self.workers)
        # The one place the process's torch thread count is set (and restored):
        # the monitors never touch it, so the workers' solves run side by side.
        # Likewise the float32 matmul precision (a training script's TF32).
        with torch_threads(self.threads or threads), exact_float32():
            yield from enumerate(ordered_map(fn, items, workers))

    def close(self) -> None:
        """Nothing to release: the threads end with each `map`."""
