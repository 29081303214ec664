"""Run the scan's independent per-layer tasks on a few threads, results in order.

Why layer-level threads, each with one intra-op thread, rather than one
stream of work with torch's intra-op threads: measured on a 2-core machine
shared with other jobs, MKL's batched float64 eigensolves of the 2r × 2r
cores run 5-15x slower on two intra-op threads than on one (OpenMP barriers
spin while another process holds a core), and the Gram GEMMs gain at most 2x.
Layers are independent, so giving each worker its own layer keeps every core
busy with work that never waits for the other core. A worker blocked in
`pread` (which releases the GIL) leaves the core to the other: reading one
layer overlaps computing another, with no separate prefetch stage.

Memory stays bounded: at most `workers` tasks run at once, and tasks queued
ahead hold nothing until they start.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Iterable, Iterator, TypeVar

import torch

T = TypeVar("T")
R = TypeVar("R")

# Two workers overlap reading with computing and fill a 2-core machine; more
# buy little on the per-layer cores and multiply the layers held in memory.
MAX_WORKERS = 2


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # platforms without affinity masks
        return os.cpu_count() or 1


def plan_threads(tasks: int, workers: int | None = None) -> tuple[int, int]:
    """(worker threads, torch intra-op threads per worker) for `tasks` tasks.

    `workers` None picks min(2, CPUs, tasks); the CPUs are shared out so that
    workers × intra-op threads ≈ CPUs.
    """
    cpus = usable_cpus()
    chosen = min(MAX_WORKERS, cpus) if workers is None else workers
    if chosen < 1:
        raise ValueError(f"need at least one worker, not {chosen}")
    chosen = max(1, min(chosen, tasks))
    return chosen, max(1, cpus // chosen)


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Set torch's intra-op thread count for the block, then restore it."""
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@contextlib.contextmanager
def exact_float32() -> Iterator[None]:
    """float32 matmuls in full float32 for the block, then the caller's setting again.

    Live mode runs inside training scripts that commonly switch on TF32
    (`torch.set_float32_matmul_precision("high")`, `allow_tf32`): a 10-bit
    mantissa in the Gram products would make the live report differ from
    `trend` on the same weights. The setting is process-wide, so it is held
    only while the scan's tasks run.
    """
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def ordered_map(
    fn: Callable[[T, threading.Event], R], items: Iterable[T], workers: int
) -> Iterator[R]:
    """fn(item, stop) for each item on `workers` threads, yielded in item order.

    An exception in a task is raised here, at its position in the order. When
    the consumer stops early (an error, Ctrl-C, or closing the generator),
    tasks not yet started are cancelled and `stop` is set, so a running task
    that checks it between its steps ends promptly instead of finishing a
    long layer nobody will read. On Ctrl-C (or SIGTERM, which arrives as
    one) the running tasks are not even waited for: the interrupt reaches the
    caller at once, and the tasks, which only read, end at their next check.
    """
    stop = threading.Event()
    if workers <= 1:
        for item in items:
            yield fn(item, stop)
        return
    pending: deque[Future[R]] = deque()
    source = iter(items)
    # Queue a few tasks beyond the running ones so a worker that finishes
    # early never idles while the consumer waits on an earlier, slower task.
    lookahead = 2 * workers
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ckptscan-layer")
    interrupted = False
    try:
        for item in source:
            pending.append(pool.submit(fn, item, stop))
            if len(pending) >= lookahead:
                break
        while pending:
            result = pending.popleft().result()
            for item in source:
                pending.append(pool.submit(fn, item, stop))
                break
            yield result
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        stop.set()
        pool.shutdown(wait=not interrupted, cancel_futures=True)
