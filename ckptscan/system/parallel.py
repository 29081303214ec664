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

The plan (`plan_threads`), by the CPUs this process may use:
- up to 2 CPUs (the CI and benchmark machine): 2 workers, each with one
  intra-op thread; a single task gets both cores as intra-op threads. This
  is the plan measured above, unchanged.
- more: one worker per CPU, up to one per task and NODE_MAX_WORKERS, each
  with one intra-op thread; cores left over when there are fewer tasks than
  CPUs become intra-op threads of the workers, at most MAX_INTRA_OP each.
  Measured on a 16-core node (an H200 machine, torch 2.11, a 1B-shaped bf16
  pair of 16 layers): the old rule for every machine, 2 workers × CPUs/2
  intra-op threads, took 3.5-3.9 s for the pair, slower than the 2-core
  machine: the per-head eigensolves (thousands of 2r × 2r problems a layer)
  gain nothing from intra-op threads and lose to their barriers, and 14 of
  the 16 cores waited on them. Small batched matrices want one thread each;
  the d × d Gram GEMMs gain from a few, which is all MAX_INTRA_OP gives them
  where cores would otherwise idle. NODE_MAX_WORKERS bounds what the workers
  hold and the Python each runs between kernels under one GIL.
- memory: at most `workers` tasks run at once, and tasks queued ahead hold
  nothing until they start. When the caller knows the bytes one task holds
  (`layer_bytes`), the workers are also cut to fit MEMORY_SHARE of the
  machine's memory (`memory_budget`).
The choice for 2, 8, 16 and 64 CPUs is pinned in tests/scan/test_parallel.py;
the many-core rows were chosen from the measurement above and have not yet
been timed on such a node (bench/scale.py's compute floor times the plan
against one stream on all cores; bench/gpu_check.py runs on a GPU node).

Before worker threads make their first CUDA linear-algebra call, one call of
each kind is made on the calling thread (`ckptscan.system.linalg_warmup`):
torch loads its CUDA solvers lazily on first use, and two threads doing so at
once crash.
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
# buy little on the per-layer cores there and multiply the layers held in memory.
MAX_WORKERS = 2
SMALL_MACHINE = 2  # CPUs up to which MAX_WORKERS is the plan (the measured 2-core one)
NODE_MAX_WORKERS = 16  # workers on a larger machine, at most (memory held, one GIL)
MAX_INTRA_OP = 4  # intra-op threads a worker gets from cores no task needs
MEMORY_SHARE = 0.25  # of the machine's memory, what the running tasks may hold (with `layer_bytes`)


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # platforms without affinity masks
        return os.cpu_count() or 1


def physical_memory() -> int:
    """Bytes of memory of this machine (0 where the platform does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return 0


def plan_threads(tasks: int, workers: int | None = None, *, cpus: int | None = None,
                 layer_bytes: int | None = None, memory_budget: int | None = None) -> tuple[int, int]:
    """(worker threads, torch intra-op threads per worker) for `tasks` tasks,
    by the plan in the module docstring.

    `workers` given: that many (at most one per task), sharing the CPUs as
    intra-op threads (at most MAX_INTRA_OP each above SMALL_MACHINE).
    `cpus`: the CPUs to plan for (default: `usable_cpus()`).
    `layer_bytes`: the bytes one task holds at once, when the caller knows
    them; the workers are then as many as fit `memory_budget` (default:
    MEMORY_SHARE of `physical_memory()`), never fewer than one.
    """
    cpus = max(1, usable_cpus() if cpus is None else cpus)
    if workers is not None and workers < 1:
        raise ValueError(f"need at least one worker, not {workers}")
    small = cpus <= SMALL_MACHINE
    if workers is not None:
        chosen = workers
    else:
        chosen = min(MAX_WORKERS, cpus) if small else min(cpus, NODE_MAX_WORKERS)
        if layer_bytes:
            budget = int(MEMORY_SHARE * physical_memory()) if memory_budget is None else memory_budget
            if budget > 0:
                chosen = min(chosen, budget // layer_bytes)
    chosen = max(1, min(chosen, tasks))
    threads = cpus // chosen if small else min(MAX_INTRA_OP, cpus // chosen)
    return chosen, max(1, threads)


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
