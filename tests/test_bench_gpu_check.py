"""bench/gpu_check.py, the GPU check of issue 30, kept from rotting on CPU-only CI.

The script itself runs on a GPU machine (its dry run: `--device cpu --shape
tiny`, a minute); here, in a second: its comparisons on real reports of the
sample run, its table and exit status, and its refusal of --device cuda
where there is no CUDA device."""

from __future__ import annotations

import copy
import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch

from ckptscan.pipeline.api import scan_pair
from ckptscan.detection.rules import Thresholds
from ckptscan.report.json import report_dict

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "gpu_check.py"
HEALTHY = ROOT / "sample_checkpoints" / "healthy"


@pytest.fixture(scope="module")
def gpu_check():
    """The script as a module; the folders it puts on sys.path are taken off again."""
    path = list(sys.path)
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # its dataclasses look their module up while it loads
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = path
        del sys.modules["gpu_check"]
    return module


@pytest.fixture(scope="module")
def report() -> dict:
    return report_dict(scan_pair(HEALTHY / "checkpoint-1000", HEALTHY / "checkpoint-1100",
                                 thresholds=Thresholds()))


def first_head(report: dict) -> dict:
    return report["pairs"][0]["layers"][0]["attention"]["heads"][0]


def test_per_head_entropies_of_a_real_report_are_compared(gpu_check, report):
    worst, count = gpu_check.head_entropy_difference(report, copy.deepcopy(report))
    heads = sum(len(layer["attention"]["heads"]) for layer in report["pairs"][0]["layers"])
    assert (worst, count) == (0.0, heads * len(gpu_check.HEAD_ENTROPIES))

    shifted = copy.deepcopy(report)
    first_head(shifted)["delta2_entropy"] += 2e-5
    worst, _ = gpu_check.head_entropy_difference(shifted, report)
    assert worst == pytest.approx(2e-5) and gpu_check.verdict(worst, gpu_check.EQUAL_WITHIN) == "FAIL"
    first_head(shifted)["delta2_entropy"] -= 1.9e-5
    assert gpu_check.verdict(gpu_check.head_entropy_difference(shifted, report)[0], gpu_check.EQUAL_WITHIN) == "PASS"

    first_head(shifted)["dwq_entropy"] = None  # a value on one side only
    assert gpu_check.head_entropy_difference(shifted, report)[0] == math.inf


def test_a_live_report_differs_from_trend_by_its_numbers_and_anything_else(gpu_check, report):
    same = gpu_check.equality_row("c", "live vs trend", gpu_check.report_difference(report, copy.deepcopy(report)))
    assert same.result == "PASS" and "0.0e+00" in same.figure

    changed = copy.deepcopy(report)
    first_head(changed)["q_spectral_norm"] *= 1 + 1e-3
    worst, count, mismatches = gpu_check.report_difference(changed, report)
    assert worst == pytest.approx(1e-3 * min(1.0, first_head(report)["q_spectral_norm"]), rel=1e-6)
    assert count > 100 and mismatches == []

    changed = copy.deepcopy(report)
    changed["pairs"][0]["status"] = "alert" if report["pairs"][0]["status"] != "alert" else "ok"
    row = gpu_check.equality_row("c", "live vs trend", gpu_check.report_difference(changed, report))
    assert row.result == "FAIL" and "report.pairs[0].status" in row.figure


def test_the_table_has_a_row_per_figure_in_part_order_and_the_status_follows_the_targets(gpu_check):
    Row = gpu_check.Row
    rows = [Row("c", "live every=50", "1.2%", "≤ 2.0%", gpu_check.verdict(0.012, 0.02)),
            Row("a", "per-head entropies", "max |Δ| 3e-07", "≤ 1e-05", gpu_check.verdict(3e-7, 1e-5)),
            Row("d", "device", "cpu")]
    lines = gpu_check.table(rows, "title").splitlines()
    assert lines[:4] == ["title", "", "| part | check | figure | target | result |", "|---|---|---|---|---|"]
    assert [line.split(" | ")[0] for line in lines[4:]] == ["| a", "| c", "| d"]
    assert "max \\|Δ\\| 3e-07" in lines[4]  # a | inside a cell would split it
    assert gpu_check.exit_status(rows) == 0
    assert gpu_check.exit_status([*rows, Row("b", "trend", "1.3x", "≤ 1.1x", gpu_check.verdict(1.3, 1.1))]) == 1
    assert gpu_check.exit_status([*rows, Row("b", "not finished", "--timeout", "", "NOT RUN")]) == 1
    assert gpu_check.verdict(math.nan, 1.0) == "FAIL"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_device_cuda_without_a_cuda_device_says_so_in_one_line_and_exits_2(gpu_check, capsys):
    assert gpu_check.main(["--device", "cuda"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and "no CUDA device" in err
