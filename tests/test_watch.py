"""Following a live run (ckptscan/pipeline/watch.py): when a checkpoint counts as
complete, the order checkpoints join the series, each pair computed once,
and the series judged exactly as `scan_run` judges the finished run."""

import dataclasses
import json
import queue
import shutil
import sys
import threading

import pytest

from ckptscan.pipeline.api import scan_pair, scan_run
from ckptscan.caches.pair_cache import PairCache
from ckptscan.detection.state import JudgeState
from ckptscan.errors import CkptScanError
from ckptscan.pipeline.request import ScanRequest
from ckptscan.pipeline.watch import SeriesCache, Wake, Watcher, watch_run

from writer_process import GUARD_S, Writer
from run_factory import write_run

STEPS = [0, 100, 200, 300, 400, 500]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A finished run (two shards per checkpoint) whose files the tests publish one by one."""
    return write_run(tmp_path_factory.mktemp("source") / "run", count=len(STEPS), shards=2)


@pytest.fixture
def writer(source, tmp_path):
    writer = Writer(source, tmp_path / "run")
    yield writer
    writer.close()


def steps(watcher):
    return [c.step for c in watcher.series]


def shard(step, i):
    return f"checkpoint-{step}/model-0000{i}-of-00002.safetensors"


def test_complete_checkpoints_join_after_their_files_settled(writer):
    for step in STEPS[:3]:
        writer.publish(f"checkpoint-{step}")
    watcher = Watcher(writer.target, settle=3600)
    assert watcher.look() == [] and watcher.series == []  # opened, but not yet unchanged for `settle`
    watcher.settle = 0
    assert steps(watcher) == [] and [c.step for c in watcher.look()] == STEPS[:3]
    assert watcher.look() == []  # each joins once


def test_a_file_that_changes_restarts_the_wait(writer):
    writer.publish("checkpoint-0")
    watcher = Watcher(writer.target, settle=0)
    watcher.look()  # seen once
    writer.send("text checkpoint-0/trainer_state.json {}")  # the trainer is still saving
    assert watcher.look() == []
    assert steps(watcher) == [] and [c.step for c in watcher.look()] == [0]


def test_a_late_shard_and_a_growing_file_are_waited_for(writer, source):
    notes = []
    writer.publish("checkpoint-0")
    watcher = Watcher(writer.target, settle=0, notify=notes.append)
    watcher.look(), watcher.look()
    assert steps(watcher) == [0]
    # The index and the first shard: the second shard has not appeared yet.
    writer.send("copy checkpoint-100/config.json")
    writer.send(f"copy {shard(100, 1)}")
    writer.send("copy checkpoint-100/model.safetensors.index.json")
    assert watcher.look() == [] and watcher.look() == []
    assert "names shard 'model-00002-of-00002.safetensors', which does not exist" in notes[-1]
    # The second shard half written: its header declares more bytes than it has.
    size = (source / shard(100, 2)).stat().st_size
    writer.send(f"head {shard(100, 2)} {size // 2}")
    assert watcher.look() == [] and watcher.look() == []
    assert "truncated: the header declares" in notes[-1] and notes[-1].startswith("waiting for checkpoint-100:")
    writer.send(f"head {shard(100, 2)} {size - 1}")
    assert watcher.look() == [] and watcher.look() == []
    assert len(notes) == 2, "a file growing is the same reason: noted once"
    writer.send(f"rest {shard(100, 2)}")
    watcher.look(), watcher.look()
    assert steps(watcher) == [0, 100]


def test_newer_checkpoints_wait_behind_an_unfinished_one(writer):
    writer.publish("checkpoint-0")
    writer.send("copy checkpoint-100/model.safetensors.index.json")  # 100: only its index so far
    writer.publish("checkpoint-200")
    watcher = Watcher(writer.target, settle=0)
    watcher.look(), watcher.look()
    assert steps(watcher) == [0]
    writer.publish("checkpoint-100")
    watcher.look(), watcher.look()
    assert steps(watcher) == [0, 100, 200]


def test_the_frameworks_pointer_file_marks_completion(writer):
    """Megatron's latest_checkpointed_iteration.txt (DeepSpeed's `latest` alike)
    is written after every shard: no settling, and nothing past it joins."""
    notes = []
    for step in STEPS[:3]:
        writer.publish(f"checkpoint-{step}")
    writer.send("text latest_checkpointed_iteration.txt 100")
    watcher = Watcher(writer.target, settle=3600, notify=notes.append)
    assert [c.step for c in watcher.look()] == [0, 100]
    assert watcher.look() == []
    assert notes == ["waiting for checkpoint-200: newer than the framework's pointer file (step 100)"]
    writer.send("text latest_checkpointed_iteration.txt 200")
    assert [c.step for c in watcher.look()] == [200]


def test_a_staging_directory_joins_once_renamed(writer):
    """HF Trainer saves into tmp-checkpoint-N and renames it when complete."""
    writer.publish("checkpoint-0")
    writer.publish("checkpoint-100")
    writer.send("rename checkpoint-100 tmp-checkpoint-100")
    watcher = Watcher(writer.target, settle=0)
    watcher.look(), watcher.look()
    assert steps(watcher) == [0]
    writer.send("rename tmp-checkpoint-100 checkpoint-100")
    watcher.look(), watcher.look()
    assert steps(watcher) == [0, 100]


def test_the_series_is_judged_as_scan_run_judges_the_finished_run(writer):
    def verdicts(report):
        return [(pair.status, [(layer.status, layer.findings) for layer in pair.layers]) for pair in report.pairs]

    cache = SeriesCache()
    watcher = Watcher(writer.target, settle=0, cache=cache)
    seen = []  # each event's verdicts as they were when it came (a report's lists grow with the next look's)
    for step in STEPS:
        writer.publish(f"checkpoint-{step}")
        watcher.look(), watcher.look()
        event = watcher.judge_series()
        if step == 0:
            assert event is None  # one checkpoint: no pair yet
            continue
        assert event.new == [len(event.report.pairs) - 1]
        seen.append(verdicts(event.report))
    assert cache.misses == len(STEPS) - 1, "each pair computed once"
    finished = scan_run(writer.target)
    assert dataclasses.asdict(event.report) == dataclasses.asdict(finished)
    # The rules look only backward: a pair's verdict never changes as the run grows,
    # so the row printed when it was judged stays true.
    for earlier in seen:
        assert earlier == verdicts(finished)[:len(earlier)]


def test_deleted_older_checkpoints_keep_their_judged_pairs(writer):
    """HF Trainer's save_total_limit removes old checkpoints while the run goes on."""
    watcher = Watcher(writer.target, settle=0)
    for step in STEPS[:3]:
        writer.publish(f"checkpoint-{step}")
    watcher.look(), watcher.look()
    assert len(watcher.judge_series().report.pairs) == 2
    writer.send("remove checkpoint-0")
    writer.publish("checkpoint-300")
    watcher.look(), watcher.look()
    event = watcher.judge_series()
    assert [p.to_step for p in event.report.pairs] == [100, 200, 300] and event.new == [2]


