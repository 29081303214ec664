"""What the scan reads: each checkpoint once, only the monitored bytes.

A counting wrapper around each checkpoint's tensor source records every
`get`; a counting `os.preadv` records the data bytes that reach the process.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from pathlib import Path

import pytest
import torch

from ckptscan.layouts import resolve_layout
from ckptscan.readers import Checkpoint, open_checkpoint
from ckptscan.pipeline.metrics import Metrics, compute
from ckptscan.pipeline.run import RunSpec
from ckptscan.scan import ScanOptions
from factories import llama_config, llama_tensors, updated, write_hf_checkpoint

STEPS = (100, 200, 300, 400)
CONFIG = llama_config(layers=3, hidden=64, heads=8, kv_heads=2, experts=4)
HEAD_DIM = CONFIG["hidden_size"] // CONFIG["num_attention_heads"]


class CountingSource:
    """A TensorSource that counts `get` calls per tensor name."""

    def __init__(self, inner):
        self.inner = inner
        self.reads: Counter[str] = Counter()

    def get(self, name, rows=None):
        self.reads[name] += 1
        return self.inner.get(name, rows=rows)

    def __getattr__(self, attr):
        return getattr(self.inner, attr)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("run")
    tensors = llama_tensors(CONFIG, seed=7)
    gen = torch.Generator().manual_seed(8)
    for step in STEPS:
        write_hf_checkpoint(root / f"checkpoint-{step}", tensors, CONFIG, shards=2, dtype=torch.bfloat16)
        tensors = updated(tensors, 1e-3, gen)
    return root


def _open_counted(run_dir: Path) -> list[Checkpoint]:
    checkpoints = [open_checkpoint(run_dir / f"checkpoint-{s}") for s in STEPS]
    for ckpt in checkpoints:
        ckpt.tensors = CountingSource(ckpt.tensors)
    return checkpoints


def scan_checkpoints(checkpoints: list[Checkpoint], options: ScanOptions, pairs=None) -> Metrics:
    """compute() over already-opened checkpoints; by default every consecutive pair."""
    pairs = pairs or [(i, i + 1) for i in range(len(checkpoints) - 1)]
    return compute(RunSpec("run", str(checkpoints[0].path.parent), checkpoints, pairs), options)


def _monitored(ckpt: Checkpoint) -> set[str]:
    return {name for plan in resolve_layout(ckpt).layers for name in plan.tensors}


PAIRINGS = {
    "consecutive": None,
    "fixed_base": [(0, j) for j in range(1, len(STEPS))],
    "stride_2": [(0, 2), (1, 3)],
    "mixed": [(0, 1), (0, 3), (1, 2), (2, 3)],
}


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("pairing", sorted(PAIRINGS))
def test_each_checkpoint_is_read_once_and_only_its_monitored_tensors(run_dir, pairing, workers):
    checkpoints = _open_counted(run_dir)
    monitored = _monitored(checkpoints[0])
    assert monitored and monitored < set(checkpoints[0].tensors.keys())  # there is something not to read

    report = scan_checkpoints(checkpoints, ScanOptions(workers=workers), PAIRINGS[pairing])

    for ckpt in checkpoints:
        assert ckpt.tensors.reads == Counter({name: 1 for name in monitored}), ckpt.path
    assert all(len(pair.layers) == CONFIG["num_hidden_layers"] for pair in report.pairs)
    assert all([layer.layer for layer in pair.layers] == [0, 1, 2] for pair in report.pairs)


def _count_preadv(monkeypatch) -> list[int]:
    sizes: list[int] = []
    real = os.preadv

    def counting(fd, buffers, offset, *args):
        got = real(fd, buffers, offset, *args)
        sizes.append(got)
        return got

    monkeypatch.setattr(os, "preadv", counting)
    return sizes


def _nbytes(ckpt: Checkpoint, name: str, rows: int | None = None) -> int:
    shape = ckpt.tensors.shape(name)
    itemsize = 2  # the run is stored in bf16
    return (rows if rows is not None else shape[0]) * math.prod(shape[1:]) * itemsize


def test_bytes_read_are_exactly_the_monitored_tensors(run_dir, monkeypatch):
    checkpoints = [open_checkpoint(run_dir / f"checkpoint-{s}") for s in STEPS]
    expected = sum(_nbytes(c, name) for c in checkpoints for name in _monitored(c))
    total = sum(os.path.getsize(f) for c in checkpoints for f in c.files)
    sizes = _count_preadv(monkeypatch)

    scan_checkpoints(checkpoints, ScanOptions())

    assert sum(sizes) == expected
    # The v/o projections were never read; the embedding is, as the tied head of the output family.
    unread = sum(_nbytes(c, name) for c in checkpoints for name in c.tensors.keys()
                 if name.endswith(("v_proj.weight", "o_proj.weight")))
    assert unread > 0 and expected <= total - unread
    assert all("model.embed_tokens.weight" in _monitored(c) for c in checkpoints)


def test_head_selection_reads_only_those_heads_rows(run_dir, monkeypatch):
    checkpoints = [open_checkpoint(run_dir / f"checkpoint-{s}") for s in STEPS[:2]]
    heads = [1, 2, 6]  # KV heads (8 heads over 2): 0, 0, 1
    q_rows, k_rows = len(heads) * HEAD_DIM, 2 * HEAD_DIM
    expected = 0
    for ckpt in checkpoints:
        for plan in resolve_layout(ckpt).layers:
            for name in plan.tensors:
                role = plan.roles.get(name)
                expected += _nbytes(ckpt, name, {"W_q": q_rows, "W_k": k_rows}.get(role))
    sizes = _count_preadv(monkeypatch)

    report = scan_checkpoints(checkpoints, ScanOptions(heads=heads))

    assert sum(sizes) == expected
    assert [h.head for h in report.pairs[0].layers[0].attention.heads] == heads


def test_head_selection_of_one_kv_group_skips_the_other_keys(run_dir, monkeypatch):
    checkpoints = [open_checkpoint(run_dir / f"checkpoint-{s}") for s in STEPS[:2]]
    full = sum(_nbytes(c, n) for c in checkpoints for n in _monitored(c))
    sizes = _count_preadv(monkeypatch)

    scan_checkpoints(checkpoints, ScanOptions(heads=[4, 5]))

    # Heads 4, 5 share KV head 1: 2 of 8 query heads and 1 of 2 KV heads read.
    per_layer_saved = (6 * HEAD_DIM + 1 * HEAD_DIM) * CONFIG["hidden_size"] * 2
    assert sum(sizes) == full - per_layer_saved * CONFIG["num_hidden_layers"] * len(checkpoints)
