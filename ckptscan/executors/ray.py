"""Run a scan's layer tasks on a Ray cluster (`pip install 'ckptscan[ray]'`).

    report = ckptscan.scan_run("s3-or-shared-fs/run", executor=RayExecutor("auto"))
    ckptscan trend RUN --executor ray --ray-address auto

Why a task is a group of layers walked through every checkpoint, rather than
one checkpoint or one (pair, layer): a pair's metrics need both checkpoints'
rows of a layer at once, and every checkpoint but the first and last is in
two pairs. Walking a layer through the checkpoints in step order reads each
checkpoint's rows once and computes each checkpoint's Grams once, and no
tensor ever leaves the worker: the task gets checkpoint paths
(`ckptscan.scan.LayerTask` pickles by location), reads its rows from the
shared filesystem or store itself, and returns per-pair metrics, a few KB
per layer. The driver never relays weights. Layers are grouped, about
`TASKS_PER_CPU` tasks per cluster CPU, because every task re-opens every
checkpoint (headers, index, config: for a sharded 405B checkpoint hundreds of
files) on its worker; a couple of tasks per CPU still balances the load and
keeps a retried task short.

A worker process or node that dies mid-task has its task run again
(`max_retries`, Ray's task retries; a task's own error, such as a corrupt
tensor, is not retried: it would fail again). The numbers do not depend on
where or how often a task ran, so the report equals a run without failures.
Once the retries are spent, the error names the checkpoint at fault when one
no longer opens (`checkpoint_at_fault`), else says that none is.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any, Callable, Iterator, Sequence, TypeVar

from ckptscan.errors import CkptScanError
from ckptscan.system.parallel import exact_float32, torch_threads
from ckptscan.storage.readahead import reading_ahead

T = TypeVar("T")
R = TypeVar("R")

# Tasks per CPU of the cluster: enough to balance uneven layers, few enough
# that re-opening the checkpoints in every task stays a small cost.
TASKS_PER_CPU = 2
# Ray's own default for tasks; a node lost twice in one run is rare.
MAX_RETRIES = 3
INSTALL = "--executor ray needs Ray: pip install 'ckptscan[ray]'"


class RayExecutor:
    """Layer tasks on the Ray cluster at `address` ("auto": the running
    cluster this machine belongs to; "ray://host:10001": a remote one via Ray
    Client; None: the Ray this process already joined with `ray.init`, else a
    new local instance, shut down again by `close()`).

    `init`: more `ray.init` arguments. Workers need ckptscan and torch
    installed, and must see the checkpoints at the paths the driver sees."""

    def __init__(self, address: str | None = None, *, max_retries: int = MAX_RETRIES,
                 tasks_per_cpu: int = TASKS_PER_CPU, init: dict[str, Any] | None = None) -> None:
        _ray()  # fail now, with the install line, rather than mid-scan
        self.address = address
        self.max_retries = max_retries
        self.tasks_per_cpu = tasks_per_cpu
        self.init = dict(init or {})
        self._started = False

    def group(self, layers: Sequence[int]) -> list[list[int]]:
        """Contiguous layer groups, about `tasks_per_cpu` per cluster CPU."""
        cpus = int(self._connect().cluster_resources().get("CPU", 1))
        count = max(1, min(len(layers), self.tasks_per_cpu * max(1, cpus)))
        size, extra = divmod(len(layers), count)
        groups, start = [], 0
        for g in range(count):
            end = start + size + (g < extra)
            groups.append(list(layers[start:end]))
            start = end
        return groups

    def map(self, fn: Callable[[T, threading.Event], R], items: Sequence[T]) -> Iterator[tuple[int, R]]:
        ray = self._connect()
        from ray import exceptions

        shared = ray.put(fn)  # stored once, not once per task
        task = _remote(ray).options(max_retries=self.max_retries, retry_exceptions=False)
        position = {task.remote(shared, item): i for i, item in enumerate(items)}
        pending = list(position)
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                i = position[ready[0]]
                try:
                    result = ray.get(ready[0])
                except exceptions.RayTaskError as e:
                    if isinstance(e.cause, (CkptScanError, KeyboardInterrupt)):
                        raise e.cause from None
                    raise CkptScanError(f"Ray task for {_describe(fn, items[i])} failed: {_first_line(e.cause)}") \
                        from None
                except exceptions.RayError as e:
                    # A lost worker or node, once the retries are spent.
                    raise CkptScanError(
                        f"Ray task for {_describe(fn, items[i])} failed after {self.max_retries} "
                        f"retr{'y' if self.max_retries == 1 else 'ies'}: {_first_line(e)}; {checkpoint_at_fault(fn)}"
                    ) from None
                yield i, result
        finally:
            for ref in pending:  # an error or Ctrl-C here: the rest are not wanted
                try:
                    ray.cancel(ref, force=True)
                except Exception:  # noqa: BLE001 (already finished or already gone)
                    pass

    def close(self) -> None:
        """Shut down the local Ray instance this executor started, if any."""
        if self._started:
            _ray().shutdown()
            self._started = False

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connect(self) -> Any:
        ray = _ray()
        if not ray.is_initialized():
            # Workers' logs stay on their nodes: a task's error comes back as
            # one line through `map`, not as a remote traceback on stderr.
            settings = {"include_dashboard": False, "logging_level": logging.WARNING, "log_to_driver": False,
                        **self.init}
            try:
                # "local": a new instance even when a `ray start` cluster runs on this
                # machine (plain ray.init() would join it); joining one is --ray-address auto.
                ray.init(address=self.address or "local", **settings)
            except ConnectionError as e:
                raise CkptScanError(f"cannot reach the Ray cluster at {self.address}: {_first_line(e)}") from None
            self._started = self.address is None
        return ray


def run_task(fn: Callable[[T, threading.Event], R], item: T) -> R:
    """One task on a Ray worker: the worker holds one CPU, so one torch
    thread. Checkpoints in object storage are read ahead, as in a local scan:
    the task's next layer-loads are fetched while it computes on the current
    one (`readahead.reading_ahead`, the same per-worker bound)."""
    stop = threading.Event()
    with torch_threads(1), exact_float32():
        open_task = getattr(fn, "open", None)
        # Not a layer task (e.g. a wrapper of one), whose item is its layers: nothing to read ahead for.
        if open_task is None or not isinstance(item, Sequence):
            return fn(item, stop)
        # A task sent by location opens its checkpoints here, so the read-ahead can see them.
        with reading_ahead(open_task(), item):
            return fn(item, stop)


@functools.cache
def _remote(ray: Any) -> Any:
    return ray.remote(num_cpus=1)(run_task)


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise CkptScanError(INSTALL) from None
    return ray


def _describe(fn: Callable, item: object) -> str:
    describe = getattr(fn, "describe", None)
    return describe(item) if describe is not None else repr(item)


def checkpoint_at_fault(fn: Callable) -> str:
    """What a task lost with its worker cannot say (which checkpoint it was
    reading): open each checkpoint of the task here, headers only, and name
    the first that no longer opens; if all open, no checkpoint is at fault."""
    from ckptscan.readers import open_checkpoint

    locations = getattr(fn, "locations", None)
    if locations is None:
        return "the worker or node was lost"
    checked = locations()
    for location in checked:
        try:
            open_checkpoint(location)
        except CkptScanError as e:
            return f"checkpoint at fault: {e}"
    return f"all {len(checked)} checkpoints open here: the worker or node was lost, not a checkpoint"


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__
