"""End to end on the shipped fault-injection runs (sample_checkpoints/):
healthy raises nothing; each fault alerts in its own family first, before
the loss diverges; the silent fault alerts although the loss never diverges."""

import json
import os
from pathlib import Path

import pytest

from ckptscan import scan_run

SAMPLES = Path(__file__).resolve().parent.parent / "sample_checkpoints"
# run -> the families that count as its own mechanism
RUNS = {
    "healthy": set(),
    "attention_fault": {"attention"},
    "router_fault": {"router"},
    "both_faults": {"attention", "router"},
    "silent_fault": {"attention"},
}

pytestmark = pytest.mark.skipif(not all((SAMPLES / run).is_dir() for run in RUNS),
                                reason="sample_checkpoints/ not present")


@pytest.fixture(scope="module")
def reports():
    def scan(run):
        return scan_run(SAMPLES / run)  # the run's own probe and loss log, as `ckptscan trend`

    return {run: scan(run) for run in RUNS}


def trainer_divergence(run):
    """The divergence step the trainer recorded (its own implementation of the same definition)."""
    return json.loads((SAMPLES / run / "run.json").read_text())["divergence"]["step"]


@pytest.mark.parametrize("run", RUNS)
def test_loss_divergence_agrees_with_the_trainer(reports, run):
    assert reports[run].summary.loss_divergence_step == trainer_divergence(run)


def test_healthy_run_raises_nothing(reports):
    s = reports["healthy"].summary
    assert s.status == "ok", s.message
    # 2 warm-up pairs (the LR warm-up ends at step 99), 5 that make the baselines.
    assert s.judged_pairs == 23 and s.not_judged[0].startswith("2 pairs: warm-up"), s.not_judged
    assert s.loss_divergence_step is None


@pytest.mark.parametrize("run", ["attention_fault", "router_fault", "both_faults", "silent_fault"])
def test_each_fault_alerts_in_its_own_family_first_and_before_divergence(reports, run):
    s = reports[run].summary
    assert s.status == "alert", s.message
    assert s.first_family in RUNS[run], s.message
    first = s.first_alert_step[s.first_family]
    others = [step for family, step in s.first_alert_step.items() if family not in RUNS[run] and step is not None]
    assert all(step > first for step in others), s.message
    if s.loss_divergence_step is not None:
        assert first < s.loss_divergence_step and s.lead_steps > 0


def test_attention_fault_leaves_the_router_quiet_and_router_fault_the_attention(reports):
    assert reports["attention_fault"].summary.first_alert_step["router"] is None
    # Routing collapsed at step 1000 reshapes what attention learns: by the end
    # of the run layer 0's Δ2 entropy has crept down far enough for its CUSUM
    # to alert (step 3000). Before that, for 1900 steps, attention is quiet.
    router_fault = reports["router_fault"].summary
    assert router_fault.first_family == "router"
    assert router_fault.first_alert_step["attention"] is None or \
        router_fault.first_alert_step["attention"] >= router_fault.first_alert_step["router"] + 1500


def test_router_fault_is_caught_right_after_it_starts(reports):
    s = reports["router_fault"].summary
    assert s.rollback_candidate.step == 1000  # the fault is switched on at step 1000
    assert s.first_alert_step["router"] <= 1200


def test_silent_fault_alerts_although_the_loss_never_diverges(reports):
    s = reports["silent_fault"].summary
    assert s.loss_divergence_step is None
    assert s.first_alert_step["attention"] is not None
    assert s.flagged_layers == [0]  # the fault is confined to layer 0


@pytest.mark.parametrize("run", sorted(RUNS))
def test_the_library_gives_exactly_what_the_cli_writes(reports, run, tmp_path, monkeypatch):
    """`ckptscan.scan_run(RUN)` and `ckptscan trend RUN --json` resolve the run
    the same way (its probe, loss log, config) and judge it the same way."""
    from typer.testing import CliRunner

    from ckptscan.cli import app
    from ckptscan.cli.options import DEFAULT_PER_HEAD
    from ckptscan.document.plain import report_dict

    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    path = tmp_path / "report.json"
    result = CliRunner().invoke(app, ["trend", str(SAMPLES / run), "--json", str(path), "--no-cache", "--quiet"])
    assert result.exit_code in (0, 1), result.output
    assert json.loads(path.read_text()) == json.loads(json.dumps(report_dict(reports[run], DEFAULT_PER_HEAD)))


