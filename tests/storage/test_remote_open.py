"""Opening a checkpoint in object storage costs at most two dependent round
trips on every scheme's server: the listings (the parent's and the
folder's, side by side), then the index, config.json and every shard's
header side by side. A run's discovery lists the run once, and every
checkpoint's open reads from that listing. The proxy in front of the server
counts them, whatever the machine's load: it answers the requests in the
waves a test expects, each wave once all its requests have arrived
(`FaultProxy.hold_waves`), so a wave whose requests are not sent side by
side comes out short and the test fails; a request more is a wave more. On
hf:// the Hub client first resolves the repo, once per command: not
counted."""

from __future__ import annotations

from urllib.parse import unquote

import pytest
from factories import llama_config, llama_tensors, write_hf_checkpoint
from remote_helpers import hf_run
from safetensors.torch import save_file

from ckptscan.pipeline.discovery import discover_run
from ckptscan.readers import open_checkpoint, open_checkpoints
from ckptscan.readers.safetensors import REMOTE_HEADER_GUESS
from ckptscan.storage import ranged



@pytest.fixture
def counted(proxy, monkeypatch):
    """The proxy, with client timeouts longer than a wave may be held (the proxy fixture's short
    timeout is for its stall fault)."""
    from ckptscan.storage import fsspec_client, obstore_client

    for client in (obstore_client, fsspec_client):
        monkeypatch.setattr(client, "TIMEOUT_S", 2 * proxy.WAVE_TIMEOUT_S)
    return proxy


def wave_sizes(proxy) -> list[int]:
    """How many requests each round trip carried; [] short waves, or the test fails with the paths."""
    assert proxy.short_waves == 0, proxy.waves
    return [len(wave) for wave in proxy.waves]


def is_listing(path: str) -> bool:
    """A listing request on any of the four servers (S3 list-type, Azure comp=list, the Hub's tree API)."""
    return any(mark in path for mark in ("list-type=", "comp=list", "/tree/"))


def test_opening_a_sharded_checkpoint_is_two_round_trips(store, counted, tmp_path):
    hf_run(tmp_path / "run", shards=3)
    url = store.upload(tmp_path / "run", "run")
    counted.hold_waves([2, 5], leave_out=store.client_setup)  # two listings; index, config, 3 shards
    checkpoint = open_checkpoint(f"{url}/checkpoint-200")
    assert checkpoint.format == "safetensors-sharded" and checkpoint.config is not None
    assert wave_sizes(counted) == [2, 5]
    assert [is_listing(path) for path in counted.waves[0]] == [True, True]


def test_the_two_checkpoints_of_a_diff_open_side_by_side_in_two_round_trips(store, counted, tmp_path):
    hf_run(tmp_path / "run")
    url = store.upload(tmp_path / "run", "run")
    counted.hold_waves([4, 8], leave_out=store.client_setup)  # two listings each; 2 × (index, config, 2 shards)
    open_checkpoints([f"{url}/checkpoint-100", f"{url}/checkpoint-200"])
    assert wave_sizes(counted) == [4, 8]
    assert not any(is_listing(path) for path in counted.waves[1])


def test_a_run_is_listed_once_and_all_its_checkpoints_open_in_two_round_trips(store, counted, tmp_path):
    """Discovery opens every checkpoint (for the step it records): one listing of the run
    prefix (and one of its parent) serves them all, whose reads then go out side by side."""
    hf_run(tmp_path / "run", steps=(100, 200, 300, 400))
    url = store.upload(tmp_path / "run", "run")
    counted.hold_waves([2, 16], leave_out=store.client_setup)
    run = discover_run(url)
    assert [c.step for c in run.checkpoints] == [100, 200, 300, 400]
    assert wave_sizes(counted) == [2, 16]
    objects = {unquote(path.split("?")[0]) for path in counted.waves[1]}
    # Index, config and two shards of each: no listing per checkpoint.
    assert len(objects) == 4 * 4 and all("/checkpoint-" in unquote(path) for path in objects)


def test_an_open_fetches_only_what_it_reads(s3, tmp_path):
    """The reads started early are the reads the open makes, byte for byte:
    the index, config.json and each shard's first GET."""
    hf_run(tmp_path / "run", shards=3)
    url = s3.upload(tmp_path / "run", "run")
    before = dict(ranged.stats)
    open_checkpoint(f"{url}/checkpoint-200")
    folder = tmp_path / "run" / "checkpoint-200"
    headers = sum(min(f.stat().st_size, 8 + REMOTE_HEADER_GUESS) for f in folder.glob("*.safetensors"))
    small_files = sum(f.stat().st_size for f in folder.glob("*.json"))
    assert ranged.stats["bytes"] - before["bytes"] == headers + small_files


def test_a_header_longer_than_the_first_read_costs_one_round_trip_more(store, counted, tmp_path):
    """Only what is missing is fetched after the first wave: the rest of a long header."""
    config = llama_config(layers=2, hidden=64, heads=4, kv_heads=2)
    tensors = llama_tensors(config, 1)
    folder = write_hf_checkpoint(tmp_path / "run" / "checkpoint-100", tensors, config)
    # A header longer than the first GET.
    save_file(tensors, folder / "model.safetensors", metadata={"padding": "x" * (REMOTE_HEADER_GUESS + 1000)})
    url = store.upload(tmp_path / "run", "run")
    counted.hold_waves([2, 2, 1], leave_out=store.client_setup)  # listings; config and header; its rest
    open_checkpoint(f"{url}/checkpoint-100")
    assert wave_sizes(counted) == [2, 2, 1]


def test_the_count_fails_a_client_that_does_not_send_a_wave_side_by_side(store, counted, tmp_path, monkeypatch):
    """The two checkpoints opened one after the other, not together: their four listings are two
    waves, not one, and the proxy says so (after its wave timeout) instead of passing."""
    hf_run(tmp_path / "run")
    url = store.upload(tmp_path / "run", "run")
    monkeypatch.setattr(counted, "WAVE_TIMEOUT_S", 1.0)
    counted.hold_waves([4, 8], leave_out=store.client_setup)
    for step in (100, 200):
        open_checkpoint(f"{url}/checkpoint-{step}")
    assert counted.short_waves == 1 and len(counted.waves) > 2
