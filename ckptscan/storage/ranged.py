"""The ranged-read engine every store client shares.

Every read goes through `RangedReader.read_ranges`: ranges are coalesced
when adjacent, split into parts of at most `PART_BYTES` so a large tensor is
fetched over several connections, and issued on a thread pool that bounds
the requests in flight (`MAX_IN_FLIGHT`, shared by every caller);
`fetch_ranges` queues them without waiting (the scan's read-ahead). Each part's
length is checked (a store returns the remainder when a range runs past the
end of a short object, and a dropped connection can end a body early); short
or failed parts are retried with exponential backoff and full jitter, after
which one error names the URL, the tensor and the reason.
"""

from __future__ import annotations

import os
import random
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Hashable, Sequence

from ckptscan.errors import CkptScanError
from ckptscan.storage.errors import Denied, NotFound, reason
from ckptscan.storage.remote_path import Listing, ObjectInfo, tree_listings


def setting(name: str, default: float) -> float:
    """A positive number from the environment; the default when unset or not a number."""
    try:
        value = float(os.environ.get(name) or default)
    except ValueError:
        return default
    return value if value > 0 else default


# Ranged GETs in flight at once, over all threads and files. One S3 GET
# streams at roughly 100 MB/s, so aggregate throughput comes from requests
# in flight; S3 serves thousands per second per prefix, far above 32. 32
# parts of at most PART_BYTES bound the bytes being received at once to
# 256 MB; the read-ahead (`ckptscan.storage.readahead`) keeps them busy.
MAX_IN_FLIGHT = max(1, int(setting("CKPTSCAN_MAX_REQUESTS", 32)))
# A part of a range is one request: at most PART_BYTES, large enough that
# per-request latency is amortised; a small read is still spread over
# SPREAD requests (parts of at least MIN_PART_BYTES), so that one layer-load
# is not one ~100 MB/s stream. With read-ahead several layer-loads are in
# flight, so 4 parts each suffice (bench/remote.py, s3like: 8 parts were no
# faster, for twice the requests).
PART_BYTES = 8 << 20
MIN_PART_BYTES = 1 << 20
SPREAD = 4
# Whole tries of one part (the client retries 5xx and throttling inside each).
TRIES = 4
# Per request: a stuck connection fails and is retried instead of hanging the nightly job.
TIMEOUT_S = setting("CKPTSCAN_REQUEST_TIMEOUT", 120.0)


def retry_backoff_s() -> float:
    """The longest wait before the first whole retry of a part (`CKPTSCAN_RETRY_BACKOFF`,
    0.2 s); it doubles for each later one, up to 5 s, and the client's own retries start
    at half of it. Read when used, so that a test that waits through every retry can set
    it small."""
    return setting("CKPTSCAN_RETRY_BACKOFF", 0.2)


# Requests and bytes received by every store in this process (for bench/remote.py).
stats = {"requests": 0, "bytes": 0}
_stats_lock = threading.Lock()



