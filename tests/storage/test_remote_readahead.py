"""Read-ahead against a real server (S3; and every scheme's where a fetch fails): the loads a worker needs next are
fetched while it reads the current one, every byte once, with the same
numbers as the local scan; a failed read-ahead fetch is one clear line and
exit 2 where its tensor is read; what is abandoned is cancelled."""

from __future__ import annotations

import json
import threading

import pytest
import torch
from factories import llama_config, llama_tensors, updated
from format_writers import write_dcp
from remote_helpers import hf_run, same_numbers
from typer.testing import CliRunner

from ckptscan.cli import app
from ckptscan.errors import CkptScanError
from ckptscan.storage.readahead import DEPTH, ReadAhead
from ckptscan.readers import open_checkpoint, open_checkpoints
from ckptscan.readers.safetensors import REMOTE_HEADER_GUESS
from ckptscan.scan import LayerTask, ScanOptions
from ckptscan.scan.reading import read_tensor
from ckptscan.storage import ranged

runner = CliRunner()
SHARD = "checkpoint-200/model-00001-of-00002.safetensors"


def monitored_bytes(folders, layers) -> int:
    """q_proj and k_proj of every layer of every checkpoint (bf16), the gain of the norm in
    front of attention (the logit scale's), and the output family's head (the tied embedding)
    read with the last layer, from the local files."""
    total = 0
    for folder in folders:
        source = open_checkpoint(folder).tensors
        names = [f"model.layers.{layer}.{name}" for layer in range(layers)
                 for name in ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "input_layernorm.weight")]
        for name in [*names, "model.embed_tokens.weight"]:
            entry = source.entry(name)
            total += entry.end - entry.start
    return total


def test_a_trend_of_five_checkpoints_equals_the_local_one_and_fetches_every_byte_once(s3, tmp_path):
    folders = hf_run(tmp_path / "run", steps=(100, 200, 300, 400, 500), layers=3)
    url = s3.upload(tmp_path / "run", "run")
    local = runner.invoke(app, ["trend", str(tmp_path / "run"), "--format", "json", "--no-cache"])
    before = dict(ranged.stats)
    remote = runner.invoke(app, ["trend", url, "--format", "json", "--no-cache"])
    assert local.exit_code == remote.exit_code == 0, remote.output
    same_numbers(json.loads(local.stdout), json.loads(remote.stdout))
    # Read-ahead fetches nothing twice and nothing unneeded: the monitored
    # tensors, each shard's header GET (with up to 64 KiB more), config and index.
    headers = sum(min(f.stat().st_size, 8 + REMOTE_HEADER_GUESS) for f in (tmp_path / "run").rglob("*.safetensors"))
    small_files = sum(f.stat().st_size for f in (tmp_path / "run").rglob("*.json"))
    assert ranged.stats["bytes"] - before["bytes"] == monitored_bytes(folders, 3) + headers + small_files


def test_the_next_loads_are_in_flight_while_the_current_one_is_read(s3, tmp_path):
    folders = hf_run(tmp_path / "run", layers=3)
    url = s3.upload(tmp_path / "run", "run")
    checkpoints = open_checkpoints([f"{url}/checkpoint-100", f"{url}/checkpoint-200"])
    task = LayerTask(checkpoints, [(0, 1)], ScanOptions())
    ahead = ReadAhead([0, 1, 2], task.used, task.prefetch_load)
    before = dict(ranged.stats)
    ahead.reach(0, 0)
    # Checkpoint 0's layer 0 (needed now), and ahead of it checkpoint 1's layer 0 and checkpoint 0's layer 1.
    pending = {(c, name) for c, ckpt in enumerate(checkpoints) for name, _ in ckpt.tensors._prefetched}
    assert pending == {(c, f"model.layers.{layer}.{name}") for c, layer in ((0, 0), (1, 0), (0, 1))
                       for name in ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "input_layernorm.weight")}
    local = open_checkpoints([str(f) for f in folders])
    for layer, c in ((0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)):
        ahead.reach(layer, c)
        plan = task.layouts[c].layers[layer]
        for name in plan.tensors:
            assert read_tensor(checkpoints[c], plan, name, None).equal(local[c].tensors.get(name))
    ahead.close()
    assert all(not c.tensors._prefetched for c in checkpoints)  # every fetch taken by its read
    assert ranged.stats["bytes"] - before["bytes"] == monitored_bytes(folders, 3)


