"""ckptscan.live.Monitor in a plain PyTorch loop: the numbers and the verdict
of `ckptscan trend` on checkpoints saved at the same steps, without touching
the training. The scan runs in the background (tests/live/test_background.py
pins how); tests that look at the monitor between steps `wait()` for it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from ckptscan.pipeline.api import scan
from ckptscan.errors import CkptScanError
from ckptscan.detection.rules import Thresholds
from ckptscan.live import Alert, Monitor
from ckptscan.document.plain import report_dict
from ckptscan.pipeline.run import resolve_run
from ckptscan.scan import ScanOptions
from live.helpers import assert_same, comparable, number_of_floats, save_checkpoint, tiny_config, train

EVERY = 5
STEPS = 60
SEED = 2  # a seed whose run alerts (attention, step 50): the verdict is worth comparing
PROBE = torch.randint(0, 256, (1, 32), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def live_run(tmp_path_factory):
    """A run monitored live every EVERY steps, with checkpoints saved at the same steps."""
    run = tmp_path_factory.mktemp("run")
    state = {"alerts": [], "reports": {}}

    def after_step(model, step):
        if "monitor" not in state:
            state["monitor"] = Monitor(model, every=EVERY, probe=PROBE, out=run / "live",
                                       config=model.cfg.to_hf("float32"), thresholds=Thresholds(),
                                       on_alert=state["alerts"].append)
        if step % EVERY == 0:
            save_checkpoint(model, run / f"checkpoint-{step}")
        state["monitor"].step(step)
        if step % EVERY == 0 and state["monitor"].report is not None:
            state["reports"][step] = json.loads((run / "live" / "report.json").read_text())

    train(STEPS, seed=SEED, after_step=after_step)
    state["monitor"].close()  # the last scan, and every pair in the file
    state["final"] = json.loads((run / "live" / "report.json").read_text())
    return run, state


def offline(run: Path) -> dict:
    spec = resolve_run(run, probe=run / "live" / "probe.safetensors", loss_log=None, config=None)
    return report_dict(scan(spec, ScanOptions(workers=1)))


def test_live_report_equals_trend_on_the_saved_checkpoints(live_run):
    run, state = live_run
    live = json.loads((run / "live" / "report.json").read_text())
    expected = offline(run)
    assert live["command"] == expected["command"] == "trend"
    assert [(p["from_step"], p["to_step"]) for p in live["pairs"]] == \
        [(s, s + EVERY) for s in range(EVERY, STEPS, EVERY)]
    assert_same(comparable(live), comparable(expected))
    assert number_of_floats(comparable(expected)) > 1000  # the comparison covers the per-head numbers
    # The run has a verdict worth comparing: it alerts, and routing entropy (the probe) is there.
    assert expected["summary"]["status"] == "alert"
    assert expected["pairs"][-1]["layers"][0]["router"]["routing_entropy"] is not None
    assert live["settings"]["live"] == {"every": EVERY, "float64_pairs": 0}  # float32 Grams, as trend's


def test_a_verdict_does_not_change_as_the_run_grows(live_run):
    """Every report written during the run (as far as the background scan
    had got) agrees with the final one on the pairs it had (from two pairs
    on: a lone pair is judged like diff)."""
    _, state = live_run
    final = state["final"]
    assert len(state["reports"]) >= 2
    for step, report in state["reports"].items():
        if len(report["pairs"]) < 2:
            continue
        for then, now in zip(report["pairs"], final["pairs"]):
            assert then["status"] == now["status"], step
            assert [layer["findings"] for layer in then["layers"]] == [layer["findings"] for layer in now["layers"]]
            assert [layer["judgements"] for layer in then["layers"]] == \
                [layer["judgements"] for layer in now["layers"]]


def test_on_alert_callable_gets_each_alert_of_the_newest_interval(live_run):
    _, state = live_run
    final = state["final"]
    expected = [(pair["to_step"], layer["layer"], finding["monitor"])
                for pair in final["pairs"][1:] for layer in pair["layers"] for finding in layer["findings"]
                if finding["severity"] == "alert"]
    assert expected  # the run alerts
    alerts = state["alerts"]
    assert all(isinstance(a, Alert) for a in alerts)
    assert [(a.step, a.layer, a.finding.monitor) for a in alerts] == expected
    assert alerts[0].step == final["summary"]["first_alert_step"]["attention"]


def test_the_monitor_leaves_training_untouched(tmp_path):
    """Same seed with and without the monitor: bit-identical losses; after each
    monitored step the grads, the RNG state and every module's mode are as before."""
    checked = []

    def after_step(model, step):
        if not hasattr(model, "_monitor"):
            model._monitor = Monitor(model, every=3, probe=PROBE, out=tmp_path,
                                     config=model.cfg.to_hf("float32"), thresholds=Thresholds())
        grads = [p.grad.clone() for p in model.parameters()]
        rng = torch.get_rng_state()
        modes = [m.training for m in model.modules()]
        params = [p.detach().clone() for p in model.parameters()]
        model._monitor.step(step)
        assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))
        assert all(torch.equal(a, p) for a, p in zip(params, model.parameters()))
        assert torch.equal(rng, torch.get_rng_state())
        assert modes == [m.training for m in model.modules()] and all(modes)
        checked.append(step)

    plain = train(12)
    monitored = train(12, after_step=after_step)
    assert monitored == plain  # bit-identical, not close
    assert checked == list(range(1, 13))