class RangedReader:
    """What every store client shares. Subclasses provide `url`, `_list`
    and `_get` (one ranged GET, returning a buffer); they raise
    `NotFound`/`Denied` for those answers and anything else for a failure
    worth retrying."""

    url: str
    # False where a LIST without delimiter is not a cheap request (http(s):// crawls links).
    lists_trees = True
    _pool: ThreadPoolExecutor | None = None
    _pool_lock = threading.Lock()

    def __init__(self) -> None:
        # Prefix -> listing, taken once (see remote_path.py).
        self.listings: dict[str, Listing] = {}
        self.listings_lock = threading.Lock()
        # Prefixes listed whole (every key under them): a prefix below one of
        # them that has no listing is empty, and costs no request.
        self.trees: set[str] = set()
        # Listings in flight, ("dir" | "tree", prefix) -> future: threads asking
        # for the same one wait for the one request.
        self._listing: dict[tuple[str, str], Future] = {}
        # Reads started before a reader asks for them (`read_early`), by
        # (key, start, end); the reader's identical `read_ranges` takes them.
        self._early: dict[tuple[str, int, int], Fetch] = {}

    def _list(self, prefix: str) -> Listing:
        raise NotImplementedError

    def _list_tree(self, prefix: str) -> list[tuple[str, ObjectInfo]]:
        """Every object under `prefix` ("" or ending in "/"): (key, info)."""
        raise NotImplementedError

    def _get(self, key: str, start: int, end: int) -> Any:
        raise NotImplementedError

    def list_dir(self, prefix: str) -> Listing:
        return self._call(lambda: self._list(prefix), prefix.rstrip("/"), None)

    def listing(self, key: str) -> Listing:
        """The listing of prefix `key` (no trailing "/"): one already taken (of
        it, or of a tree above it) costs nothing; else one LIST."""
        return self.start_listings([key], [])[0].result()

    def start_listings(self, dirs: list[str], trees: list[str]) -> list[Future]:
        """The listings of the prefixes `dirs` (one level) and of everything
        under `trees`, started side by side (one round trip); a future per
        prefix, in that order. Known ones are done futures; one in flight is
        shared, not asked again."""
        futures = []
        with self.listings_lock:
            for kind, key in [("dir", d) for d in dirs] + [("tree", t) for t in trees]:
                if kind == "tree" and not self.lists_trees:
                    kind = "dir"
                known = self._known(key) if kind == "dir" else (True if self._under_tree(key) else None)
                future: Future | None
                if known is not None:
                    future = Future()
                    future.set_result(known)
                else:
                    future = self._listing.get((kind, key))
                    if future is None:
                        work = self._take_dir if kind == "dir" else self._take_tree
                        future = self._listing[(kind, key)] = _shared_pool().submit(work, key)
                futures.append(future)
        return futures

    def _known(self, key: str) -> Listing | None:
        """Under `listings_lock`."""
        found = self.listings.get(key)
        if found is None and self._under_tree(key):
            found = Listing({}, frozenset())
        return found

    def _under_tree(self, key: str) -> bool:
        parts = key.split("/") if key else []
        return any("/".join(parts[:n]) in self.trees for n in range(len(parts) + 1))

    def _take_dir(self, key: str) -> Listing:
        try:
            found = self.list_dir(f"{key}/" if key else "")
            with self.listings_lock:
                self.listings[key] = found
            return found
        finally:
            with self.listings_lock:
                self._listing.pop(("dir", key), None)

    def _take_tree(self, key: str) -> bool:
        try:
            objects = self._call(lambda: self._list_tree(f"{key}/" if key else ""), key, None)
            with self.listings_lock:
                # A prefix already listed keeps its listing: what a reader saw stays the snapshot it reads.
                for prefix, found in tree_listings(key, objects).items():
                    self.listings.setdefault(prefix, found)
                self.trees.add(key)
            return True
        finally:
            with self.listings_lock:
                self._listing.pop(("tree", key), None)

    def read_early(self, key: str, start: int, end: int) -> None:
        """Start reading bytes [start, end) of `key` now, for a reader that will
        ask for exactly that range (`read_ranges(key, [(start, end)])`): the
        requests of an open go out side by side instead of one after another.
        A failure is raised where the reader asks, as its own read would."""
        with self.listings_lock:
            if (key, start, end) not in self._early:
                self._early[(key, start, end)] = self.fetch_ranges(key, [(start, end)])

    def read_ranges(self, key: str, ranges: list[tuple[int, int]],
                    what: str | list[str] | None = None) -> list[memoryview]:
        """`what`: the tensor read (or one name per range), for error messages."""
        if len(ranges) == 1:
            with self.listings_lock:
                early = self._early.pop((key, *ranges[0]), None)
            if early is not None:
                return early.result()
        return self.fetch_ranges(key, ranges, what).result()

    def fetch_ranges(self, key: str, ranges: list[tuple[int, int]],
                     what: str | list[str] | None = None) -> Fetch:
        """`read_ranges` without waiting: the requests are queued on the shared
        pool now, and `Fetch.result()` waits for them (raising a failed one's
        error there) or `Fetch.cancel()` drops those not yet sent."""
        parts = plan_parts(ranges)
        names = [what] * len(ranges) if what is None or isinstance(what, str) else what

        def tensors_in(part: tuple[int, int]) -> str | None:
            inside = dict.fromkeys(n for n, (s, e) in zip(names, ranges) if n and s < part[1] and e > part[0])
            return ", ".join(inside) or None

        pool = _shared_pool()
        return Fetch(ranges, parts, [pool.submit(self._read_part, key, *part, tensors_in(part)) for part in parts])

    def _read_part(self, key: str, start: int, end: int, what: str | None) -> memoryview:
        def fetch() -> memoryview:
            data = memoryview(self._get(key, start, end))
            with _stats_lock:
                stats["requests"] += 1
                stats["bytes"] += data.nbytes
            if data.nbytes != end - start:
                raise ShortRead(f"got {data.nbytes} of the {end - start} bytes asked for at offset {start} "
                                "(object shorter than expected, or the response was cut)")
            return data

        return self._call(fetch, key, what)

    def _call(self, fn: Any, key: str, what: str | None) -> Any:
        where = f"{self.url}/{key}" if key else self.url
        for attempt in range(TRIES):
            try:
                return fn()
            except NotFound:
                raise CkptScanError("no such object", path=where, tensor=what) from None
            except Denied as e:
                raise CkptScanError(f"access denied ({reason(e)}); check the credentials (environment, profile or "
                                    "instance role) and that they may read this bucket", path=where,
                                    tensor=what) from None
            except Exception as e:  # throttling, 5xx, timeouts, cut responses: retried
                if attempt == TRIES - 1:
                    raise CkptScanError(f"read failed after {TRIES} tries: {reason(e)}", path=where,
                                        tensor=what) from None
                # Exponential backoff with full jitter (AWS architecture blog).
                time.sleep(random.uniform(0, min(5.0, retry_backoff_s() * 2 ** attempt)))
        raise AssertionError("unreachable")


