"""Follow a live run: judge the series again each time a checkpoint completes.

    for event in watch_run("runs/main", ScanOptions()):
        for i in event.new:
            print(event.report.pairs[i].to_step, event.report.pairs[i].status)

A checkpoint directory (the names `discovery` knows: checkpoint-N, global_stepN,
iter_N, step-N, stepN) joins the series once it is complete:

- when the run has a framework pointer file (DeepSpeed `latest`, Megatron
  `latest_checkpointed_iteration.txt`), once the pointer names its step or a
  later one: frameworks write it after every shard is on disk;
- otherwise once it opens (a safetensors index and every shard it names, each
  as long as its header declares; a torch zip with its central directory at
  the end; OLMo-core's `.metadata.json`, written last) and none of its files
  has changed size or modification time for `settle` seconds.

Staging directories (HF Trainer's tmp-checkpoint-N, renamed when complete)
are not checkpoints until renamed. Checkpoints join in step order: a newer one
waits behind an older one still being written, so each pair is formed once
and its row never changes (the rules look only backward).

Each look is resolve + compute + judge: the run spec of the checkpoints so far
(`run_spec`, so the growing loss log is read again), the metrics of the
previous look grown by the pairs this one forms (each resolved and computed
once, `Watcher._grow`, `SeriesCache`), and the new pairs judged from the judge
state the previous look left (`SeriesJudge`; with a disk cache, also kept
there, so a restarted watch goes on without judging the run again), so the
summary, the gate and the JSON report always cover the run so far.

Wake-ups: watchdog (inotify on Linux) when it is installed (`pip install
'ckptscan[watch]'`), else polling every `interval` seconds; with watchdog a
look still happens every `interval` seconds, in case events are missed (some
network filesystems send none).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Generator, Sequence

from ckptscan.pipeline.api import resolve_references
from ckptscan.caches.pair_cache import PairCache
from ckptscan.caches.judge_cache import JudgeCache
from ckptscan.pipeline.metrics import Metrics, compute, pair_settings
from ckptscan.monitors import registry
from ckptscan.detection.judge import SeriesJudge
from ckptscan.pipeline.discovery import checkpoint_folder, newest_complete, run_directory
from ckptscan.errors import CkptScanError
from ckptscan.system.paths import expand_path
from ckptscan.readers import Checkpoint, open_checkpoint, step_from_name
from ckptscan.schema.results import CheckpointRef, LayerResult, ScanReport
from ckptscan.pipeline.request import ScanRequest
from ckptscan.pipeline.run import RunSpec, plan_pairs, run_spec
from ckptscan.scan import ScanOptions

# Looks at most this often however many filesystem events arrive (a shard
# being written sends one per write).
MIN_LOOK_GAP_S = 0.05
# A folder name's step (`step_from_name`), parsed once per name.
_step = functools.lru_cache(maxsize=1 << 16)(step_from_name)
# Filesystem events that mean a change. Not "opened" / "closed_no_write":
# a look opens the files of a checkpoint still being written, and must not
# wake itself.
CHANGES = frozenset({"created", "modified", "moved", "deleted", "closed"})


@dataclass
class WatchEvent:
    """The series judged after new pairs appeared."""

    report: ScanReport  # every pair so far, judged together
    new: list[int]  # indices into report.pairs of the pairs this event added
    spec: RunSpec  # what was judged (its config holds the gate's fail_on)


@dataclass
class _Seen:
    """A checkpoint that opened, waiting for its files to stay unchanged."""

    files: tuple[tuple[str, int, int], ...]
    since: float


class SeriesCache:
    """compute()'s cache while watching: each pair is computed once.

    Pairs computed in this session are kept in memory by checkpoint path, not
    by file identity: a trainer that keeps only its last few checkpoints
    (HF `save_total_limit`) deletes older ones, and their pairs must still be
    judged. Other pairs come from the on-disk `PairCache` when one is given.
    """

    def __init__(self, disk: PairCache | None = None) -> None:
        self.disk = disk
        self.hits = 0
        self.misses = 0
        self._pairs: dict[str, list[LayerResult]] = {}

    def key(self, older: Checkpoint, newer: Checkpoint, settings: dict[str, str]) -> dict[str, Any]:
        return {"older": older, "newer": newer, "settings": settings,
                "id": json.dumps([str(older.path), str(newer.path), settings], sort_keys=True)}

    def keys(self, checkpoints: Sequence[Checkpoint], pairs: Sequence[tuple[int, int]], settings: dict[str, str]
             ) -> list[dict[str, Any]]:
        return [self.key(checkpoints[a], checkpoints[b], settings) for a, b in pairs]

    def identity(self, key: dict[str, Any]) -> str:
        """The pair's name in the disk cache (where judged pairs are kept beside it), else in this session."""
        return self.disk.identity(self._disk_key(key)) if self.disk is not None else key["id"]

    def get_many(self, keys: list[dict[str, Any]]) -> list[list[LayerResult] | None]:
        """Pairs of this session from memory, the others from the disk cache (its pack in one read)."""
        found: list[list[LayerResult] | None] = [self._pairs.get(key["id"]) for key in keys]
        elsewhere = [i for i, layers in enumerate(found) if layers is None]
        if elsewhere and self.disk is not None:
            for i, layers in zip(elsewhere, self.disk.get_many([self._disk_key(keys[i]) for i in elsewhere])):
                if layers is not None:
                    found[i] = self._pairs[keys[i]["id"]] = layers
        missed = sum(layers is None for layers in found)
        self.hits += len(found) - missed
        self.misses += missed
        return found

    def put(self, key: dict[str, Any], layers: list[LayerResult]) -> None:
        self._pairs[key["id"]] = layers
        if self.disk is not None:
            self.disk.put(self._disk_key(key), layers)

    def pack(self, keys: list[dict[str, Any]], layers: list[list[LayerResult]]) -> None:
        """Only a whole run is packed: a later look computes its new pairs
        alone, and their pack would replace the run's."""
        if self.disk is not None and len(keys) >= len(self._pairs):
            self.disk.pack([self._disk_key(key) for key in keys], layers)

    def get_layers(self, key: dict[str, Any]) -> dict[int, LayerResult]:
        """Layers an interrupted run left of an unfinished pair (from the disk cache only)."""
        return self.disk.get_layers(self._disk_key(key)) if self.disk is not None else {}

    def put_layer(self, key: dict[str, Any], layer: LayerResult) -> None:
        if self.disk is not None:
            self.disk.put_layer(self._disk_key(key), layer)

    def _disk_key(self, key: dict[str, Any]) -> dict[str, Any]:
        if "disk" not in key and self.disk is not None:
            key["disk"] = self.disk.key(key["older"], key["newer"], key["settings"])
        return key["disk"]