def test_stop_and_save_are_requested_at_the_first_alert_when_scanning_in_the_step(tmp_path):
    """With background=False the scan runs inside step(): a NaN that reaches
    a query projection at step 9 is an alert on the interval ending at 9,
    acted on at step 9: "stop" sets should_stop, "save" calls save(9)."""
    model = _model()
    saved = []
    kwargs = dict(every=3, config=model.cfg.to_hf("float32"), thresholds=Thresholds(), background=False)
    stop = Monitor(model, on_alert="stop", out=tmp_path / "a", **kwargs)
    save = Monitor(model, on_alert="save", save=saved.append, out=tmp_path / "b", **kwargs)
    stopped_at = None
    for step in range(1, 16):
        _nudge(model)
        if step == 8:  # two non-finite tensors: two alerts, still one save per step
            with torch.no_grad():
                model.model.layers[1].self_attn.q_proj.weight[0, 0] = float("nan")
                model.model.layers[0].self_attn.k_proj.weight[0, 0] = float("inf")
        stop.step(step)
        save.step(step)
        if stop.should_stop and stopped_at is None:
            stopped_at = step
    assert stopped_at == 9
    assert saved == [9, 12, 15] and save.should_save  # the NaN stays: each interval alerts
    assert len(save._alerts()) == 2
    assert stop.report.summary.first_alert_step["numeric"] == 9


def test_only_every_nth_step_is_monitored(tmp_path):
    model = _model()
    monitor = Monitor(model, every=4, out=tmp_path, config=model.cfg.to_hf("float32"), thresholds=Thresholds())
    for step in (1, 2, 3, 4, 4, 5, 8, 12):
        _nudge(model)
        monitor.step(step)
    monitor.wait()
    assert [c.step for c in monitor.checkpoints] == [4, 8, 12]  # a repeated step is not monitored twice
    assert [(p.from_step, p.to_step) for p in monitor.report.pairs] == [(4, 8), (8, 12)]
    assert json.loads((tmp_path / "report.json").read_text())["pairs"][-1]["to_step"] == 12


def test_only_the_monitored_tensors_are_copied(tmp_path):
    model = _model()
    monitor = Monitor(model, every=1, out=tmp_path, config=model.cfg.to_hf("float32"), thresholds=Thresholds())
    monitor.step(1)
    held = monitor.previous.tensors._tensors
    # With the last layer, the output family's tied head (the embedding) and final norm.
    assert sorted(held) == sorted([f"model.layers.{i}.{t}" for i in range(2) for t in (
        "self_attn.q_proj.weight", "self_attn.k_proj.weight", "input_layernorm.weight",
        "block_sparse_moe.gate.weight")] + ["model.embed_tokens.weight", "model.norm.weight"])
    # Copies, not views of the live parameters.
    name = "model.layers.0.self_attn.q_proj.weight"
    assert held[name].data_ptr() != model.model.layers[0].self_attn.q_proj.weight.data_ptr()


@pytest.mark.parametrize("kwargs, message", [
    ({"every": 0}, "every must be"),
    ({"on_alert": "explode"}, "on_alert must be one of"),
])
def test_bad_settings_are_one_clear_error(tmp_path, kwargs, message):
    model = _model()
    with pytest.raises(CkptScanError, match=message):
        Monitor(model, out=tmp_path, config=model.cfg.to_hf("float32"), **kwargs)


def test_a_model_no_resolver_knows_is_named_as_such(tmp_path):
    with pytest.raises(CkptScanError, match="no layout resolver"):
        Monitor(torch.nn.Linear(4, 4), out=tmp_path)


def _model():
    from experiments.model import MixtralForCausalLM

    torch.manual_seed(0)
    return MixtralForCausalLM(tiny_config())


def _nudge(model):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 1e-2)



def test_a_nonfinite_value_alerts_on_the_first_interval(tmp_path):
    """A lone first interval is judged like diff, but non-finite values are
    alerts whatever the series: on_alert hears of them at once."""
    model = _model()
    alerts = []
    monitor = Monitor(model, every=2, out=tmp_path, config=model.cfg.to_hf("float32"), thresholds=Thresholds(),
                      on_alert=alerts.append)
    monitor.step(2)
    with torch.no_grad():
        model.model.layers[0].block_sparse_moe.gate.weight[1, 3] = float("inf")
    monitor.step(4)
    monitor.close()
    assert [(a.step, a.layer, a.finding.family, a.finding.message) for a in alerts] == [
        (4, 0, "numeric", "1 non-finite value(s) in router")]