class ShortRead(Exception):
    pass


class Fetch:
    """The ranged GETs of one `fetch_ranges` call, queued or in flight."""

    def __init__(self, ranges: list[tuple[int, int]], parts: list[tuple[int, int]], futures: list[Future]):
        self.ranges, self.parts, self.futures = ranges, parts, futures
        self._out: list[memoryview] | None = None
        self._error: BaseException | None = None  # a failure, raised again for every range it spoiled
        self._lock = threading.Lock()

    def result(self) -> list[memoryview]:
        """The bytes of each range, once every part has arrived; the first
        failed part's error (a `CkptScanError` naming URL and tensor) is raised
        here, and the parts not yet sent are then cancelled."""
        with self._lock:
            if self._error is not None:
                raise self._error
            if self._out is None:
                try:
                    fetched = [future.result() for future in self.futures]
                except Exception as e:
                    self.cancel()
                    self._error = e
                    raise
                self._out = _assemble(self.ranges, self.parts, fetched)
            return self._out

    def cancel(self) -> None:
        """Drop the parts not yet sent (a request in flight ends by itself)."""
        for future in self.futures:
            future.cancel()


def abandoner(lock: threading.Lock, prefetched: dict, started: Sequence[tuple[Fetch, Sequence[Hashable]]]
              ) -> Callable[[], None]:
    """What a reader's `prefetch` returns: a function that cancels the
    fetches it `started` ((fetch, the keys it filed in `prefetched`)) and
    forgets the bytes no read has taken yet, under the reader's `lock`."""
    def abandon() -> None:
        with lock:
            for fetch, keys in started:
                fetch.cancel()
                for key in keys:
                    if prefetched.get(key, (None,))[0] is fetch:
                        del prefetched[key]
    return abandon


def _assemble(ranges: list[tuple[int, int]], parts: list[tuple[int, int]],
              fetched: list[memoryview]) -> list[memoryview]:
    by_start = dict(zip(parts, fetched))
    out = []
    for start, end in ranges:
        if end <= start:
            out.append(memoryview(b""))
            continue
        # The parts inside [start, end): one zero-copy view when a range is
        # exactly one part, else copied together once.
        inside = [(s, e) for s, e in parts if s < end and e > start]
        if len(inside) == 1 and inside[0] == (start, end):
            out.append(by_start[inside[0]])
            continue
        buf = bytearray(end - start)
        for s, e in inside:
            lo, hi = max(s, start), min(e, end)
            buf[lo - start:hi - start] = by_start[(s, e)][lo - s:hi - s]
        out.append(memoryview(buf))
    return out



def plan_parts(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The requests for `ranges`: adjacent or overlapping ones merged (never
    across a gap: every byte fetched is a byte asked for), then cut into
    equal parts of at most PART_BYTES, about SPREAD of them in all when the
    ranges are small (never below MIN_PART_BYTES)."""
    merged: list[list[int]] = []
    for start, end in sorted(r for r in ranges if r[1] > r[0]):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    total = sum(end - start for start, end in merged)
    part_bytes = min(PART_BYTES, max(MIN_PART_BYTES, -(-total // SPREAD)))
    parts: list[tuple[int, int]] = []
    for start, end in merged:
        count = -(-(end - start) // part_bytes)
        step = -(-(end - start) // count)
        parts.extend((s, min(s + step, end)) for s in range(start, end, step))
    return parts


def _shared_pool() -> ThreadPoolExecutor:
    with RangedReader._pool_lock:
        if RangedReader._pool is None:
            RangedReader._pool = ThreadPoolExecutor(MAX_IN_FLIGHT, thread_name_prefix="ckptscan-get")
        return RangedReader._pool
