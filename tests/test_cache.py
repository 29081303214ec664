"""The incremental per-pair cache: identical results, only new pairs computed,
only needed checkpoints read, invalidation by identity and settings; a run's
pairs read from its packs give the same report."""

import os
import shutil

import pytest
import torch

from ckptscan.caches import packs
from ckptscan.caches.packs import pack_due
from ckptscan.caches.pair_cache import PairCache
from ckptscan.system.paths import default_cache_dir
from ckptscan.detection.rules import Thresholds
from ckptscan.detection.state import JudgeState
from ckptscan.readers import SafetensorsSource
from ckptscan.document.writing import report_json
from ckptscan import scan_run
from ckptscan.scan import SCHEDULING, ScanOptions

from run_factory import write_run


@pytest.fixture(scope="module")
def run_source(tmp_path_factory):
    return write_run(tmp_path_factory.mktemp("runs") / "run", count=12, collapse_layer=1, collapse_from=800)


@pytest.fixture
def run(run_source, tmp_path):
    return shutil.copytree(run_source, tmp_path / "run", copy_function=shutil.copy2)


@pytest.fixture
def reads(monkeypatch):
    """Checkpoint directories whose tensors were read."""
    seen = []
    original = SafetensorsSource.get

    def get(self, name, rows=None):
        seen.append(self.files[0].parent.name)
        return original(self, name, rows)

    monkeypatch.setattr(SafetensorsSource, "get", get)
    return seen


def test_results_with_and_without_cache_are_identical(run, tmp_path):
    options = ScanOptions()
    fresh = report_json(scan_run(run, options))
    cache = PairCache(tmp_path / "cache")
    first = report_json(scan_run(run, options, cache=cache))
    assert (cache.hits, cache.misses) == (0, 11)
    cache = PairCache(tmp_path / "cache")
    second = report_json(scan_run(run, options, cache=cache))
    assert (cache.hits, cache.misses) == (11, 0)
    assert fresh == first == second
    assert '"status": "alert"' in second  # the planted collapse is judged from cached metrics too


def test_a_grown_run_computes_only_new_pairs_reading_only_what_they_need(run, tmp_path, reads):
    options = ScanOptions()
    shutil.move(run / "checkpoint-1100", tmp_path / "later")
    scan_run(run, options, cache=PairCache(tmp_path / "cache"))
    shutil.move(tmp_path / "later", run / "checkpoint-1100")
    reads.clear()
    cache = PairCache(tmp_path / "cache")
    grown = scan_run(run, options, cache=cache)
    assert (cache.hits, cache.misses) == (10, 1)
    assert set(reads) == {"checkpoint-1000", "checkpoint-1100"}
    assert report_json(grown) == report_json(scan_run(run, options))


def test_a_changed_checkpoint_invalidates_its_pairs_only(run, tmp_path):
    options = ScanOptions()
    scan_run(run, options, cache=PairCache(tmp_path / "cache"))
    shard = run / "checkpoint-500" / "model.safetensors"
    stat = shard.stat()
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    cache = PairCache(tmp_path / "cache")
    scan_run(run, options, cache=cache)
    assert (cache.hits, cache.misses) == (9, 2)  # 400 -> 500 and 500 -> 600


def test_monitor_settings_are_part_of_the_key(run, tmp_path):
    scan_run(run, ScanOptions(), cache=PairCache(tmp_path / "cache"))
    for options in (ScanOptions(compute_dtype=torch.float64), ScanOptions(layers=[1])):
        cache = PairCache(tmp_path / "cache")
        scan_run(run, options, cache=cache)
        assert cache.hits == 0


def test_a_corrupt_entry_is_recomputed(run, tmp_path):
    options = ScanOptions()
    directory = tmp_path / "cache"
    expected = report_json(scan_run(run, options, cache=PairCache(directory)))
    entries = sorted((directory / "pairs").iterdir())
    assert len(entries) == 11 and not [p for p in directory.rglob("*.tmp")]
    entries[0].write_text("{ truncated")
    cache = PairCache(directory)
    assert report_json(scan_run(run, options, cache=cache)) == expected
    assert (cache.hits, cache.misses) == (10, 1)