@dataclass
class Watcher:
    """The state of one watch: the series so far and the checkpoints coming in."""

    run_dir: Path
    # What to scan and how to judge it, its references resolved (`api.resolve_references`).
    request: ScanRequest = field(default_factory=ScanRequest)
    cache: SeriesCache = field(default_factory=SeriesCache)
    interval: float = 2.0  # seconds between looks without events
    settle: float = 0.5  # seconds a checkpoint without pointer file must stay unchanged
    notify: Callable[[str], None] = lambda message: None  # why a checkpoint is waited for, which side files
    progress: Callable[[int, int], None] | None = None
    series: list[Checkpoint] = field(default_factory=list)
    judged: int = 0  # pairs judged so far
    judging: SeriesJudge = field(default_factory=SeriesJudge)  # the judge state, carried from look to look
    _metrics: Metrics | None = None  # the series' metrics so far, grown by each look's new pairs
    _settings: dict[str, str] | None = None  # what decided their numbers (`pair_settings`)
    _judge_cache: JudgeCache | None = None
    _folder: Path | None = None  # the folder of the series' checkpoints (`checkpoint_folder`)
    _seen: dict[Path, _Seen] = field(default_factory=dict)
    _waiting: dict[Path, str] = field(default_factory=dict)
    _notes: set[str] = field(default_factory=set)

    def look(self) -> list[Checkpoint]:
        """Add the checkpoints complete since the last look to the series; return them."""
        if not self.run_dir.is_dir():
            raise CkptScanError("not a run directory (or it was removed while watching)", path=self.run_dir)
        last = self.series[-1].step if self.series else None
        try:
            # Where the checkpoints are is settled once one joined the series (a
            # listing of its own at every look, at thousands of checkpoints).
            folder = self._folder if self.series and self._folder is not None else checkpoint_folder(self.run_dir)
            self._folder = folder
            # Names only, each name's step parsed once per watch: a look at a folder of
            # thousands of checkpoints stats and opens only those newer than the series.
            steps = {name: step for name in os.listdir(folder) if (step := _step(name)) is not None}
            pointer = newest_complete(folder, set(steps.values()))
            # In the series already, or older than it: a pair is never formed twice.
            entries = sorted((step, folder / name) for name, step in steps.items()
                             if (last is None or step > last) and (folder / name).is_dir())
        except OSError as e:  # removed or unreadable between the check and the listing
            raise CkptScanError(f"cannot list the run directory: {e.strerror or e}", path=self.run_dir) from None
        joined: list[Checkpoint] = []
        examined, blocked = set(), False
        now = time.monotonic()  # one time per look: what opened in one look settles together
        for step, entry in entries:
            examined.add(entry)
            checkpoint = self._complete(entry, step, pointer, now)
            if checkpoint is None:  # newer checkpoints wait behind an unfinished one (they still settle meanwhile)
                blocked = True
            elif not blocked:
                joined.append(checkpoint)
        # Forget what was not looked at (removed, or joined the series).
        self._seen = {entry: seen for entry, seen in self._seen.items() if entry in examined}
        self.series += joined
        return joined

    def judge_series(self) -> WatchEvent | None:
        """compute + judge of the series; None when it holds no new pair (the stride's, or a first checkpoint)."""
        pairs = plan_pairs(len(self.series), self.request.stride, self.request.base)
        if len(pairs) <= self.judged:
            return None
        spec = run_spec(self.run_dir, self.series, self.request)
        for message in spec.notes:
            if message not in self._notes:
                self._notes.add(message)
                self.notify(message)
        metrics = self._grow(spec)
        self.judging.use(self.request.thresholds or spec.config.thresholds, spec.references)
        if self.cache.disk is not None:  # a restarted watch goes on from the judged pairs on disk
            if self._judge_cache is None:
                self._judge_cache = JudgeCache(self.cache.disk.directory)
            report = self._judge_cache.report(self.judging, metrics)
        else:
            report = self.judging.report(metrics)
        event = WatchEvent(report, list(range(self.judged, len(pairs))), spec)
        self.judged = len(pairs)
        return event

    def _grow(self, spec: RunSpec) -> Metrics:
        """The metrics of `spec`: those of the previous look with the new
        pairs added (computed from their two checkpoints alone), so a look
        costs the same in a run of 20 checkpoints and of 2,000. Every pair is
        computed again (from the cache where it has them) on the first look,
        and when what decides a pair's numbers changed (the probe file).

        A pair is resolved once, when it is formed: later looks keep its
        numbers and cache identity even if one of its checkpoints is deleted
        (`save_total_limit`) or rewritten in place; a checkpoint that joins
        later is read as it is then."""
        options = self.request.options
        settings = pair_settings(options, spec)
        kept = self._metrics
        if kept is None or settings != self._settings or len(spec.pairs) < len(kept.pairs):
            kept = compute(spec, options, cache=self.cache, progress=self.progress)
        else:
            new = spec.pairs[len(kept.pairs):]
            needed = sorted({i for pair in new for i in pair})
            position = {i: k for k, i in enumerate(needed)}
            part = dataclasses.replace(spec, checkpoints=[spec.checkpoints[i] for i in needed],
                                       pairs=[(position[a], position[b]) for a, b in new])
            fresh = compute(part, options, cache=self.cache, progress=self.progress)
            kept.checkpoints.extend(CheckpointRef(str(c.path), c.step)
                                    for c in spec.checkpoints[len(kept.checkpoints):])
            kept.pairs.extend(fresh.pairs)
            kept.cached.extend(fresh.cached)
            kept.pair_keys.extend(fresh.pair_keys)
            if spec.loss_log is not None or kept.loss_log is not None:  # the log grows: as compute() reads it
                for pair in kept.pairs[:-len(fresh.pairs) or None]:
                    if spec.loss_log is not None:
                        spec.loss_log.annotate(pair)
                    else:
                        pair.loss = pair.lr = None
                    registry.fill(pair)  # per unit of the LR just read
            kept = dataclasses.replace(kept, model=fresh.model, skipped=fresh.skipped, settings=fresh.settings,
                                       probe=fresh.probe, loss_log=fresh.loss_log)
        self._metrics, self._settings = kept, settings
        return kept

    def awaiting_settle(self, now: float) -> float | None:
        """Seconds until the next checkpoint that opened may count as settled."""
        if not self._seen:
            return None
        return max(0.0, min(seen.since + self.settle for seen in self._seen.values()) - now)

    def _complete(self, entry: Path, step: int, pointer: int | None, now: float) -> Checkpoint | None:
        """The opened checkpoint when it is complete, else None (noted once per reason)."""
        if pointer is not None and step > pointer:
            self._wait(entry, f"newer than the framework's pointer file (step {pointer})")
            return None
        files = _files(entry)
        try:
            checkpoint = open_checkpoint(entry)
        except (CkptScanError, OSError) as e:  # OSError: a file removed while opened (a save retried)
            self._seen.pop(entry, None)
            self._wait(entry, str(e))
            return None
        checkpoint.step = step
        if pointer is None:
            # No completion marker: complete once nothing changed for `settle`
            # seconds, over at least two looks (the files seen before and after
            # opening must match the ones seen before).
            seen = self._seen.get(entry)
            if seen is None or seen.files != files or _files(entry) != files:
                self._seen[entry] = _Seen(files, now)
                return None
            if now - seen.since < self.settle:
                return None
        self._seen.pop(entry, None)
        self._waiting.pop(entry, None)
        return checkpoint

    def _wait(self, entry: Path, reason: str) -> None:
        """Say why a checkpoint is waited for, when the reason is new (sizes aside)."""
        kind = re.sub(r"\d+", "#", reason)
        if self._waiting.get(entry) != kind:
            self._waiting[entry] = kind
            self.notify(f"waiting for {entry.name}: {reason}")


