"""diff / trend / inspect on object-store URLs, against a real server of
each scheme on loopback (`store`: s3, gcs, azure, hf; `s3` alone where a
check is about S3 or the cache, not the store): the results equal the local
scan of the same files to 1e-12, and only the monitored byte ranges are read."""

from __future__ import annotations

import json
import math

import torch
from factories import llama_config, llama_tensors, updated
from format_writers import write_dcp, write_torch_bin
from remote_helpers import hf_run, same_numbers
from typer.testing import CliRunner

from ckptscan.cli import app
from ckptscan.readers.safetensors import REMOTE_HEADER_GUESS
from ckptscan.readers import open_checkpoint
from ckptscan.document.plain import report_dict
from ckptscan import scan_pair
from ckptscan.scan import ScanOptions
from ckptscan.storage import ranged

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args))


def test_diff_of_sharded_safetensors_equals_the_local_diff(store, tmp_path):
    older, newer = hf_run(tmp_path / "run")
    url = store.upload(tmp_path / "run", "run")
    local = run("diff", str(older), str(newer), "--format", "json")
    remote = run("diff", f"{url}/checkpoint-100", f"{url}/checkpoint-200", "--format", "json")
    assert local.exit_code == remote.exit_code == 0, remote.output
    same_numbers(json.loads(local.stdout), json.loads(remote.stdout))


def test_selected_heads_read_only_their_rows_and_equal_the_local_scan(store, proxy, tmp_path):
    """Counted twice: the bytes ckptscan received, and the GET bodies the
    server sent (through the proxy: what a store's bill would count)."""
    older, newer = hf_run(tmp_path / "run", dtype=torch.float32)
    url = store.upload(tmp_path / "run", "run")
    options = ScanOptions(heads=[1, 2])
    local = scan_pair(older, newer, options)
    before = dict(ranged.stats)
    remote = scan_pair(f"{url}/checkpoint-100", f"{url}/checkpoint-200", ScanOptions(heads=[1, 2]))
    same_numbers(report_dict(local), report_dict(remote))
    # Every byte is fetched once: per layer and checkpoint the q rows of heads 1-2
    # (2 x 16 rows x 64 floats) and the k rows of their KV heads 0-1 (all 32 rows);
    # the gain of the norm in front of attention (64 floats: the logit scale's); per checkpoint the
    # output family's tied head, the embedding (whole: a head selection selects no vocabulary rows);
    # each shard's first GET (its header, read with up to 64 KiB more); config and index.
    embedding = math.prod(open_checkpoint(older).tensors.shape("model.embed_tokens.weight")) * 4
    monitored = 2 * 2 * (2 * 16 * 64 + 32 * 64 + 64) * 4 + 2 * embedding
    headers = sum(min(f.stat().st_size, 8 + REMOTE_HEADER_GUESS) for f in (tmp_path / "run").rglob("*.safetensors"))
    small_files = sum(f.stat().st_size for f in (tmp_path / "run").rglob("*.json"))
    assert ranged.stats["bytes"] - before["bytes"] == monitored + headers + small_files
    assert proxy.bytes_sent == monitored + headers + small_files


def test_dcp_diff_equals_the_local_diff(s3, tmp_path):
    """torchtitan-style DCP: `.metadata` plus the overlapping chunks of the .distcp files."""
    config = llama_config(layers=2, hidden=64, heads=4, kv_heads=2)
    tensors = llama_tensors(config, 3)
    generator = torch.Generator().manual_seed(3)
    for step in (10, 20):
        state = {k: v.to(torch.bfloat16) for k, v in tensors.items()}
        write_dcp(tmp_path / "run" / f"step-{step}", state, {name: [(0, 2)] for name in state})
        (tmp_path / "run" / f"step-{step}" / "config.json").write_text(json.dumps(config))
        tensors = updated(tensors, 0.003, generator)
    url = s3.upload(tmp_path / "run", "run")
    local = scan_pair(tmp_path / "run" / "step-10", tmp_path / "run" / "step-20")
    remote = scan_pair(f"{url}/step-10", f"{url}/step-20")
    assert remote.checkpoints[0].path == f"{url}/step-10"
    same_numbers(report_dict(local), report_dict(remote))
    heads = ScanOptions(heads=[3])
    same_numbers(report_dict(scan_pair(tmp_path / "run" / "step-10", tmp_path / "run" / "step-20", heads)),
                 report_dict(scan_pair(f"{url}/step-10", f"{url}/step-20", ScanOptions(heads=[3]))))


def test_torch_pickle_is_downloaded_with_a_note_and_equals_the_local_diff(s3, tmp_path, capfd):
    config = llama_config(layers=2, hidden=64, heads=4, kv_heads=2)
    tensors = {k: v.float() for k, v in llama_tensors(config, 5).items()}
    write_torch_bin(tmp_path / "run" / "checkpoint-1", tensors, config)
    write_torch_bin(tmp_path / "run" / "checkpoint-2", updated(tensors, 0.003, torch.Generator().manual_seed(5)),
                    config, shards=2)
    url = s3.upload(tmp_path / "run", "run")
    local = scan_pair(tmp_path / "run" / "checkpoint-1", tmp_path / "run" / "checkpoint-2")
    remote = scan_pair(f"{url}/checkpoint-1", f"{url}/checkpoint-2")
    same_numbers(report_dict(local), report_dict(remote))
    note = capfd.readouterr().err
    assert f"note: {url}/checkpoint-1/pytorch_model.bin is a torch pickle, which cannot be read by byte range" in note