def test_an_unwritable_cache_is_reported_not_fatal(run, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    cache = PairCache(blocker / "cache")
    report = scan_run(run, ScanOptions(), cache=cache)
    assert report.summary.status == "alert"
    assert cache.write_error is not None


def test_default_location_is_the_user_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "ckptscan"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "ckptscan"


def test_every_option_is_in_the_cache_key_or_declared_scheduling_only():
    """A new ScanOptions field must be added to cache_key() or to SCHEDULING on
    purpose: otherwise the cache could serve numbers computed with other settings."""
    import dataclasses

    fields = {f.name for f in dataclasses.fields(ScanOptions)}
    keyed = set(ScanOptions().cache_key())
    assert keyed.isdisjoint(SCHEDULING)
    assert fields == keyed | set(SCHEDULING), f"decide for {sorted(fields - keyed - set(SCHEDULING))}"


def test_each_keyed_option_changes_the_key():
    base = ScanOptions().cache_key()
    changed = [ScanOptions(compute_dtype=torch.float64), ScanOptions(layers=[1]), ScanOptions(heads=[0]),
               ScanOptions(device="cuda"), ScanOptions(full_spectrum=True)]
    from ckptscan.layouts import HeadOverrides

    changed.append(ScanOptions(overrides=HeadOverrides(num_heads=4)))
    for options in changed:
        assert options.cache_key() != base
    assert ScanOptions(workers=1, threads=1).cache_key() == base


@pytest.fixture
def judged(monkeypatch):
    """Pairs judged (JudgeState.add calls), counted on the real judge."""
    count = []
    original = JudgeState.add

    def add(self, pair):
        count.append(pair.to_step)
        return original(self, pair)

    monkeypatch.setattr(JudgeState, "add", add)
    return count


def test_a_grown_run_judges_only_its_new_pair_from_the_cached_judge_state(run, tmp_path, judged):
    options = ScanOptions()
    shutil.move(run / "checkpoint-1100", tmp_path / "later")
    scan_run(run, options, cache=PairCache(tmp_path / "cache"))
    assert len(judged) == 10
    shutil.move(tmp_path / "later", run / "checkpoint-1100")
    judged.clear()
    grown = report_json(scan_run(run, options, cache=PairCache(tmp_path / "cache")))
    assert judged == [1100]
    assert len(list((tmp_path / "cache" / "judge-state").iterdir())) == 1  # only the newest state is kept
    assert grown == report_json(scan_run(run, options))


def test_other_thresholds_judge_every_pair_afresh(run, tmp_path, judged):
    options = ScanOptions()
    scan_run(run, options, cache=PairCache(tmp_path / "cache"))
    judged.clear()
    strict = Thresholds(warn_sigma=3.0)
    report = report_json(scan_run(run, options, cache=PairCache(tmp_path / "cache"), thresholds=strict))
    assert len(judged) == 11
    assert report == report_json(scan_run(run, options, thresholds=strict))


def test_a_corrupt_judge_state_is_judged_afresh(run, tmp_path, judged):
    options = ScanOptions()
    first = report_json(scan_run(run, options, cache=PairCache(tmp_path / "cache")))
    (state,) = (tmp_path / "cache" / "judge-state").iterdir()
    state.write_text("{not json")
    judged.clear()
    assert report_json(scan_run(run, options, cache=PairCache(tmp_path / "cache"))) == first
    assert len(judged) == 11


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """Two healthy runs of the same model and a faulty one (its layer 1 collapses from step 300)."""
    root = tmp_path_factory.mktemp("references")
    return [write_run(root / f"healthy{seed}", count=12, seed=seed) for seed in (1, 2)] + \
        [write_run(root / "faulty", count=12, seed=3, collapse_layer=1, collapse_from=300)]


def test_references_are_screened_once_and_the_screening_is_cached(run, tmp_path, judged, references):
    """Screening judges every reference against the others (the faulty one
    until its first alert); a re-run after a new checkpoint takes it from the
    cache and judges one pair; an unreadable screening is screened again."""
    options = ScanOptions()
    refs = [str(r) for r in references]
    shutil.move(run / "checkpoint-1100", tmp_path / "later")
    first = scan_run(run, options, cache=PairCache(tmp_path / "cache"), reference=refs)
    assert first.settings["reference_left_out"] == [refs[2]]
    assert judged.count(100) == 3 + 3 + 1  # each reference on its own (its scan), in screening; the run
    (screening,) = (tmp_path / "cache" / "screened").iterdir()
    shutil.move(tmp_path / "later", run / "checkpoint-1100")
    judged.clear()
    grown = scan_run(run, options, cache=PairCache(tmp_path / "cache"), reference=refs)
    assert judged == [1100]
    want = report_json(scan_run(run, options, reference=refs))
    assert report_json(grown) == want
    screening.write_text("{not json")  # unreadable: screened again, the same report
    judged.clear()
    assert report_json(scan_run(run, options, cache=PairCache(tmp_path / "cache"), reference=refs)) == want
    assert judged.count(100) == 3 and judged.count(1100) == 2  # screening only; the faulty one stops early


@pytest.fixture
def packing(monkeypatch):
    """Packs from 3 pairs on: this run has 11, and by default a pack waits for 17."""
    monkeypatch.setattr(packs, "PACK_AFTER_PAIRS", 2)


def test_a_pack_is_written_again_only_once_enough_pairs_are_past_it():
    assert not pack_due(0, 16) and pack_due(0, 17)  # a short run reads its pairs' own files
    assert not pack_due(1999, 2000) and not pack_due(1999, 1999 + 249)  # a nightly re-run adds one pair
    assert pack_due(1999, 1999 + 250)  # more than an eighth of 1,999 past it
    assert not pack_due(2000, 2000) and not pack_due(2000, 1990)  # nothing past it


def test_a_grown_run_reads_its_pairs_and_judgements_from_its_packs(run, tmp_path, packing, judged):
    options = ScanOptions()
    shutil.move(run / "checkpoint-1100", tmp_path / "later")
    scan_run(run, options, cache=PairCache(tmp_path / "cache"))
    assert len(list((tmp_path / "cache" / "packs").iterdir())) == 1
    assert len(list((tmp_path / "cache" / "judged-packs").iterdir())) == 1
    for entry in [*(tmp_path / "cache" / "pairs").iterdir(), *(tmp_path / "cache" / "judged").iterdir()]:
        entry.unlink()  # only the packs can give them back now
    shutil.move(tmp_path / "later", run / "checkpoint-1100")
    judged.clear()
    cache = PairCache(tmp_path / "cache")
    grown = report_json(scan_run(run, options, cache=cache))
    assert (cache.hits, cache.misses) == (10, 1)
    assert judged == [1100]
    assert grown == report_json(scan_run(run, options))
    assert '"status": "alert"' in grown  # the planted collapse, judged before and kept in the pack


def test_unreadable_packs_are_passed_over_for_the_pairs_own_files(run, tmp_path, packing, judged):
    options = ScanOptions()
    expected = report_json(scan_run(run, options, cache=PairCache(tmp_path / "cache")))
    for pack in [*(tmp_path / "cache" / "packs").iterdir(), *(tmp_path / "cache" / "judged-packs").iterdir()]:
        pack.write_text('{"format": 1, "pairs": ')
    judged.clear()
    cache = PairCache(tmp_path / "cache")
    assert report_json(scan_run(run, options, cache=cache)) == expected
    assert (cache.hits, cache.misses, judged) == (11, 0, [])


def test_a_changed_checkpoint_s_pairs_are_computed_again_and_the_others_come_from_the_pack(run, tmp_path, packing):
    options = ScanOptions()
    scan_run(run, options, cache=PairCache(tmp_path / "cache"))
    for entry in (tmp_path / "cache" / "pairs").iterdir():
        entry.unlink()
    shard = run / "checkpoint-500" / "model.safetensors"
    stat = shard.stat()
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    cache = PairCache(tmp_path / "cache")
    report = report_json(scan_run(run, options, cache=cache))
    assert (cache.hits, cache.misses) == (9, 2)  # 400 -> 500 and 500 -> 600 computed, the others packed
    assert report == report_json(scan_run(run, options))


def test_a_watch_reads_its_run_s_pack_once_and_does_not_write_it_again_at_each_look(run, tmp_path, packing):
    """The first look reads the run's pairs from the pack; a later look asks
    the disk only for its new pairs, and never packs them alone in place of
    the run's (three new pairs are past the threshold of this test's packs)."""
    from ckptscan.caches.packs import read_pack
    from ckptscan.pipeline.run import resolve_run
    from ckptscan.pipeline.watch import SeriesCache, Watcher

    later = ["checkpoint-900", "checkpoint-1000", "checkpoint-1100"]
    for name in later:
        shutil.move(run / name, tmp_path / name)
    scan_run(run, ScanOptions(), cache=PairCache(tmp_path / "cache"))  # an earlier trend: the pack of 8 pairs
    (pack,) = (tmp_path / "cache" / "packs").iterdir()
    written = pack.stat().st_mtime_ns, pack.stat().st_ino
    disk = PairCache(tmp_path / "cache")
    watcher = Watcher(run, cache=SeriesCache(disk))
    first = list(watcher._grow(resolve_run(run)).pairs)  # a look: the metrics of the run as it is now
    assert (disk.hits, disk.misses) == (8, 0)
    for name in later:
        shutil.move(tmp_path / name, run / name)
    grown = watcher._grow(resolve_run(run))  # the next look computes the three new pairs alone
    assert (disk.hits, disk.misses) == (8, 3)
    assert (pack.stat().st_mtime_ns, pack.stat().st_ino) == written
    assert len(read_pack(pack)[0]) == 8
    assert grown.pairs[:8] == first and len(grown.pairs) == 11


def test_a_run_whose_oldest_checkpoints_are_deleted_keeps_one_pack(run, tmp_path, packing):
    """A trainer that keeps its last N checkpoints: the run's first pair
    changes at every save, and its pack is replaced, not added to."""
    options = ScanOptions()
    scan_run(run, options, cache=PairCache(tmp_path / "cache"))
    shutil.rmtree(run / "checkpoint-0")
    shutil.rmtree(run / "checkpoint-100")
    cache = PairCache(tmp_path / "cache")
    report = report_json(scan_run(run, options, cache=cache))
    assert (cache.hits, cache.misses) == (9, 0)
    assert report == report_json(scan_run(run, options))
    assert len(list((tmp_path / "cache" / "packs").iterdir())) == 1
    assert len(list((tmp_path / "cache" / "judged-packs").iterdir())) == 1