def watch_run(
    run_dir: str | Path,
    request: ScanRequest | ScanOptions | None = None,
    *,
    timeout: float | None = None,
    events: bool | None = None,
    notify: Callable[[str], None] | None = None,
    progress: Callable[[int, int], None] | None = None,
    on_start: Callable[[str], None] | None = None,
    **fields: Any,
) -> Generator[WatchEvent, None, None]:
    """Yield a judged `WatchEvent` each time new checkpoints of `run_dir` complete.

    Checkpoints already complete at the start form the first event. Ends
    when no checkpoint completed for `timeout` seconds (None: never; stop
    it by closing the generator, or with Ctrl-C). `events`: wake on
    filesystem events (True: required, None: when watchdog is installed,
    False: poll). `on_start` is told how it waits ("inotify", "polling every
    2 s"). `request`: what to scan and how to judge it (or its `options`);
    `fields`: the watch's pace (`interval`, seconds between looks, 2.0;
    `settle`, seconds a checkpoint without pointer file must stay
    unchanged, 0.5), or, without a request, the request's fields (stride,
    base, probe, loss_log, reference, config, settings, thresholds, cache).
    A reference run is scanned once, before the first look.
    """
    interval, settle = fields.pop("interval", 2.0), fields.pop("settle", 0.5)
    request = ScanRequest.given(request, fields)
    run_dir = expand_path(run_dir)  # a local directory: watching needs its filesystem events
    run_directory(run_dir)  # it exists, and is a directory
    if interval <= 0 or settle < 0:
        raise CkptScanError(f"--interval must be > 0 and --settle ≥ 0 (got {interval}, {settle})")
    plan_pairs(2, request.stride, request.base)  # a bad --stride / --base is an error now, not at the first pair
    watcher = Watcher(run_dir, resolve_references(request), cache=SeriesCache(request.cache), interval=interval,
                      settle=settle, notify=notify or (lambda message: None), progress=progress)
    wake = threading.Event()
    observer, mode = _observe(run_dir, wake, events, interval)
    if on_start is not None:
        on_start(mode)
    try:
        idle_since = time.monotonic()
        while True:
            wake.clear()
            last_look = time.monotonic()
            if watcher.look():
                event = watcher.judge_series()
                idle_since = time.monotonic()
                if event is not None:
                    yield event
                continue  # more may have completed meanwhile
            now = time.monotonic()
            if timeout is not None and now - idle_since >= timeout:
                return
            wait = interval
            settling = watcher.awaiting_settle(now)
            if settling is not None:
                wait = min(wait, settling)
            if timeout is not None:
                wait = min(wait, idle_since + timeout - now)
            if wake.wait(wait):
                # An event: look soon, but not once per written block.
                time.sleep(max(0.0, last_look + MIN_LOOK_GAP_S - time.monotonic()))
    finally:
        if observer is not None:
            observer.stop()
            observer.join()