def test_trend_over_a_prefix_skips_a_checkpoint_still_being_uploaded(store, tmp_path):
    hf_run(tmp_path / "run", steps=(100, 200, 300, 400))
    # checkpoint-400: the index is there, one shard has not arrived yet.
    url = store.upload(tmp_path / "run", "run", skip=("checkpoint-400/model-00002-of-00002.safetensors",))
    (tmp_path / "run" / "checkpoint-400" / "model-00002-of-00002.safetensors").unlink()
    local = run("trend", str(tmp_path / "run"), "--format", "json", "--no-cache")
    remote = run("trend", url, "--format", "json", "--no-cache")
    assert local.exit_code == remote.exit_code, remote.output
    local_report, remote_report = json.loads(local.stdout), json.loads(remote.stdout)
    same_numbers(local_report, remote_report)
    assert [c["step"] for c in remote_report["checkpoints"]] == [100, 200, 300]
    skipped = remote_report["run"]["skipped"] if "run" in remote_report else remote_report["skipped"]
    assert skipped[0]["path"] == f"{url}/checkpoint-400"
    assert "model-00002-of-00002.safetensors" in skipped[0]["reason"]


def test_inspect_a_remote_checkpoint_and_run(s3, tmp_path):
    hf_run(tmp_path / "run")
    url = s3.upload(tmp_path / "run", "run")
    result = run("inspect", f"{url}/checkpoint-200", "--format", "json")
    assert result.exit_code == 0, result.output
    description = json.loads(result.stdout)
    assert description["checkpoint"]["format"] == "safetensors-sharded"
    assert description["checkpoint"]["model"]["num_kv_heads"] == 2
    result = run("inspect", url + "/", "--format", "json")
    assert result.exit_code == 0, result.output
    assert [c["step"] for c in json.loads(result.stdout)["run"]["checkpoints"]] == [100, 200]


def test_nightly_trend_reads_only_new_checkpoints(s3, tmp_path):
    """The cache keys remote checkpoints by URL, size and ETag: a second run
    over the grown prefix computes only the new pair; a re-uploaded (changed)
    checkpoint is computed again."""
    folders = hf_run(tmp_path / "run", steps=(100, 200, 300))
    url = s3.upload(tmp_path / "run", "run", skip=tuple(f"checkpoint-300/{f.name}" for f in folders[2].iterdir()))
    cache = str(tmp_path / "cache")
    first = run("trend", url, "--cache-dir", cache, "--format", "json")
    assert "0 pair(s) reused, 1 computed" in first.stderr
    s3.upload(folders[2], "run/checkpoint-300")
    second = run("trend", url, "--cache-dir", cache, "--format", "json")
    assert "1 pair(s) reused, 1 computed" in second.stderr
    changed = hf_run(tmp_path / "other", steps=(300,), seed=9)[0]
    s3.upload(changed, "run/checkpoint-300")
    third = run("trend", url, "--cache-dir", cache, "--format", "json")
    assert "1 pair(s) reused, 1 computed" in third.stderr
    same_numbers(json.loads(run("trend", url, "--no-cache", "--format", "json").stdout), json.loads(third.stdout))


def test_a_pickle_past_the_download_limit_is_refused_before_downloading(s3, tmp_path, monkeypatch):
    from ckptscan.storage import download

    config = llama_config(layers=1, hidden=64, heads=4, kv_heads=2)
    write_torch_bin(tmp_path / "run" / "checkpoint-1", llama_tensors(config, 6), config)
    url = s3.upload(tmp_path / "run", "run")
    monkeypatch.setattr(download, "LIMIT", 1000)
    result = run("inspect", f"{url}/checkpoint-1")
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {url}/checkpoint-1/pytorch_model.bin: this torch pickle cannot be "
                                    "read by byte range and must be downloaded whole, but its")
    assert "exceed the download limit" in result.stderr


def test_urls_open_side_by_side_in_order_with_each_failure_in_its_place(s3, tmp_path, monkeypatch):
    """A run's remote checkpoints are opened a few at a time (each open is a
    chain of requests); the result keeps the given order, a checkpoint that
    cannot be opened gives its error in its place, and `open_checkpoints`
    raises the first failure in order."""
    import threading
    import time

    import pytest

    import ckptscan.readers.opening as opening
    from ckptscan.errors import CkptScanError

    hf_run(tmp_path / "run", steps=(100, 200, 300))
    url = s3.upload(tmp_path / "run", "run")
    urls = [f"{url}/checkpoint-100", f"{url}/checkpoint-999", f"{url}/checkpoint-200", f"{url}/checkpoint-300"]
    real, running, most = opening.open_checkpoint, [0], [0]
    lock = threading.Lock()

    def counting(path):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            time.sleep(0.2)  # every open in flight at the same moment, if they overlap at all
            return real(path)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(opening, "open_checkpoint", counting)
    opened = opening.open_each(urls)
    assert most[0] == len(urls)
    assert [str(c.path) for c in (opened[0], opened[2], opened[3])] == [urls[0], urls[2], urls[3]]
    assert isinstance(opened[1], CkptScanError) and "checkpoint-999" in str(opened[1])
    with pytest.raises(CkptScanError, match="checkpoint-999"):
        opening.open_checkpoints(urls)
