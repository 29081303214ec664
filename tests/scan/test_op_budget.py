"""A scan's cost on a GPU, counted on the CPU (issue #50): every op a pair's
scan dispatches is a kernel launch on a GPU, and every scalar read a host
sync. bench/op_budget.py counts them at the 1B shape (docs/performance-gpu.md);
this pins the same budget at a small shape whose head takes as many GPU row
blocks (4) as the 1B head, so a change that puts an op or a read back into a
per-layer or per-head loop fails here, not on a GPU node."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import op_budget  # noqa: E402
from synthetic import ModelSpec  # noqa: E402

from ckptscan.monitors import output  # noqa: E402


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, float]:
    spec = ModelSpec("llama-small-4l", "llama", 4, 256, 8, 2, 512, 4096)
    blocks = output.BLOCK_ELEMENTS
    output.BLOCK_ELEMENTS = spec.vocab * spec.hidden // 4  # the 1B head's 4 GPU blocks
    try:
        counted, layers = op_budget.count(spec.layers, tmp_path_factory.mktemp("op-budget"), spec=spec)
    finally:
        output.BLOCK_ELEMENTS = blocks
    return op_budget.figures(counted, layers)


def test_a_pair_launches_at_most_100_kernels_a_layer(measured):
    assert measured["kernel_ops_per_layer"] <= 100


def test_a_pair_reads_at_most_2_scalars_a_layer(measured):
    assert measured["scalar_reads_per_layer"] <= 2


def test_a_pair_makes_at_most_2_solver_calls_a_layer(measured):
    assert measured["solver_calls_per_layer"] <= 2


def test_the_count_sees_what_it_counts(measured):
    # The counter is live: a scan of 4 layers dispatches ops and solves (a budget met by counting nothing fails).
    assert measured["kernel_ops_per_layer"] >= 20 and measured["solver_calls_per_layer"] > 0