class Wake:
    """A watchdog event handler: sets `wake` on a change, not on a mere read."""

    def __init__(self, wake: threading.Event) -> None:
        self.wake = wake

    def dispatch(self, event: Any) -> None:
        if event.event_type in CHANGES:
            self.wake.set()


def _observe(run_dir: Path, wake: threading.Event, events: bool | None, interval: float) -> tuple[Any, str]:
    """A watchdog observer that sets `wake` on any change under `run_dir`,
    and how the watch waits."""
    polling = f"polling every {interval:g} s"
    if events is False:
        return None, polling
    try:
        from watchdog.observers import Observer
    except ImportError:
        if events:
            raise CkptScanError("filesystem events need watchdog: pip install 'ckptscan[watch]'") from None
        return None, polling + " (pip install 'ckptscan[watch]' for inotify)"

    observer = Observer()
    try:
        # Wake is a handler by its dispatch alone: watchdog, optional, is imported only here.
        observer.schedule(Wake(wake), str(run_dir), recursive=True)  # type: ignore[arg-type]
        observer.start()
    except OSError as e:  # e.g. the inotify watch limit
        if events:
            raise CkptScanError(f"cannot watch for filesystem events: {e.strerror or e}", path=run_dir) from None
        return None, f"{polling} (filesystem events unavailable: {e.strerror or e})"
    name = type(observer).__name__.removesuffix("Observer").lower() or "events"
    return observer, f"{name} events, and a look every {interval:g} s"


def _files(entry: Path) -> tuple[tuple[str, int, int], ...]:
    """Every file under a checkpoint directory with its size and mtime."""
    found = []
    for path in entry.rglob("*"):
        try:
            st = path.stat()
        except OSError:  # removed between listing and stat: the next look sees it
            continue
        if stat.S_ISREG(st.st_mode):
            found.append((str(path.relative_to(entry)), st.st_size, st.st_mtime_ns))
    return tuple(sorted(found))
