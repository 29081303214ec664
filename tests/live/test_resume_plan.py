"""Live mode gives the resume plan `ckptscan trend` gives on checkpoints saved
at the same steps (issue 51), and a job that stops on an alert leaves it
beside its report: `summary.resume` in OUT/report.json, the same lines as
`trend` prints in OUT/resume.txt, and in the log with the alert."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from ckptscan.detection.rules import Thresholds
from ckptscan.live import Monitor
from ckptscan.pipeline.api import scan
from ckptscan.pipeline.run import resolve_run
from ckptscan.document.plain import report_dict
from ckptscan.report.resume import terminal_lines
from ckptscan.scan import ScanOptions
from ckptscan.schema.results import Summary, from_dict
from live.helpers import save_checkpoint, train

EVERY = 5
STEPS = 60
SEED = 2  # a seed whose run alerts (attention, step 50), as tests/live/test_monitor.py's
PROBE = torch.randint(0, 256, (1, 32), generator=torch.Generator().manual_seed(1))


def test_a_job_that_stops_on_an_alert_leaves_the_plan_trend_gives_beside_its_report(tmp_path, caplog):
    run = tmp_path / "run"
    state: dict = {}

    def after_step(model, step):
        if "monitor" not in state:
            state["monitor"] = Monitor(model, every=EVERY, probe=PROBE, out=run / "live", on_alert="stop",
                                       config=model.cfg.to_hf("float32"), thresholds=Thresholds())
        monitor = state["monitor"]
        if step % EVERY == 0 and "stopped" not in state:
            save_checkpoint(model, run / f"checkpoint-{step}")
        monitor.step(step)
        if monitor.should_stop and "stopped" not in state:
            state["stopped"] = step
            # What the stopped job leaves, read before close(): the report and the plan beside it.
            state["report"] = json.loads(monitor.report_path.read_text())
            state["plan"] = monitor.resume_path.read_text()

    with caplog.at_level(logging.WARNING, logger="ckptscan.live"):
        train(STEPS, seed=SEED, after_step=after_step)
    monitor = state["monitor"]
    monitor.close()
    assert "stopped" in state, "the run alerts and on_alert='stop' asked to stop"
    live = state["report"]["summary"]
    assert live["resume"] is not None
    lines = terminal_lines(from_dict(Summary, live))
    assert state["plan"] == "\n".join(lines) + "\n"
    assert lines[0].startswith("rollback candidate: ")
    assert "resume plan" in caplog.text and lines[0] in caplog.text

    # `trend` on the checkpoints saved at the same steps, up to the interval that alerted: the same plan.
    stopped_pairs = len(state["report"]["pairs"])
    for late in sorted(run.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1])):
        if int(late.name.split("-")[1]) > EVERY * (stopped_pairs + 1):
            for file in late.iterdir():
                file.unlink()
            late.rmdir()
    spec = resolve_run(run, probe=run / "live" / "probe.safetensors", loss_log=None, config=None)
    offline = report_dict(scan(spec, ScanOptions(workers=1)))["summary"]
    assert offline["first_alert_step"] == live["first_alert_step"]
    ours, theirs = live["resume"], offline["resume"]
    for key in ("skip_first_step", "skip_last_step", "lr", "interventions"):
        assert ours[key] == theirs[key], key
    assert [r["step"] for r in ours["rejected"]] == [r["step"] for r in theirs["rejected"]]
    assert (ours["checkpoint"] or {}).get("step") == (theirs["checkpoint"] or {}).get("step")
    if ours["checkpoint"] is not None:
        # The snapshot of step N stands for the trainer's own checkpoint of step N.
        assert ours["checkpoint"]["path"] == f"live:step-{ours['checkpoint']['step']}"
        assert Path(theirs["checkpoint"]["path"]).name == f"checkpoint-{ours['checkpoint']['step']}"
        assert lines[0].startswith(f"rollback candidate: the trainer's checkpoint at step {ours['checkpoint']['step']}")
