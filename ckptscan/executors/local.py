"""The default executor: a few layers per task, on a few threads of this
process (`ckptscan.system.parallel` says why threads, and how many)."""

from __future__ import annotations

import threading
from typing import Callable, Iterator, Sequence, TypeVar

from ckptscan.system.linalg_warmup import warm_linalg
from ckptscan.system.parallel import exact_float32, ordered_map, plan_threads, torch_threads

T = TypeVar("T")
R = TypeVar("R")
# Layers a task at most: their attention solves are batched, and a task's
# results arrive (and are cached) together.
MAX_GROUP = 8


class LocalExecutor:
    """`workers` threads (None: planned from the CPUs and the tasks,
    `plan_threads`), each with `threads` torch intra-op threads (None:
    planned likewise); `ScanOptions.workers/threads`. `layer_bytes`: what one
    task holds, when the caller knows it (the plan then keeps the running
    tasks within a share of the machine's memory)."""

    def __init__(self, workers: int | None = None, threads: int | None = None,
                 layer_bytes: int | None = None) -> None:
        self.workers = workers
        self.threads = threads
        self.layer_bytes = layer_bytes

    def group(self, layers: Sequence[int]) -> list[list[int]]:
        # Tasks in one process share the opened checkpoints, and a task reads
        # one layer at a time whatever its size (a layer per worker in memory
        # at most); several layers to a task let it solve their small
        # eigenproblems in one batch (`LayerTask`). Up to MAX_GROUP layers a
        # task, the same number of tasks for each worker.
        if not layers:
            return []
        workers, _ = plan_threads(len(layers), self.workers)
        count = workers * -(-len(layers) // (workers * MAX_GROUP))
        size = -(-len(layers) // count)
        return [list(layers[i:i + size]) for i in range(0, len(layers), size)]

    def map(self, fn: Callable[[T, threading.Event], R], items: Sequence[T]) -> Iterator[tuple[int, R]]:
        if self.layer_bytes is None:
            workers, threads = plan_threads(len(items), self.workers)
        else:
            workers, threads = plan_threads(len(items), self.workers, layer_bytes=self.layer_bytes)
        device = _device(fn)
        if workers > 1 and device is not None and device != "cpu":
            # torch's CUDA solvers load on first use, and two workers loading them at once crash
            # (ckptscan.system.linalg_warmup): this thread loads them before any worker starts.
            warm_linalg(device)
        # The one place the process's torch thread count is set (and restored):
        # the monitors never touch it, so the workers' solves run side by side.
        # Likewise the float32 matmul precision (a training script's TF32).
        with torch_threads(self.threads or threads), exact_float32():
            yield from enumerate(ordered_map(fn, items, workers))

    def close(self) -> None:
        """Nothing to release: the threads end with each `map`."""


def _device(fn: object) -> str | None:
    """The device a task computes on: a `LayerTask`'s resolved `options.device`
    (None for a task that does not say)."""
    device = getattr(getattr(fn, "options", None), "device", None)
    return device if isinstance(device, str) else None