def test_a_look_computes_and_resolves_only_the_pairs_it_forms(writer):
    """The pairs of earlier looks are kept, not looked up again (a look in a
    run of 2,000 checkpoints costs what it costs in one of 20)."""
    cache = SeriesCache()
    watcher = Watcher(writer.target, settle=0, cache=cache)
    for step in STEPS:
        writer.publish(f"checkpoint-{step}")
        watcher.look(), watcher.look()
        watcher.judge_series()
    assert (cache.misses, cache.hits) == (len(STEPS) - 1, 0)


def numbers(layer):
    """A layer's metrics, without what judging wrote."""
    return {k: v for k, v in dataclasses.asdict(layer).items() if k not in ("findings", "status", "judgements")}


def test_a_checkpoint_rewritten_in_place_keeps_its_pairs_and_is_read_anew_by_the_next(writer, source):
    """A restarted trainer saves checkpoint-200 again, with other weights: the
    pairs judged before keep their numbers (their rows were printed), and the
    pair it forms with the next checkpoint reads it as it is now."""
    watcher = Watcher(writer.target, settle=0)
    for step in STEPS[:3]:
        writer.publish(f"checkpoint-{step}")
    watcher.look(), watcher.look()
    before = [[numbers(layer) for layer in pair.layers] for pair in watcher.judge_series().report.pairs]
    shutil.rmtree(writer.target / "checkpoint-200")
    shutil.copytree(source / "checkpoint-500", writer.target / "checkpoint-200")
    writer.publish("checkpoint-300")
    watcher.look(), watcher.look()
    event = watcher.judge_series()
    assert event.new == [2]
    assert [[numbers(layer) for layer in pair.layers] for pair in event.report.pairs[:2]] == before
    alone = scan_pair(writer.target / "checkpoint-200", writer.target / "checkpoint-300")
    assert [numbers(layer) for layer in event.report.pairs[2].layers] == \
        [numbers(layer) for layer in alone.pairs[0].layers]
    assert [numbers(layer) for layer in event.report.pairs[2].layers] != before[1]