def test_diff_in_the_library_and_the_cli_agree(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from ckptscan import scan_pair
    from ckptscan.cli import app
    from ckptscan.cli.options import DEFAULT_PER_HEAD
    from ckptscan.document.plain import report_dict

    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    older, newer = (str(SAMPLES / "attention_fault" / f"checkpoint-{s}") for s in (1700, 1800))
    path = tmp_path / "diff.json"
    result = CliRunner().invoke(app, ["diff", older, newer, "--json", str(path), "--quiet"])
    assert result.exit_code == 1, result.output  # layer 1's collapsed Δ2 entropy alerts
    assert json.loads(path.read_text()) == json.loads(json.dumps(report_dict(scan_pair(older, newer), DEFAULT_PER_HEAD)))


@pytest.mark.parametrize("run", sorted(RUNS))
def test_diff_and_trend_agree_on_the_absolute_rules_of_every_pair_they_both_judge(reports, run):
    """The rules that need no history (non-finite values, the hard floors and ceilings) give a pair the
    same alerts in the run (`trend`) as alone (`diff`); in the warm-up `trend` leaves the floors out."""
    from ckptscan.detection.rules import judge_alone, unjudged
    from ckptscan.detection.thresholds import Thresholds

    def absolute(pair, floors=True):
        return sorted((layer.layer, f.monitor) for layer in pair.layers for f in layer.findings
                      if f.rule in ("nonfinite", "ceiling") or floors and f.rule == "floor")

    report = report_of = reports[run]
    for pair in report_of.pairs:
        warm_up = pair.from_step < report.settings["warmup_end_step"]
        alone = judge_alone(unjudged(pair), Thresholds())
        assert absolute(pair) == absolute(alone, floors=not warm_up), (pair.from_step, pair.to_step)


def test_the_samples_warm_up_is_not_judged_and_says_why(reports):
    """The floors are left out of the warm-up (healthy runs of the natural corpus dip to 0.156 there,
    under the 0.2 floor): its pairs are not judged, never healthy, and say why."""
    for run, report in reports.items():
        warm_up = [p for p in report.pairs if p.from_step < report.settings["warmup_end_step"]]
        assert warm_up and {p.status for p in warm_up} == {"not_judged"}, run
        assert all(p.not_judged_reason.startswith("warm-up") for p in warm_up), run


def test_diff_of_two_checkpoints_of_a_run_uses_the_runs_probe_and_loss_log_as_trend_does(reports):
    """router_fault 1700 → 1800: routing entropy 0.097, under its 0.1 floor, which only the probe shows."""
    from typer.testing import CliRunner

    from ckptscan.cli import app

    older, newer = (str(SAMPLES / "router_fault" / f"checkpoint-{s}") for s in (1700, 1800))
    result = CliRunner().invoke(app, ["diff", older, newer])
    assert result.exit_code == 1, result.output
    assert f"using the run's probe: {SAMPLES / 'router_fault' / 'probe.safetensors'}" in result.stderr
    assert f"using the run's loss log: {SAMPLES / 'router_fault' / 'train_log.jsonl'}" in result.stderr
    assert "normalised routing entropy 0.097 below the floor 0.1" in result.stdout
    trend_pair = next(p for p in reports["router_fault"].pairs if p.to_step == 1800)
    assert trend_pair.status == "alert"
    off = CliRunner().invoke(app, ["diff", older, newer, "--no-probe", "--no-loss-log"])
    assert off.exit_code == 0 and "using the run's" not in off.stderr
    assert "not judged: routing entropy and expert load: no probe" in off.stderr


def test_the_console_process_gives_what_the_library_gives(reports, tmp_path):
    """`ckptscan trend` in its own process (the console script pauses and
    freezes the garbage collector around importing torch) writes the same
    report; an in-process caller's collector is left as it was."""
    import gc
    import subprocess
    import sys

    from typer.testing import CliRunner

    from ckptscan.cli import app
    from ckptscan.cli.options import DEFAULT_PER_HEAD
    from ckptscan.document.plain import report_dict

    path = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if k != "GITHUB_STEP_SUMMARY"}
    proc = subprocess.run([sys.executable, "-m", "ckptscan", "trend", str(SAMPLES / "router_fault"), "--json",
                           str(path), "--no-cache", "--quiet"], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 1, proc.stderr  # the router fault alerts
    assert json.loads(path.read_text()) == json.loads(json.dumps(report_dict(reports["router_fault"], DEFAULT_PER_HEAD)))
    frozen = gc.get_freeze_count()
    CliRunner().invoke(app, ["diff", str(SAMPLES / "router_fault" / "checkpoint-100"),
                             str(SAMPLES / "router_fault" / "checkpoint-200"), "--quiet"])
    assert gc.get_freeze_count() == frozen and gc.isenabled()
