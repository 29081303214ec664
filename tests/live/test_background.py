"""Live mode scans in a background thread: a monitored step only takes the
snapshot. What that promises, pinned without timing the scan: the scan's
thread is held at a gate (`Monitor._before_scan`, called there before each
pair) that only the test opens."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from ckptscan.detection.rules import Thresholds
from ckptscan.live import Monitor
from ckptscan.live.background import THREAD_NAME
from ckptscan.live.pair_scan import cpu_float32_exact
from ckptscan.pipeline.api import scan
from ckptscan.pipeline.run import resolve_run
from ckptscan.document.plain import report_dict
from ckptscan.scan import ScanOptions
from experiments.model import MixtralForCausalLM
from live.helpers import assert_same, comparable, save_checkpoint, tiny_config

# Long enough never to be reached by a correct run; a broken one fails instead of hanging.
GATE_TIMEOUT = 120


class Gate:
    """Holds the scan of the pair ending at `at` (every pair: None) until opened."""

    def __init__(self, at: int | None = None):
        self.at, self.reached, self.opened = at, threading.Event(), threading.Event()
        self.threads: list[str] = []

    def __call__(self, step: int) -> None:
        self.threads.append(threading.current_thread().name)
        if self.at is None or step == self.at:
            self.reached.set()
            assert self.opened.wait(GATE_TIMEOUT), "the test never opened the gate"


def _model() -> MixtralForCausalLM:
    torch.manual_seed(0)
    return MixtralForCausalLM(tiny_config())


def _nudge(model: MixtralForCausalLM) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 1e-2)


def _monitor(model, tmp_path, **kwargs) -> Monitor:
    kwargs = {"every": 1, "config": model.cfg.to_hf("float32"), "thresholds": Thresholds(), **kwargs}
    return Monitor(model, out=tmp_path, **kwargs)


def test_a_step_returns_while_its_pair_is_still_being_scanned(tmp_path):
    model = _model()
    monitor = _monitor(model, tmp_path, every=2)
    gate = monitor._before_scan = Gate()
    monitor.step(2)
    _nudge(model)
    assert monitor.step(4) == []  # returns: the scan of (2, 4) cannot even start
    assert gate.reached.wait(GATE_TIMEOUT)
    assert gate.threads == [f"{THREAD_NAME}_0"]  # on the monitor's own thread
    assert monitor.report is None and not (tmp_path / "report.json").exists()
    assert monitor.step(5) == []  # a step that is not due never waits either...
    gate.opened.set()
    monitor.wait()  # ...wait() does
    assert [(p.from_step, p.to_step) for p in monitor.report.pairs] == [(2, 4)]
    assert [p["to_step"] for p in json.loads((tmp_path / "report.json").read_text())["pairs"]] == [4]
    monitor.close()


def test_the_next_snapshot_waits_for_the_scan_and_two_snapshots_are_held(tmp_path):
    """Back-pressure: while the scan of (1, 2) runs, the snapshot of step 3
    waits (it goes into the buffers of step 1, which that scan reads): no
    queue, no third copy, no pair skipped. The pairs equal those of a
    monitor that scans inside each step, on the same weights."""
    model = _model()
    monitor, inline = _monitor(model, tmp_path / "a"), _monitor(model, tmp_path / "b", background=False)
    gate = monitor._before_scan = Gate(at=2)
    name = "model.layers.0.self_attn.q_proj.weight"
    for step in (1, 2):
        _nudge(model)
        monitor.step(step)
        inline.step(step)
    step_1 = monitor._buffers.sets[0][name].clone()
    assert gate.reached.wait(GATE_TIMEOUT)
    _nudge(model)
    trainer = threading.Thread(target=monitor.step, args=(3,))
    trainer.start()
    trainer.join(timeout=0.5)
    assert trainer.is_alive()  # waiting for the scan of (1, 2)...
    assert torch.equal(monitor._buffers.sets[0][name], step_1)  # ...before overwriting what it reads
    gate.opened.set()
    trainer.join()
    inline.step(3)
    monitor.close()
    assert monitor.waited[0] == 0 and monitor.waited[2] > 0  # each monitored step's wait is measured
    assert len(monitor._buffers.sets) == 2  # step 3 reused step 1's buffers
    assert monitor.previous.tensors._tensors[name] is monitor._buffers.sets[0][name]
    assert comparable(report_dict(monitor.report)) == comparable(report_dict(inline.report))
    assert [(p.from_step, p.to_step) for p in monitor.report.pairs] == [(1, 2), (2, 3)]


def test_an_exception_in_the_scan_is_raised_in_the_training_thread(tmp_path):
    """At the next step (the next monitored one at the latest: it waits for
    the scan), and at every call after it: the series cannot go on without
    the lost pair. close() raises it too, and still ends the thread."""

    def fail(step):
        raise RuntimeError(f"the scan of step {step} broke")

    model = _model()
    monitor = _monitor(model, tmp_path / "a", every=2)
    monitor._before_scan = fail
    monitor.step(2)
    _nudge(model)
    monitor.step(4)  # hands the pair (2, 4) over; its scan fails on the other thread
    with pytest.raises(RuntimeError, match="the scan of step 4 broke"):
        monitor.step(6)
    with pytest.raises(RuntimeError, match="the scan of step 4 broke"):
        monitor.step(7)
    with pytest.raises(RuntimeError, match="the scan of step 4 broke"):
        monitor.close()
    assert monitor._thread._pool is None

    other = _monitor(model, tmp_path / "b", every=2)
    other._before_scan = fail
    other.step(2)
    _nudge(model)
    other.step(4)
    with pytest.raises(RuntimeError, match="the scan of step 4 broke"):
        other.close()


def test_close_waits_for_the_last_scan(tmp_path):
    """The gate opens 0.3 s after close() is called: only a close() that
    waits finds the last pair in the file when it returns."""
    model = _model()
    monitor = _monitor(model, tmp_path)
    gate = monitor._before_scan = Gate(at=2)
    monitor.step(1)
    _nudge(model)
    monitor.step(2)
    assert gate.reached.wait(GATE_TIMEOUT)
    threading.Timer(0.3, gate.opened.set).start()
    monitor.close()
    assert [p["to_step"] for p in json.loads((tmp_path / "report.json").read_text())["pairs"]] == [2]
    assert monitor._thread._pool is None


def test_the_context_manager_closes(tmp_path):
    model = _model()
    with _monitor(model, tmp_path) as monitor:
        for step in (1, 2, 3):
            _nudge(model)
            monitor.step(step)
    assert [p["to_step"] for p in json.loads((tmp_path / "report.json").read_text())["pairs"]] == [2, 3]
    assert monitor._thread._pool is None


def test_stop_and_save_act_when_the_scan_reports(tmp_path):
    """A NaN from step 8 alerts on the interval 6 → 9. Held at the gate, its
    scan reports nothing at steps 10 and 11; once it reports (here at wait()),
    "stop" sets should_stop and "save" saves the model at the step it is at.
    Without the gate the stop comes by step 12 (whose snapshot waits)."""
    model = _model()
    stop = _monitor(model, tmp_path / "stop", every=3, on_alert="stop")
    saved: list[int] = []
    save = _monitor(model, tmp_path / "save", every=3, on_alert="save", save=saved.append)
    free = _monitor(model, tmp_path / "free", every=3, on_alert="stop")
    stop._before_scan, save._before_scan = Gate(at=9), Gate(at=9)
    stopped_at = None
    for step in range(1, 12):
        _nudge(model)
        if step == 8:
            with torch.no_grad():
                model.model.layers[1].self_attn.q_proj.weight[0, 0] = float("nan")
        for monitor in (stop, save, free):
            monitor.step(step)
        if step >= 10:
            assert not stop.should_stop and not save.should_save and saved == []
        if free.should_stop and stopped_at is None:
            stopped_at = step
    for monitor in (stop, save):
        monitor._before_scan.opened.set()
    alerts = stop.wait()
    assert [(a.step, a.layer, a.finding.family) for a in alerts] == [(9, 1, "numeric")]
    assert stop.should_stop
    save.wait()
    assert save.should_save and saved == [11]
    free.step(12)
    if stopped_at is None:
        stopped_at = 12 if free.should_stop else None
    assert stopped_at in (10, 11, 12)
    for monitor in (stop, save, free):
        monitor.close()


def test_the_scan_changes_no_setting_of_the_trainer(tmp_path):
    """The trainer's thread count and float32 matmul precision stay as it set
    them, during and after the scans. The legacy "high" precision lowers the
    CPU's float32 matmuls too: the scan then computes its Grams in float64,
    and the report equals `trend --precision float64` on checkpoints saved
    at the same steps."""
    threads = torch.get_num_threads()
    model = _model()
    run = tmp_path / "run"
    seen: list[tuple[int, str]] = []
    torch.set_num_threads(1)
    torch.set_float32_matmul_precision("high")
    try:
        assert not cpu_float32_exact()
        monitor = Monitor(model, every=2, out=run / "live", config=model.cfg.to_hf("float32"),
                          thresholds=Thresholds())
        monitor._before_scan = lambda step: seen.append((torch.get_num_threads(),
                                                         torch.get_float32_matmul_precision()))
        for step in range(1, 9):
            _nudge(model)
            if step % 2 == 0:
                save_checkpoint(model, run / f"checkpoint-{step}")
            monitor.step(step)
            assert (torch.get_num_threads(), torch.get_float32_matmul_precision()) == (1, "high")
        monitor.close()
        assert (torch.get_num_threads(), torch.get_float32_matmul_precision()) == (1, "high")
    finally:
        torch.set_float32_matmul_precision("highest")
        torch.set_num_threads(threads)
    assert seen == [(1, "high")] * 3  # the scan's thread starts from the trainer's count
    live = json.loads((run / "live" / "report.json").read_text())
    assert live["settings"]["live"] == {"every": 2, "float64_pairs": 3}
    spec = resolve_run(run, probe=None, loss_log=None, config=None)
    offline = report_dict(scan(spec, ScanOptions(workers=1, compute_dtype=torch.float64)))
    assert_same(comparable(live), comparable(offline), tol=1e-9)


def test_float32_is_exact_unless_the_cpus_precision_is_lowered():
    """CUDA's TF32 switch leaves the CPU's matmuls exact; the legacy setter lowers both."""
    assert cpu_float32_exact()
    tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        assert cpu_float32_exact()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.set_float32_matmul_precision("medium")
    try:
        assert not cpu_float32_exact()
    finally:
        torch.set_float32_matmul_precision("highest")
    assert cpu_float32_exact()
