"""Executors: where a scan's per-layer tasks run.

The scan (`ckptscan.scan.scan_layers`) cuts its work into tasks, each a group
of layers walked over every checkpoint in step order, and hands them to an
executor; it never knows which one runs them:

- `LocalExecutor` (the default): worker threads in this process;
- `RayExecutor` (`pip install 'ckptscan[ray]'`): tasks on a Ray cluster, each
  re-opening the checkpoints by location on its node, retried when a worker
  or node dies.

Both yield each task's result as soon as it is known, tagged with the task's
position, so the driver caches results as they arrive.
"""

from __future__ import annotations

import threading
from typing import Callable, Iterator, Protocol, Sequence, TypeVar

from ckptscan.errors import CkptScanError

T = TypeVar("T")
R = TypeVar("R")

EXECUTORS = ("local", "ray")


class Executor(Protocol):
    def group(self, layers: Sequence[int]) -> list[list[int]]:
        """The layers cut into tasks: each list is one task, in layer order."""
        ...

    def map(self, fn: Callable[[T, threading.Event], R], items: Sequence[T]) -> Iterator[tuple[int, R]]:
        """(position, fn(item, stop)) for every item, each as soon as it is
        known. A task's error is raised here; closing the iterator early
        stops the tasks not yet finished. `fn` must be picklable for an
        executor that runs it in other processes."""
        ...

    def close(self) -> None:
        """Release what the executor started (a local Ray instance)."""
        ...


def make_executor(name: str, address: str | None = None) -> Executor:
    """The executor the CLI's `--executor NAME [--ray-address ADDRESS]` names."""
    if name == "local":
        if address is not None:
            raise CkptScanError("--ray-address needs --executor ray")
        from ckptscan.executors.local import LocalExecutor

        return LocalExecutor()
    if name == "ray":
        from ckptscan.executors.ray import RayExecutor

        return RayExecutor(address)
    raise CkptScanError(f"--executor must be one of {', '.join(EXECUTORS)}, not {name!r}")
