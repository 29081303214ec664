"""The attention-fault recipe (experiments/) run live: the monitor alerts at
the step where `ckptscan trend` on the run's checkpoints first alerts.

The recipe's trainer saves a float32 checkpoint and runs the monitor at the
same steps (`--live-every` = `--save-every`), and records the same loss log,
so the offline scan sees what the monitor saw."""

from __future__ import annotations

import json
import os

import pytest
import torch

from ckptscan.live.monitor import Monitor
from ckptscan.pipeline.api import scan
from ckptscan.document.plain import report_dict
from ckptscan.pipeline.run import resolve_run
from ckptscan.scan import ScanOptions
from experiments.make_samples import RUNS
from experiments.train import main as train_main
from live.helpers import assert_same, comparable


def live_and_offline(run, flags, monkeypatch):
    monitors = []

    class Tracked(Monitor):
        """The trainer's own Monitor, kept: the test closes it (waits for its last scan)."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            monitors.append(self)

    monkeypatch.setattr("ckptscan.live.monitor.Monitor", Tracked)
    threads = torch.get_num_threads()
    try:
        train_main(["--out", str(run), "--save-dtype", "float32", *flags])
    finally:
        torch.set_num_threads(threads)  # the trainer sets its own
    assert len(monitors) == 1
    monitors[0].close()
    live = json.loads((run / "live" / "report.json").read_text())
    # The run's own loss log and probe file are used, as `ckptscan trend RUN` does; the
    # probe is the one the monitor captured (the same tokens, at the same step 0).
    spec = resolve_run(run, probe=run / "live" / "probe.safetensors", config=None)
    assert spec.loss_log is not None
    return live, report_dict(scan(spec, ScanOptions(workers=1)))


def test_a_short_attention_fault_alerts_live_where_trend_does(tmp_path, monkeypatch):
    """A stronger, shorter variant of the recipe (1 mantissa bit, 20-step
    warm-up), stopped at step 120 (~30 s on 2 cores)."""
    live, offline = live_and_offline(tmp_path / "run", [
        "--fault", "attention", "--fault-mantissa-bits", "1", "--fault-rounding", "zero", "--steps", "400",
        "--warmup", "20", "--batch-size", "8", "--seq-len", "32", "--save-every", "20", "--live-every", "20",
        "--stop-at", "120"], monkeypatch)
    step = offline["summary"]["first_alert_step"]["attention"]
    assert step is not None and live["summary"]["first_alert_step"] == offline["summary"]["first_alert_step"]
    assert_same(comparable(live), comparable(offline))


@pytest.mark.skipif(os.environ.get("CKPTSCAN_SLOW") != "1", reason="~3.5 min on 2 cores; set CKPTSCAN_SLOW=1")
def test_the_shipped_attention_fault_recipe_alerts_live_at_step_1700(tmp_path, monkeypatch):
    """The sample run's recipe (sample_checkpoints/attention_fault, 3000-step
    schedule) to step 1800, monitored every 100 steps like its checkpoints."""
    live, offline = live_and_offline(tmp_path / "run", [*RUNS["attention_fault"], "--live-every", "100",
                                                        "--stop-at", "1800"], monkeypatch)
    assert live["summary"]["first_alert_step"]["attention"] == offline["summary"]["first_alert_step"]["attention"] \
        == 1700
    assert_same(comparable(live), comparable(offline))
