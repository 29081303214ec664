"""Opening a checkpoint in object storage costs at most two dependent round
trips on every scheme's server: the listings (the parent's and the
folder's, side by side), then the index, config.json and every shard's
header side by side. A run's discovery lists the run once, and every
checkpoint's open reads from that listing. A proxy in front of the server
holds each answer back `LATENCY_S` (time to first byte) and records when each
request arrived and was answered (`FaultProxy.round_trips`). On hf:// the
Hub client first resolves the repo, once per command: not counted."""

from __future__ import annotations

from urllib.parse import unquote

import pytest
from factories import llama_config, llama_tensors, write_hf_checkpoint
from remote_helpers import hf_run
from safetensors.torch import save_file

from ckptscan.discovery import discover_run
from ckptscan.readers import open_checkpoint, open_checkpoints
from ckptscan.readers.safetensors import REMOTE_HEADER_GUESS
from ckptscan.storage import ranged

# Long enough that requests sent together overlap on a busy machine, and one
# sent after an answer clearly starts after it. 0.4 s was not: with the suite
# on two workers and the emulators beside them, a wave's last request reached
# the server after its first answer about once in eight runs.
LATENCY_S = 1.0


@pytest.fixture
def slow(proxy, monkeypatch):
    from ckptscan.storage import fsspec_client, obstore_client

    proxy.latency_s = LATENCY_S
    for client in (obstore_client, fsspec_client):  # the proxy's short timeout is for its stall fault
        monkeypatch.setattr(client, "TIMEOUT_S", 10 * LATENCY_S)
    return proxy


def test_opening_a_sharded_checkpoint_is_two_round_trips(store, slow, tmp_path):
    hf_run(tmp_path / "run", shards=3)
    url = store.upload(tmp_path / "run", "run")
    checkpoint = open_checkpoint(f"{url}/checkpoint-200")
    assert checkpoint.format == "safetensors-sharded" and checkpoint.config is not None
    assert slow.round_trips(store.client_setup) == 2, slow.timeline


def test_the_two_checkpoints_of_a_diff_open_side_by_side_in_two_round_trips(store, slow, tmp_path):
    hf_run(tmp_path / "run")
    url = store.upload(tmp_path / "run", "run")
    open_checkpoints([f"{url}/checkpoint-100", f"{url}/checkpoint-200"])
    assert slow.round_trips(store.client_setup) == 2, slow.timeline


def test_a_run_is_listed_once_and_all_its_checkpoints_open_in_two_round_trips(store, slow, tmp_path):
    """Discovery opens every checkpoint (for the step it records): one listing of the run
    prefix (and one of its parent) serves them all, whose reads then go out side by side."""
    hf_run(tmp_path / "run", steps=(100, 200, 300, 400))
    url = store.upload(tmp_path / "run", "run")
    run = discover_run(url)
    assert [c.step for c in run.checkpoints] == [100, 200, 300, 400]
    t0 = slow.timeline[0][2]
    assert slow.round_trips(store.client_setup) == 2, "\n".join(f"{a-t0:.3f} {b-t0:.3f} {p}" for _, p, a, b in slow.timeline)
    objects = {unquote(path.split("?")[0]) for _, path, _, _ in slow.timeline if "/checkpoint-" in unquote(path)}
    assert len(objects) == 4 * 4  # index, config and two shards of each: no listing per checkpoint


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


def test_a_header_longer_than_the_first_read_costs_one_round_trip_more(store, slow, tmp_path):
    """Only what is missing is fetched after the first wave: the rest of a long header."""
    config = llama_config(layers=2, hidden=64, heads=4, kv_heads=2)
    tensors = llama_tensors(config, 1)
    folder = write_hf_checkpoint(tmp_path / "run" / "checkpoint-100", tensors, config)
    # A header longer than the first GET.
    save_file(tensors, folder / "model.safetensors", metadata={"padding": "x" * (REMOTE_HEADER_GUESS + 1000)})
    url = store.upload(tmp_path / "run", "run")
    open_checkpoint(f"{url}/checkpoint-100")
    assert slow.round_trips(store.client_setup) == 3, slow.timeline