def test_a_failed_read_ahead_fetch_is_raised_where_its_tensor_is_read(store, proxy, tmp_path, short_backoff):
    """Checkpoint-200's layer 0 is fetched ahead while checkpoint-100's is read;
    its shard answers 503 for good: checkpoint-100 reads fine, and reading the
    tensor whose fetch failed raises the one error naming URL and tensor."""
    hf_run(tmp_path / "run")
    url = store.upload(tmp_path / "run", "run")  # straight to the server; ckptscan reads through the proxy
    checkpoints = open_checkpoints([f"{url}/checkpoint-100", f"{url}/checkpoint-200"])
    proxy.fail(SHARD, "503", times=10**6)  # headers were read at open: every later GET of the shard fails
    task = LayerTask(checkpoints, [(0, 1)], ScanOptions())
    ahead = ReadAhead([0, 1], task.used, task.prefetch_load)
    ahead.reach(0, 0)
    plan = task.layouts[0].layers[0]
    for name in plan.tensors:
        read_tensor(checkpoints[0], plan, name, None)
    assert proxy.faults_sent > 0  # the read-ahead fetch of checkpoint-200 was sent, and failed
    ahead.reach(0, 1)
    with pytest.raises(CkptScanError) as error:
        read_tensor(checkpoints[1], plan, plan.tensors[0], None)
    # The request held q_proj and k_proj (adjacent in the file: one part): both are named.
    assert str(error.value).startswith(f"{url}/{SHARD}: tensor '{plan.tensors[0]}")
    assert str(error.value).endswith(f"': read failed after 4 tries: 503 Service Unavailable, {store.codes['503']}")
    ahead.close()


def test_a_diff_whose_read_ahead_fails_is_one_line_and_exit_2_with_no_thread_left(store, proxy, tmp_path,
                                                                                   short_backoff):
    hf_run(tmp_path / "run", layers=3)
    url = store.upload(tmp_path / "run", "run")  # straight to the server; ckptscan reads through the proxy
    # checkpoint-200's layers are fetched ahead, while checkpoint-100's are read: its second
    # shard's header GET goes through, every later GET of that shard is cut.
    proxy.fail("checkpoint-200/model-00002-of-00002.safetensors", "cut", times=10**6, after=1)
    threads = set(threading.enumerate())
    result = runner.invoke(app, ["diff", f"{url}/checkpoint-100", f"{url}/checkpoint-200", "--format", "json"])
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith(f"error: {url}/checkpoint-200/model-00002-of-00002.safetensors: tensor "
                               "'model.layers."), lines[0]
    assert "read failed after 4 tries" in lines[0]
    # Layer workers and opening threads are gone; only the shared GET pool (bounded) may remain.
    left = [t.name for t in set(threading.enumerate()) - threads
            if t.name.startswith("ckptscan") and not t.name.startswith("ckptscan-get")]
    assert left == [], left


def dcp_run(root, steps=(10, 20), layers=3):
    """step-N/ DCP folders (torchtitan-style, rows saved in two chunks) of a small Llama, each an update of the last."""
    config = llama_config(layers=layers, hidden=64, heads=4, kv_heads=2)
    tensors = llama_tensors(config, 3)
    generator = torch.Generator().manual_seed(3)
    folders = []
    for step in steps:
        state = {k: v.to(torch.bfloat16) for k, v in tensors.items()}
        folders.append(write_dcp(root / f"step-{step}", state, {name: [(0, 2)] for name in state}))
        (root / f"step-{step}" / "config.json").write_text(json.dumps(config))
        tensors = updated(tensors, 0.003, generator)
    return folders


def saved_bytes(source, names) -> int:
    """The bytes of the DCP chunks saved for these tensors."""
    keys = {source.names[name] for name in names}
    return sum(info.length for index, info in source.metadata.storage_data.items() if index.fqn in keys)