def test_stride_waits_for_the_next_checkpoint_on_it(writer):
    watcher = Watcher(writer.target, ScanRequest(stride=2), settle=0)
    for step in STEPS[:3]:
        writer.publish(f"checkpoint-{step}")
    watcher.look(), watcher.look()
    event = watcher.judge_series()
    assert [(p.from_step, p.to_step) for p in event.report.pairs] == [(0, 200)]
    writer.publish("checkpoint-300")
    watcher.look(), watcher.look()
    assert watcher.judge_series() is None  # 300 is off the stride: no new pair


def _follow(writer, **kwargs):
    """watch_run in a thread; its events (or its error) on a queue."""
    events: queue.Queue = queue.Queue()
    started = threading.Event()
    modes = []

    def run():
        try:
            for event in watch_run(writer.target, settle=0.05,
                                   on_start=lambda mode: (modes.append(mode), started.set()), **kwargs):
                events.put(event)
            events.put("ended")
        except Exception as e:  # noqa: BLE001 - handed to the test
            events.put(e)
            started.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(GUARD_S)
    return events, modes, thread


@pytest.mark.parametrize("events", [True, False], ids=["inotify", "polling"])
def test_watch_run_yields_each_completed_checkpoint(writer, events):
    for step in STEPS[:2]:
        writer.publish(f"checkpoint-{step}")
    # With events, a look every hour: only filesystem events can wake it in time.
    interval = 3600 if events else 0.05
    found, modes, thread = _follow(writer, events=events, interval=interval)
    assert modes == ["inotify events, and a look every 3600 s"] if events else ["polling every 0.05 s"]
    first = found.get(timeout=GUARD_S)
    assert [p.to_step for p in first.report.pairs] == [100] and first.new == [0]
    for k, step in enumerate(STEPS[2:], start=1):
        writer.publish(f"checkpoint-{step}")
        event = found.get(timeout=GUARD_S)
        assert event.new == [k] and event.report.pairs[k].to_step == step
    shutil.rmtree(writer.target)  # the run removed while watched: an error, and the watch ends
    assert isinstance(error := found.get(timeout=GUARD_S), CkptScanError) and "not a run directory" in str(error)
    thread.join(GUARD_S)


def test_timeout_ends_the_watch_when_no_checkpoint_completes(writer):
    for step in STEPS[:2]:
        writer.publish(f"checkpoint-{step}")
    found, _, _ = _follow(writer, events=False, interval=0.05, timeout=2)
    assert found.get(timeout=GUARD_S).new == [0]
    assert found.get(timeout=GUARD_S) == "ended"


