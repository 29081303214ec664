"""Layer workers (`ckptscan.system.parallel`) and device placement (`--device`).

No test here needs a GPU except the last, which compares the CUDA path with
the CPU path where a CUDA device exists and is skipped elsewhere.
"""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from ckptscan.cli import app
from ckptscan.errors import CkptScanError
from ckptscan.system.parallel import ordered_map, plan_threads, torch_threads
from ckptscan.report.json import report_dict
from ckptscan import scan_pair
from ckptscan.scan import ScanOptions, resolve_device, tasks
from factories import llama_config, llama_tensors, updated, write_hf_checkpoint

CONFIG = llama_config(layers=4, hidden=64, heads=4, kv_heads=2, experts=4)


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("pair")
    a = llama_tensors(CONFIG, seed=11)
    b = updated(a, 1e-3, torch.Generator().manual_seed(12))
    return (write_hf_checkpoint(root / "checkpoint-10", a, CONFIG, dtype=torch.bfloat16),
            write_hf_checkpoint(root / "checkpoint-20", b, CONFIG, dtype=torch.bfloat16))


def test_ordered_map_yields_in_order_whatever_finishes_first():
    delays = [0.05, 0.0, 0.03, 0.0, 0.01, 0.0]

    def task(i, stop):
        time.sleep(delays[i])
        return i * i

    assert list(ordered_map(task, range(len(delays)), workers=2)) == [i * i for i in range(len(delays))]
    assert list(ordered_map(task, range(len(delays)), workers=1)) == [i * i for i in range(len(delays))]


def test_ordered_map_raises_a_task_error_at_its_position():
    def task(i, stop):
        if i == 2:
            raise CkptScanError("bad layer")
        return i

    got = []
    with pytest.raises(CkptScanError, match="bad layer"):
        for value in ordered_map(task, range(6), workers=2):
            got.append(value)
    assert got == [0, 1]


def test_ordered_map_stops_running_tasks_when_the_consumer_leaves():
    started, stopped = threading.Event(), threading.Event()

    def task(i, stop):
        if i == 1:
            started.set()
            stopped.set() if stop.wait(timeout=5) else None
        return i

    results = ordered_map(task, range(10), workers=2)
    assert next(results) == 0
    assert started.wait(timeout=5)
    results.close()  # sets stop, cancels what has not started, waits for the rest
    assert stopped.is_set()


def test_plan_threads_shares_the_cpus_and_never_exceeds_the_tasks(monkeypatch):
    monkeypatch.setattr("ckptscan.system.parallel.usable_cpus", lambda: 2)
    assert plan_threads(32) == (2, 1)
    assert plan_threads(1) == (1, 2)  # one layer: its math gets both cores
    assert plan_threads(32, workers=1) == (1, 2)
    monkeypatch.setattr("ckptscan.system.parallel.usable_cpus", lambda: 16)
    assert plan_threads(32) == (2, 8)
    with pytest.raises(ValueError):
        plan_threads(4, workers=0)


def test_torch_threads_restores_the_previous_count():
    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def _floats(value, path=""):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _floats(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _floats(v, f"{path}[{i}]")
    else:
        yield path, value


def _assert_reports_close(a: dict, b: dict, rel: float) -> None:
    """The same keys, floats within `rel` (relative and absolute), everything else equal."""
    flat_a, flat_b = dict(_floats(a)), dict(_floats(b))
    assert flat_a.keys() == flat_b.keys()
    for key, x in flat_a.items():
        y = flat_b[key]
        if isinstance(x, float) and isinstance(y, float):
            assert math.isclose(x, y, rel_tol=rel, abs_tol=rel), key
        else:
            assert x == y, key


@pytest.mark.parametrize("precision", [torch.float32, torch.float64])
def test_one_or_two_workers_give_the_same_report(pair, precision):
    one = report_dict(scan_pair(*pair, ScanOptions(compute_dtype=precision, workers=1)))
    two = report_dict(scan_pair(*pair, ScanOptions(compute_dtype=precision, workers=2)))
    # Only the intra-op thread count differs, which may change GEMM rounding.
    _assert_reports_close(one, two, 1e-5 if precision == torch.float32 else 1e-10)


def test_auto_device_is_cuda_only_when_torch_sees_one(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu"
    assert resolve_device("cpu") == "cpu"
    with pytest.raises(CkptScanError, match="no CUDA device"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("auto") == "cuda"
    assert resolve_device("cuda:0") == "cuda:0"
    with pytest.raises(CkptScanError, match="only 1 CUDA"):
        resolve_device("cuda:1")


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "cuda:", "CPU"])
def test_unknown_devices_are_refused(device):
    with pytest.raises(CkptScanError, match="--device must be"):
        resolve_device(device)


def test_layers_are_placed_on_the_resolved_device(pair, monkeypatch):
    """The raw tensors go to options.device before any arithmetic."""
    seen = []
    real_compare = tasks.compare

    def spying_compare(layer, a, b, options, selection=None):
        seen.append((options.device, a.weights.q.device.type, b.weights.k.device.type, a.grams.qq.device.type))
        return real_compare(layer, a, b, options, selection)

    monkeypatch.setattr(tasks, "compare", spying_compare)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    scan_pair(*pair, ScanOptions(device="auto"))
    assert seen and set(seen) == {("cpu", "cpu", "cpu", "cpu")}


@pytest.mark.parametrize("workers", [1, 2])
def test_the_monitors_run_in_full_float32_whatever_the_caller_set(pair, monkeypatch, workers):
    """A training script's TF32 ("high"/"medium") must not reach the Gram
    products: live reports would differ from `trend` on the same weights.
    The caller's setting is back once the scan returns."""
    seen = []
    real_compare = tasks.compare

    def spying_compare(layer, a, b, options, selection=None):
        seen.append(torch.get_float32_matmul_precision())
        return real_compare(layer, a, b, options, selection)

    monkeypatch.setattr(tasks, "compare", spying_compare)
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        scan_pair(*pair, ScanOptions(workers=workers))
        assert torch.get_float32_matmul_precision() == "medium"
    finally:
        torch.set_float32_matmul_precision(before)
    assert seen and set(seen) == {"highest"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown when CUDA is absent")
def test_cli_refuses_cuda_without_a_gpu(pair):
    result = CliRunner().invoke(app, ["diff", str(pair[0]), str(pair[1]), "--device", "cuda"])
    assert result.exit_code == 2
    assert "no CUDA device" in result.output
    assert "Traceback" not in result.output


def test_cli_device_auto_and_cpu_write_the_same_report(pair, tmp_path):
    paths = {}
    for device in ("cpu", "auto"):
        paths[device] = tmp_path / f"{device}.json"
        result = CliRunner().invoke(app, ["diff", str(pair[0]), str(pair[1]), "--device", device,
                                          "--json", str(paths[device])])
        assert result.exit_code == 0, result.output
    if not torch.cuda.is_available():  # auto is the CPU here: byte-identical reports
        assert paths["cpu"].read_text() == paths["auto"].read_text()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("precision, rel", [(torch.float64, 1e-9), (torch.float32, 1e-4)])
def test_cuda_matches_cpu_within_the_documented_tolerance(pair, precision, rel):
    cpu = report_dict(scan_pair(*pair, ScanOptions(compute_dtype=precision)))
    gpu = report_dict(scan_pair(*pair, ScanOptions(compute_dtype=precision, device="cuda")))
    _assert_reports_close(cpu, gpu, rel)
