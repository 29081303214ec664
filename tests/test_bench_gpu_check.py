"""bench/gpu_check.py, the GPU check of issue 30, kept from rotting on CPU-only CI.

The script itself runs on a GPU machine (its dry run: `--device cpu --shape
tiny`, a minute); here, in seconds: its comparisons on real reports of the
sample run, its table and exit status, its refusal of --device cuda where
there is no CUDA device, the row of a crashed `ckptscan` process, and the
rows of the CPU proxies (bench/op_budget.py's JSON line)."""

from __future__ import annotations

import copy
import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch

from ckptscan.pipeline.api import scan_pair
from ckptscan.detection.rules import Thresholds
from ckptscan.document.plain import report_dict

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


def test_a_crashed_ckptscan_is_named_by_its_exit_code_and_last_stderr_line(gpu_check, tmp_path):
    """A real `ckptscan diff` that cannot run (exit 2, one line) and the crash
    issue 50 measured (a traceback, exit 1, no report): each is a FAIL row with
    the exit code and what the process said last, not an error about the JSON
    report it never wrote."""
    report = tmp_path / "device.json"
    run = gpu_check.run_ckptscan("diff", str(HEALTHY / "checkpoint-1000"), str(tmp_path / "missing"),
                                 "--json", str(report))
    assert run.returncode == 2 and run.crashed(report)
    row = gpu_check.crash_row("a", "`ckptscan diff --device cuda`", run)
    assert row.result == "FAIL" and row.figure.startswith("crashed: exit 2, error: ")
    assert str(tmp_path / "missing") in row.figure
    assert gpu_check.exit_status([row]) == 1

    traceback = ("Traceback (most recent call last):\n  File \"monitors/attention.py\", line 296\n"
                 "RuntimeError: lazy wrapper should be called at most once\n")
    old_crash = gpu_check.CliRun(wall_s=3.0, returncode=1, stderr=traceback)
    assert old_crash.crashed(report)  # exit 1, the gate's code, but no report: not a verdict
    assert gpu_check.crash_row("a", "diff", old_crash).figure == \
        "crashed: exit 1, RuntimeError: lazy wrapper should be called at most once"

    report.write_text("{}")
    assert not gpu_check.CliRun(wall_s=3.0, returncode=1, stderr="gate failed ...").crashed(report)


def write_script(path, body: str):
    path.write_text("import sys\n" + body)
    return path


@pytest.mark.parametrize("figures, results", [
    ({"kernel_ops_per_layer": 559.0, "scalar_reads_per_layer": 96.0, "solver_calls_per_layer": 11.0, "layers": 4},
     ["FAIL", "FAIL", "FAIL"]),
    ({"kernel_ops_per_layer": 100.0, "scalar_reads_per_layer": 1.5, "solver_calls_per_layer": 3.0, "layers": 4},
     ["PASS", "PASS", "FAIL"]),
])
def test_the_cpu_proxies_are_a_row_each_against_its_target(gpu_check, tmp_path, figures, results):
    script = write_script(tmp_path / "op_budget.py", f"print('counting ...')\nprint({json.dumps(figures)!r})\n")
    rows = gpu_check.proxy_rows(script)
    assert [row.part for row in rows] == ["e"] * 3
    assert [row.target for row in rows] == ["≤ 100", "≤ 2", "≤ 2"]
    assert [row.result for row in rows] == results
    assert rows[0].figure == f"{figures['kernel_ops_per_layer']:.1f}" and "4 layers" in rows[0].check
    assert gpu_check.exit_status(rows) == 1


def test_a_missing_or_failing_proxy_script_is_a_row_that_says_so(gpu_check, tmp_path):
    [missing] = gpu_check.proxy_rows(tmp_path / "op_budget.py")
    assert missing.result == "NOT RUN" and "missing" in missing.figure

    failing = write_script(tmp_path / "failing.py", "print('a line')\nsys.exit('no checkpoints: disk full')\n")
    [failed] = gpu_check.proxy_rows(failing)
    assert failed.result == "ERROR" and failed.figure == "exit 1, no checkpoints: disk full"

    silent = write_script(tmp_path / "silent.py", "print('figures: none')\n")
    [unreadable] = gpu_check.proxy_rows(silent)
    assert unreadable.result == "ERROR" and unreadable.figure.startswith("no figures in its last line")
    assert gpu_check.exit_status([missing]) == gpu_check.exit_status([failed]) == 1