def test_dcp_loads_are_read_ahead_within_the_bound_and_every_chunk_fetched_once(s3, tmp_path):
    folders = dcp_run(tmp_path / "run")
    url = s3.upload(tmp_path / "run", "run")
    checkpoints = open_checkpoints([f"{url}/step-10", f"{url}/step-20"])
    local = open_checkpoints([str(f) for f in folders])
    task = LayerTask(checkpoints, [(0, 1)], ScanOptions())
    ahead = ReadAhead([0, 1, 2], task.used, task.prefetch_load)
    # One layer-load's bytes; the last layer's also holds the output family's head (the tied embedding).
    loads = [saved_bytes(checkpoints[0].tensors, plan.tensors) for plan in task.layouts[0].layers]
    load, largest = loads[0], max(loads)

    def pending() -> int:
        return sum(end - start for c in checkpoints for _, start, end in c.tensors._remote._prefetched)

    before = dict(ranged.stats)
    ahead.reach(0, 0)
    # The load needed now and DEPTH more: checkpoint 1's layer 0 and checkpoint 0's layer 1.
    assert pending() == (1 + DEPTH) * load
    for layer, c in ((0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)):
        ahead.reach(layer, c)
        assert pending() <= (1 + DEPTH) * largest  # the memory bound: never more fetched ahead
        plan = task.layouts[c].layers[layer]
        for name in plan.tensors:
            assert read_tensor(checkpoints[c], plan, name, None).equal(local[c].tensors.get(name))
    ahead.close()
    assert pending() == 0  # every chunk fetched ahead was taken by its read
    assert ranged.stats["bytes"] - before["bytes"] == 2 * sum(loads)


def test_an_fp8_weight_is_fetched_ahead_with_the_rows_of_its_block_scales(s3, tmp_path):
    from readers.test_fp8 import Q_A, write_deepseek_fp8

    write_deepseek_fp8(tmp_path / "ckpt")  # a 300x200 F8_E4M3 weight, 128x128 blocks: 3x2 scales
    url = s3.upload(tmp_path / "ckpt", "ckpt")
    remote, local = open_checkpoint(url).tensors, open_checkpoint(tmp_path / "ckpt").tensors
    for rows, scale_rows in ((None, (0, 3)), ((130, 260), (1, 3))):
        before = dict(ranged.stats)
        abandon = remote.prefetch([(Q_A, rows)])
        # One batch: the weight's rows and the scale rows that dequantise them.
        assert set(remote.source._prefetched) == {(Q_A, rows), (Q_A + "_scale_inv", scale_rows)}
        assert remote.get(Q_A, rows).equal(local.get(Q_A, rows))
        assert remote.source._prefetched == {}  # both taken by the read: nothing fetched twice
        lo, hi = rows or (0, 300)
        assert ranged.stats["bytes"] - before["bytes"] == (hi - lo) * 200 + (scale_rows[1] - scale_rows[0]) * 2 * 4
        abandon()


def test_a_ray_task_reads_ahead_on_its_worker_within_the_bound(s3, tmp_path):
    """What a Ray worker runs (`run_task`, on the task as it arrives there,
    by location): it re-opens the checkpoints and reads its layers ahead,
    at most DEPTH loads, every byte once, with the driver's numbers."""
    import pickle

    from ckptscan.executors.ray import run_task

    folders = hf_run(tmp_path / "run", layers=3)
    url = s3.upload(tmp_path / "run", "run")
    checkpoints = open_checkpoints([f"{url}/checkpoint-100", f"{url}/checkpoint-200"])
    shipped = pickle.loads(pickle.dumps(LayerTask(checkpoints, [(0, 1)], ScanOptions())))
    before = dict(ranged.stats)
    results = run_task(shipped, [0, 1, 2])
    assert shipped.task.readahead.most_ahead == DEPTH  # loads were fetched ahead, never more than the bound
    headers = sum(min(f.stat().st_size, 8 + REMOTE_HEADER_GUESS) for f in (tmp_path / "run").rglob("*.safetensors"))
    small_files = sum(f.stat().st_size for f in (tmp_path / "run").rglob("*.json"))
    # The worker's open (headers, index, config) and the monitored tensors, each once.
    assert ranged.stats["bytes"] - before["bytes"] == headers + small_files + monitored_bytes(folders, 3)
    expected = run_task(LayerTask(open_checkpoints([str(f) for f in folders]), [(0, 1)], ScanOptions()), [0, 1, 2])
    assert repr(results).replace(url, "") == repr(expected).replace(str(tmp_path / "run"), "")