def test_without_watchdog_it_polls(writer, monkeypatch):
    monkeypatch.setitem(sys.modules, "watchdog.observers", None)  # as if not installed: import fails
    writer.publish("checkpoint-0")
    found, modes, _ = _follow(writer, interval=0.05, timeout=0.2)
    assert modes == ["polling every 0.05 s (pip install 'ckptscan[watch]' for inotify)"]
    assert found.get(timeout=GUARD_S) == "ended"
    with pytest.raises(CkptScanError, match="filesystem events need watchdog"):
        next(watch_run(writer.target, events=True))


@pytest.mark.parametrize("kwargs, message", [
    ({"interval": 0}, "--interval must be > 0"),
    ({"stride": 0}, "--stride must be"),
])
def test_bad_settings_are_errors_at_once(tmp_path, kwargs, message):
    with pytest.raises(CkptScanError, match=message):
        next(watch_run(tmp_path, **kwargs))


def test_a_missing_directory_does_not_exist(tmp_path):
    with pytest.raises(CkptScanError, match="missing: does not exist"):
        next(watch_run(tmp_path / "missing"))


def test_inputs_are_never_written(writer):
    for step in STEPS[:3]:
        writer.publish(f"checkpoint-{step}")
    before = {p: p.stat().st_mtime_ns for p in writer.target.rglob("*")}
    watcher = Watcher(writer.target, settle=0)
    watcher.look(), watcher.look()
    watcher.judge_series()
    assert {p: p.stat().st_mtime_ns for p in writer.target.rglob("*")} == before


def test_only_changes_wake_the_watch_not_its_own_reads():
    """A look opens the files of a checkpoint still being written: those
    events must not wake it again (it would look in a loop)."""
    from watchdog import events

    wake = threading.Event()
    handler = Wake(wake)
    for read in (events.FileOpenedEvent("x"), events.FileClosedNoWriteEvent("x")):
        handler.dispatch(read)
        assert not wake.is_set()
    for change in (events.FileCreatedEvent("x"), events.FileModifiedEvent("x"), events.FileClosedEvent("x"),
                   events.FileMovedEvent("x", "y"), events.FileDeletedEvent("x"), events.DirCreatedEvent("d")):
        wake.clear()
        handler.dispatch(change)
        assert wake.is_set()


def test_the_loss_log_is_read_again_as_the_run_writes_it(writer):
    def log(steps):
        with (writer.target / "train_log.jsonl").open("a") as f:
            f.writelines(json.dumps({"step": s, "loss": 2.0 + s / 1000}) + "\n" for s in steps)

    watcher = Watcher(writer.target, settle=0)
    for step in STEPS[:2]:
        writer.publish(f"checkpoint-{step}")
    log(range(0, 100))
    watcher.look(), watcher.look()
    first = watcher.judge_series().report
    assert first.pairs[0].loss == pytest.approx(2.0 + 49.5 / 1000)
    writer.publish("checkpoint-200")
    log(range(100, 200))
    watcher.look(), watcher.look()
    second = watcher.judge_series().report
    assert [p.loss for p in second.pairs] == pytest.approx([2.0495, 2.1495])


def test_a_restarted_watch_goes_on_from_the_judged_pairs_on_disk(writer, tmp_path, monkeypatch):
    judged = []
    original = JudgeState.add
    monkeypatch.setattr(JudgeState, "add", lambda self, pair: judged.append(pair.to_step) or original(self, pair))
    for step in STEPS[:4]:
        writer.publish(f"checkpoint-{step}")
    first = Watcher(writer.target, settle=0, cache=SeriesCache(PairCache(tmp_path / "cache")))
    first.look(), first.look()
    first.judge_series()
    assert judged == [100, 200, 300]
    writer.publish("checkpoint-400")
    judged.clear()
    restarted = Watcher(writer.target, settle=0, cache=SeriesCache(PairCache(tmp_path / "cache")))
    restarted.look(), restarted.look()
    event = restarted.judge_series()
    assert judged == [400], "only the new pair is judged"
    assert dataclasses.asdict(event.report) == dataclasses.asdict(scan_run(writer.target))
