"""StoredRows: the LM head read a chunk of rows at a time (never whole), and
its non-finite values counted where the output family's pass cannot vouch
for it."""

from __future__ import annotations

import math

import pytest
import torch
from factories import llama_config, llama_tensors, random_weights, write_hf_checkpoint

from ckptscan import scan_pair
from ckptscan.readers import open_checkpoint, rows
from ckptscan.readers.rows import StoredRows
from ckptscan.scan import ScanOptions

D, V = 32, 300


class Counting:
    def __init__(self, inner):
        self.inner, self.reads = inner, []

    def get(self, name, rows=None):
        self.reads.append(rows)
        return self.inner.get(name, rows=rows)

    def __getattr__(self, attr):
        return getattr(self.inner, attr)


@pytest.fixture
def stored(tmp_path):
    config = {**llama_config(layers=1, hidden=D, heads=4, kv_heads=2), "vocab_size": V, "tie_word_embeddings": False}
    tensors = llama_tensors(config, 2)
    tensors["lm_head.weight"] = random_weights((V, D), 5)
    path = write_hf_checkpoint(tmp_path / "checkpoint-1", tensors, config, dtype=torch.bfloat16)
    return open_checkpoint(path), tensors["lm_head.weight"].to(torch.bfloat16)


@pytest.mark.parametrize("keep", [False, True])
def test_blocks_are_the_stored_rows_read_a_chunk_at_a_time(stored, monkeypatch, keep):
    ckpt, head = stored
    monkeypatch.setattr(rows, "CHUNK_BYTES", 64 * D * 2)  # 64 rows of bf16 a chunk
    source = Counting(ckpt.tensors)
    head_rows = StoredRows(source, "lm_head.weight", keep=keep)
    assert head_rows.shape == head.shape
    for _ in range(2):  # two passes, as two pairs reading one checkpoint
        for lo in range(0, V, 24):
            assert torch.equal(head_rows[lo:lo + 24], head[lo:lo + 24])
    chunks = math.ceil(V / 64) + 1  # a block crossing a chunk's end starts a chunk of its own
    # One ranged read per chunk; kept, the second pass reads nothing.
    assert len(source.reads) <= (1 if keep else 2) * chunks and all(r is not None for r in source.reads)
    assert max(hi - lo for lo, hi in source.reads) <= 64 + 24


def test_non_finite_values_are_counted_exactly(stored):
    ckpt, head = stored
    head_rows = StoredRows(ckpt.tensors, "lm_head.weight")
    assert head_rows.count_nonfinite() == 0
    bad = head.clone()
    bad[3, 1], bad[250, :5], bad[299, -1] = float("nan"), float("inf"), -float("inf")
    assert StoredRows(_Tensors({"lm_head.weight": bad}), "lm_head.weight").count_nonfinite() == 7


class _Tensors:
    def __init__(self, tensors):
        self.tensors = tensors

    def shape(self, name):
        return tuple(self.tensors[name].shape)

    def dtype(self, name):
        return "BF16"

    def get(self, name, rows=None):
        t = self.tensors[name]
        return t if rows is None else t[rows[0]:rows[1]]


def _pair(tmp_path, head_b):
    config = {**llama_config(layers=2, hidden=D, heads=4, kv_heads=2), "vocab_size": V, "tie_word_embeddings": False}
    tensors = llama_tensors(config, 2)
    tensors["lm_head.weight"] = random_weights((V, D), 5)
    a = write_hf_checkpoint(tmp_path / "checkpoint-100", tensors, config, dtype=torch.bfloat16)
    tensors = {name: t + random_weights(t.shape, 9) * 0.01 for name, t in tensors.items()}
    tensors["lm_head.weight"] = head_b(tensors["lm_head.weight"])
    b = write_hf_checkpoint(tmp_path / "checkpoint-200", tensors, config, dtype=torch.bfloat16)
    return a, b


def test_a_scan_counts_a_non_finite_heads_values_for_the_numeric_rule(tmp_path):
    def poisoned(head):
        head = head.clone()
        head[10, :3] = float("nan")
        head[200, 7] = float("inf")
        return head

    report = scan_pair(*_pair(tmp_path, poisoned), ScanOptions(workers=1))
    last = report.pairs[0].layers[-1]
    assert last.nonfinite.get("lm_head") == 4
    assert "output" not in last.families  # no values from a non-finite head


def test_a_finite_head_is_proven_by_the_output_familys_pass(tmp_path):
    report = scan_pair(*_pair(tmp_path, lambda head: head), ScanOptions(workers=1))
    last = report.pairs[0].layers[-1]
    assert "lm_head" not in last.nonfinite and last.families["output"]["output_logit_rms"] > 0
