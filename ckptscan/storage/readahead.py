"""Read-ahead for checkpoints in object storage.

The scan loop is layer-major: a worker loads checkpoint 0's layer L, then
checkpoint 1's, and so on, and then takes the next layer nobody has begun.
Locally that is the right order (the page cache and `pread` are fast). From
object storage one layer-load is a few ranged GETs of tens of ms each, so a
worker that fetches only when it needs the bytes leaves the network idle
while it computes, and has few requests in flight while it waits.

`ReadAhead` starts the fetches of the next layer-loads a worker will need
while it works on the current one: the rest of its layer's checkpoints, then
the first loads of the next layer no worker has begun (layers are handed out
in order, so that is the one it, or the other worker, takes next). The bytes
land in the checkpoint's source (`SafetensorsSource.prefetch`), where the
load's own reads take them, waiting if they are still in flight, and raising
a failed fetch's error (URL, tensor) at that point, as a plain read would.

Bounds: at most `DEPTH` loads per worker are fetched ahead of the one it is
on, so memory grows by at most that many layer-loads per worker (the scan
already holds one or two per worker), and the requests in flight stay
bounded by the shared GET pool (`stores.MAX_IN_FLIGHT`). A Ray task runs
on a worker with its own read-ahead over the task's layers
(`reading_ahead`), bounded the same way. Every load is
fetched once: a load already started (by either worker) or taken is never
started again. `close()` abandons what was fetched ahead and not taken (an
error elsewhere, Ctrl-C), cancelling the requests not yet sent.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

# Layer-loads fetched ahead per worker: the next one hides its latency while
# the current one is computed on, a second keeps requests in flight while a
# worker goes from one load to the next (bench/remote.py).
DEPTH = 2

# start(layer, checkpoint index): begin fetching that load's bytes without
# waiting, return a function that abandons them (or None: nothing to fetch).
Starter = Callable[[int, int], Callable[[], None] | None]


class ReadAhead:
    """Loads are (layer, checkpoint index); `layers` in the order the workers
    take them, `used` the checkpoints each layer visits, in order."""

    def __init__(self, layers: Sequence[int], used: Sequence[int], start: Starter, depth: int = DEPTH) -> None:
        self._layers, self._used, self._start, self._depth = list(layers), list(used), start, depth
        self._lock = threading.Lock()
        self._begun: set[int] = set()  # layers some worker has begun
        self._first_unbegun = 0  # position in `_layers` before which every layer has begun
        # Loads fetched ahead and not yet taken -> (the worker that started them, their abandon function).
        self._ahead: dict[tuple[int, int], tuple[int, Callable[[], None] | None]] = {}
        self._closed = False
        # The most loads one worker had fetched ahead at once (never above `depth`: the memory bound).
        self.most_ahead = 0

    def reach(self, layer: int, checkpoint: int) -> None:
        """The calling worker is about to load `checkpoint`'s `layer`: start
        that load (unless it was started ahead) and up to `depth` after it."""
        me = threading.get_ident()  # a worker is its thread: layer workers live for the whole scan
        with self._lock:
            if self._closed:
                return
            self._begun.add(layer)
            taken = self._ahead.pop((layer, checkpoint), None)
            if taken is None:  # not fetched ahead: start it first, so its requests queue before the ones ahead
                self._start(layer, checkpoint)
            mine = sum(owner == me for owner, _ in self._ahead.values())
            for load in self._after(layer, checkpoint):
                if mine >= self._depth:
                    break
                if load in self._ahead:  # the other worker started it
                    continue
                # Started under the lock: a load is never started twice. Starting
                # only queues requests, so the lock is held for microseconds.
                self._ahead[load] = (me, self._start(*load))
                mine += 1
            self.most_ahead = max(self.most_ahead, mine)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Abandon every load fetched ahead and not taken; later calls start nothing."""
        with self._lock:
            self._closed = True
            ahead, self._ahead = self._ahead, {}
        for _, abandon in ahead.values():
            if abandon is not None:
                abandon()

    def _after(self, layer: int, checkpoint: int):
        """The loads this worker needs after (layer, checkpoint), in order: the
        rest of this layer, then the layers no worker has begun yet."""
        position = self._used.index(checkpoint)
        yield from ((layer, i) for i in self._used[position + 1:])
        while self._first_unbegun < len(self._layers) and self._layers[self._first_unbegun] in self._begun:
            self._first_unbegun += 1
        for later in self._layers[self._first_unbegun:]:
            if later not in self._begun:
                yield from ((later, i) for i in self._used)


@contextmanager
def reading_ahead(task: Any, layers: Sequence[int]) -> Iterator[ReadAhead | None]:
    """Read-ahead for a task run where no scan driver set one up (a Ray
    worker runs a `LayerTask` it re-opened, on `layers` only): while the
    block runs, the task's next layer-loads are fetched ahead, with the same
    bound per worker, and abandoned at its end (then left on the task,
    closed: its `most_ahead` says how far it read). Nothing for checkpoints
    on local disk, or a task whose driver reads ahead for it."""
    from ckptscan.storage import RemotePath

    driver = getattr(task, "readahead", None)
    if (driver is not None and not driver.closed) or not any(isinstance(c.path, RemotePath) for c in task.checkpoints):
        yield None
        return
    task.readahead = ahead = ReadAhead(layers, task.used, task.prefetch_load)
    try:
        yield ahead
    finally:
        ahead.close()
