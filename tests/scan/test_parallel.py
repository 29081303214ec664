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
from ckptscan.executors.local import LocalExecutor
from ckptscan.system import linalg_warmup
from ckptscan.system.linalg_warmup import warm_linalg
from ckptscan.system.parallel import ordered_map, plan_threads, torch_threads
from ckptscan.document.plain import report_dict
from ckptscan import scan_pair
from ckptscan.scan import ScanOptions, reading, resolve_device, tasks
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
    assert plan_threads(32) == (16, 1)  # the CPUs come from usable_cpus unless given
    with pytest.raises(ValueError):
        plan_threads(4, workers=0)


# (CPUs, tasks) -> (workers, intra-op threads each): a 1B model's 16 layers, a
# 70B model's 80, and a single layer, on the CI machine's 2 cores and on nodes.
PLANS = {
    (2, 16): (2, 1), (2, 80): (2, 1), (2, 1): (1, 2),  # the measured 2-core plan, as it was
    (8, 16): (8, 1), (8, 80): (8, 1), (8, 1): (1, 4), (8, 3): (3, 2),
    (16, 16): (16, 1), (16, 80): (16, 1), (16, 1): (1, 4), (16, 4): (4, 4),
    (64, 16): (16, 4), (64, 80): (16, 4), (64, 1): (1, 4), (64, 32): (16, 4),
}


@pytest.mark.parametrize("cpus, tasks", list(PLANS))
def test_plan_threads_gives_small_solves_one_thread_each_and_spare_cores_to_the_gemms(cpus, tasks):
    """One worker per core (each per-head eigensolve batch wants one intra-op
    thread), up to one per task and 16; cores no task needs become at most
    four intra-op threads a worker (the Gram GEMMs use them); never more
    threads than cores."""
    workers, threads = plan_threads(tasks, cpus=cpus)
    assert (workers, threads) == PLANS[cpus, tasks]
    assert workers <= tasks and workers * threads <= max(cpus, 2)


@pytest.mark.parametrize("cpus", [2, 8, 16, 64])
def test_plan_threads_keeps_the_running_layers_within_the_memory_budget(cpus):
    gib = 2**30
    # A 70B layer's tensors of two checkpoints and their Grams, ~2 GiB a task, under a 10 GiB budget.
    workers, threads = plan_threads(80, cpus=cpus, layer_bytes=2 * gib, memory_budget=10 * gib)
    assert workers * 2 * gib <= 10 * gib
    assert workers == min(5, {2: 2}.get(cpus, 16))
    assert threads == (1 if cpus == 2 else min(4, cpus // workers))
    # A task larger than the budget still runs, alone.
    assert plan_threads(80, cpus=cpus, layer_bytes=20 * gib, memory_budget=10 * gib)[0] == 1
    # Without the task's bytes, or with a budget that fits them all, the plan is the CPUs' alone.
    assert plan_threads(80, cpus=cpus) == plan_threads(80, cpus=cpus, layer_bytes=1, memory_budget=10 * gib)


def test_a_scan_tells_the_plan_what_a_task_holds(pair, monkeypatch):
    # The largest layer of two checkpoints at 4 bytes a value, twice over, and
    # the waiting Gram blocks with their solve's memory: from the headers alone.
    from ckptscan.layouts import resolve_layout
    from ckptscan.readers import open_checkpoint

    seen = []
    original = LocalExecutor.__init__

    def spy(self, *args, **kwargs):
        seen.append(kwargs.get("layer_bytes"))
        original(self, *args, **kwargs)

    monkeypatch.setattr(LocalExecutor, "__init__", spy)
    scan_pair(*pair, ScanOptions(workers=1))
    ckpt = open_checkpoint(pair[0])
    read = [sum(math.prod(ckpt.tensors.shape(n)) for n in plan.tensors) for plan in resolve_layout(ckpt).layers]
    assert seen == [2 * 2 * 4 * max(read) + tasks.SOLVE_FACTOR * tasks.PENDING_BYTES]


def test_plan_threads_with_workers_given_shares_the_cpus_among_them():
    assert plan_threads(32, workers=4, cpus=2) == (4, 1)
    assert plan_threads(32, workers=2, cpus=16) == (2, 4)  # not 8: the eigensolves lose to their barriers
    assert plan_threads(3, workers=8, cpus=64) == (3, 4)  # never more workers than tasks


def test_warm_linalg_makes_the_solver_calls_once_per_device_on_the_calling_thread(monkeypatch):
    """The warm-up is real torch calls (here on the CPU and torch's meta
    device; on a GPU, CUDA's lazily loaded solvers): once per device."""
    monkeypatch.setattr(linalg_warmup, "warmed", {})
    assert warm_linalg("cpu") is True
    assert warm_linalg("cpu") is False
    assert warm_linalg("meta") is True
    assert linalg_warmup.warmed == {"cpu": threading.get_ident(), "meta": threading.get_ident()}


class DeviceTask:
    """A task on `device` as the executor sees a LayerTask: `options.device`,
    called with (item, stop) on worker threads. Records, at each call, which
    devices were warm and by which thread."""

    def __init__(self, device: str) -> None:
        self.options = ScanOptions(device=device)
        self.seen: list[tuple[int, dict[str, int]]] = []

    def __call__(self, item: int, stop: threading.Event) -> int:
        self.seen.append((threading.get_ident(), dict(linalg_warmup.warmed)))
        return item


@pytest.mark.parametrize("workers", [1, 2])
def test_the_executor_warms_a_devices_solvers_on_its_own_thread_before_the_pool(monkeypatch, workers):
    """A device other than the CPU (torch's meta device stands in for CUDA
    here) is warmed by the thread calling `map` before any worker runs a
    task, when there are several workers; one worker on the calling thread
    needs no warming (the crash is two threads loading the solvers at once)."""
    monkeypatch.setattr(linalg_warmup, "warmed", {})
    task = DeviceTask("meta")
    assert [r for _, r in LocalExecutor(workers=workers).map(task, list(range(6)))] == list(range(6))
    caller = threading.get_ident()
    if workers == 1:
        assert all(warm == {} for _, warm in task.seen)
        return
    assert {thread for thread, _ in task.seen} - {caller}  # the tasks ran on worker threads
    assert all(warm == {"meta": caller} for _, warm in task.seen)  # ... each after the caller warmed the device


def test_the_executor_leaves_the_cpu_alone(monkeypatch):
    monkeypatch.setattr(linalg_warmup, "warmed", {})
    task = DeviceTask("cpu")
    list(LocalExecutor(workers=2).map(task, [0, 1, 2]))
    assert linalg_warmup.warmed == {}


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
    """...and a CUDA device comes back with its solvers warmed on this thread
    (the warm-up itself is recorded here: this torch may have no CUDA)."""
    warmed = []
    monkeypatch.setattr(reading, "warm_linalg", warmed.append)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu"
    assert resolve_device("cpu") == "cpu"
    with pytest.raises(CkptScanError, match="no CUDA device"):
        resolve_device("cuda")
    assert warmed == []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("auto") == "cuda"
    assert resolve_device("cuda:0") == "cuda:0"
    with pytest.raises(CkptScanError, match="only 1 CUDA"):
        resolve_device("cuda:1")
    assert warmed == ["cuda", "cuda:0"]


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
