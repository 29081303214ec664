"""The record of checkpoints already opened (ckptscan/pipeline/opened.py): a re-run
opens only what is new or changed, and judges exactly as a fresh run."""

import json
import os
import shutil

import pytest
import torch

from ckptscan import scan_run
from ckptscan.caches.pair_cache import PairCache, checkpoint_identity
from ckptscan.pipeline.discovery import discover_run
from ckptscan.pipeline.opened import OpenedRecord
from ckptscan.readers import open_checkpoint, safetensors
from ckptscan.readers.deferred import DeferredSource
from ckptscan.document.writing import report_json
from ckptscan.scan import ScanOptions

from run_factory import write_run


@pytest.fixture(scope="module")
def run_source(tmp_path_factory):
    return write_run(tmp_path_factory.mktemp("runs") / "run", count=8, collapse_layer=1, collapse_from=500)


@pytest.fixture
def run(run_source, tmp_path):
    return shutil.copytree(run_source, tmp_path / "run", copy_function=shutil.copy2)


@pytest.fixture
def headers_read(monkeypatch):
    """The checkpoint folders whose safetensors headers were read (each open reads them)."""
    seen = []
    original = safetensors.read_header

    def read_header(path):
        seen.append(path.parent.name)
        return original(path)

    monkeypatch.setattr(safetensors, "read_header", read_header)
    return seen


def test_a_re_run_opens_only_the_checkpoint_it_computes_from(run, tmp_path, headers_read):
    options = ScanOptions()
    shutil.move(run / "checkpoint-700", tmp_path / "later")
    scan_run(run, options, cache=PairCache(tmp_path / "cache"))
    assert len(headers_read) == 7  # the first run opens every checkpoint
    shutil.move(tmp_path / "later", run / "checkpoint-700")
    headers_read.clear()
    grown = scan_run(run, options, cache=PairCache(tmp_path / "cache"))
    # The new checkpoint and the one it is paired with (read for the new pair); no other.
    assert sorted(headers_read) == ["checkpoint-600", "checkpoint-700"]
    assert report_json(grown) == report_json(scan_run(run, options))
    headers_read.clear()
    scan_run(run, options, cache=PairCache(tmp_path / "cache"))
    assert headers_read == ["checkpoint-0"]  # every pair cached: only the first, for the model's layout


def test_a_checkpoint_corrupted_after_it_was_recorded_is_found_corrupt(run, tmp_path):
    scan_run(run, ScanOptions(), cache=PairCache(tmp_path / "cache"))
    shard = run / "checkpoint-700" / "model.safetensors"
    before = shard.stat()
    with shard.open("r+b") as f:
        f.truncate(before.st_size - 100)
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))  # same mtime: the size and change time differ
    recorded = discover_run(run, OpenedRecord(tmp_path / "cache", run))
    fresh = discover_run(run)
    assert [s["kind"] for s in recorded.skipped] == ["corrupt"] and recorded.skipped == fresh.skipped
    assert [c.step for c in recorded.checkpoints] == [c.step for c in fresh.checkpoints]


def test_a_file_added_to_a_recorded_checkpoint_reopens_it(run, tmp_path, headers_read):
    discover_run(run, OpenedRecord(tmp_path / "cache", run))
    (run / "checkpoint-300" / "notes.txt").write_text("added after the save")
    headers_read.clear()
    discover_run(run, OpenedRecord(tmp_path / "cache", run))
    assert headers_read == ["checkpoint-300"]


def test_a_rewritten_checkpoint_reopens_it(run, tmp_path, headers_read):
    discover_run(run, OpenedRecord(tmp_path / "cache", run))
    config = run / "checkpoint-200" / "config.json"
    config.write_text(config.read_text())  # same bytes, a new write
    headers_read.clear()
    discover_run(run, OpenedRecord(tmp_path / "cache", run))
    assert headers_read == ["checkpoint-200"]


def test_a_deferred_checkpoint_reads_what_an_open_reads(run, tmp_path):
    discover_run(run, OpenedRecord(tmp_path / "cache", run))
    deferred = discover_run(run, OpenedRecord(tmp_path / "cache", run)).checkpoints
    opened = discover_run(run).checkpoints
    assert all(isinstance(c.tensors, DeferredSource) for c in deferred)
    for lazy, real in zip(deferred, opened):
        assert (lazy.path, lazy.format, lazy.step, lazy.files, lazy.meta) == \
            (real.path, real.format, real.step, real.files, real.meta)
        assert lazy.config == real.config
        assert checkpoint_identity(lazy) == checkpoint_identity(real)  # recorded, not read: the same key
        assert lazy.tensors.keys() == real.tensors.keys()
        for name in real.tensors.keys():
            assert torch.equal(lazy.tensors.get(name), real.tensors.get(name))
    assert open_checkpoint(run / "checkpoint-0").tensors.keys() == deferred[0].tensors.keys()


@pytest.mark.parametrize("damage", ["garbage", "other tool", "other run"])
def test_a_record_that_does_not_fit_is_not_used(run, tmp_path, headers_read, damage):
    record = OpenedRecord(tmp_path / "cache", run)
    discover_run(run, record)
    data = json.loads(record.path.read_text())
    if damage == "garbage":
        record.path.write_text("{ cut")
    else:
        data["tool" if damage == "other tool" else "run"] = "something else"
        record.path.write_text(json.dumps(data))
    headers_read.clear()
    discover_run(run, OpenedRecord(tmp_path / "cache", run))
    assert len(headers_read) == 8


def test_a_deleted_checkpoint_leaves_the_record(run, tmp_path):
    record = OpenedRecord(tmp_path / "cache", run)
    discover_run(run, record)
    shutil.rmtree(run / "checkpoint-700")
    discover_run(run, OpenedRecord(tmp_path / "cache", run))
    assert len(OpenedRecord(tmp_path / "cache", run).entries) == 7


def test_an_unwritable_cache_only_costs_the_opens(run, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    found = discover_run(run, OpenedRecord(blocker / "cache", run))
    assert len(found.checkpoints) == 8