def test_the_metrics_go_to_tensorboard_for_a_plain_loop(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model = _model()
    monitor = Monitor(model, every=1, out=tmp_path, config=model.cfg.to_hf("float32"), thresholds=Thresholds(),
                      tensorboard=tmp_path / "tb")
    for step in (1, 2, 3):
        _nudge(model)
        monitor.step(step)
    monitor.close()
    events = EventAccumulator(str(tmp_path / "tb")).Reload()
    name = "ckptscan/L1/delta2_entropy_norm"
    values = {e.step: e.value for e in events.Scalars(name)}
    assert values == {p.to_step: pytest.approx(p.layers[1].attention.delta2_entropy_norm, rel=1e-6)
                      for p in monitor.report.pairs}
    assert sorted(values) == [2, 3]


def test_the_plain_monitor_pulls_in_no_training_framework():
    """The callbacks live in optional extras: the base install must not need them."""
    import subprocess
    import sys

    code = ("import sys; from ckptscan.live import Monitor; "
            "print(sorted(m for m in ('transformers', 'lightning', 'pytorch_lightning') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parents[2]).stdout
    assert out.strip() == "[]"


def test_the_report_file_is_written_at_spaced_steps_and_close_writes_the_rest(tmp_path):
    """Writing every pair costs O(pairs) a step: past 64 pairs the file waits
    until the pairs missing from it are 1/32 of those in it; `close` writes the rest."""
    model = _model()
    calm = Thresholds(warn_sigma=1e3, alert_sigma=1e3, cusum_warn=1e6, cusum_alert=1e6, pooled_cusum_warn=1e6,
                      pooled_cusum_alert=1e6)  # no verdict change to force a write
    monitor = Monitor(model, every=1, out=tmp_path, config=model.cfg.to_hf("float32"), thresholds=calm)
    in_file = []
    for step in range(1, 72):
        _nudge(model)
        monitor.step(step)
        monitor.wait()  # the file as the scan of this step left it
        if monitor.report is not None:
            in_file.append(len(json.loads((tmp_path / "report.json").read_text())["pairs"]))
    assert monitor.report.summary.status == "ok"
    assert in_file[:64] == list(range(1, 65))
    assert in_file[64:] == [64, 66, 66, 68, 68, 70]
    monitor.close()
    assert json.loads((tmp_path / "report.json").read_text()) == report_dict(monitor.report)


def test_on_alert_posts_the_alert_to_a_webhook_once(tmp_path, monkeypatch):
    """Live mode's notification recipe (docs/guides/alerts.md): on_alert hands
    the judged report to a Notifier through `deliver`; a real local HTTP
    server receives one JSON POST naming the failing layer's family."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from ckptscan.report.destinations import deliver
    from ckptscan.report.notify import Notifier

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # where the Notifier remembers what it sent
    received = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self):
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        notifier = Notifier(f"http://127.0.0.1:{server.server_port}/hook")
        model = _model()
        monitor = Monitor(model, every=2, out=tmp_path / "live", config=model.cfg.to_hf("float32"),
                          thresholds=Thresholds(),
                          on_alert=lambda alert: deliver("--notify", notifier.update, monitor.report))
        monitor.step(2)
        with torch.no_grad():
            model.model.layers[0].block_sparse_moe.gate.weight[1, 3] = float("inf")
        monitor.step(4)
        monitor.step(6)  # the alert persists: nothing more is sent
        monitor.close()
    finally:
        server.shutdown()
    assert len(received) == 1, received
    text = received[0]["text"]
    assert "numeric" in text and "step 4" in text, text


def test_recorded_learning_rates_are_each_pairs_mean_rate(tmp_path):
    """`record(step, loss, lr=…)` gives each pair the mean LR of its updates
    (recorded steps from_step … to_step − 1), as a loss log's `lr` does."""
    rates = np.random.default_rng(4).uniform(1e-4, 1e-3, 20)
    state = {}

    def after_step(model, step):
        if "monitor" not in state:
            state["monitor"] = Monitor(model, every=EVERY, out=tmp_path / "live", config=model.cfg.to_hf("float32"),
                                       thresholds=Thresholds())
        state["monitor"].record(step - 1, 2.0, lr=float(rates[step - 1]))  # the update that made step `step`
        state["monitor"].step(step)

    train(20, seed=SEED, after_step=after_step)
    state["monitor"].close()
    pairs = state["monitor"].report.pairs
    assert [(p.from_step, p.to_step) for p in pairs] == [(5, 10), (10, 15), (15, 20)]
    for pair in pairs:
        assert pair.lr == pytest.approx(float(np.mean(rates[pair.from_step:pair.to_step])), rel=1e-12)
