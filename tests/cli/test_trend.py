"""`ckptscan trend`: table, JSON and Markdown outputs, config, cache, loss log."""

import json
import math

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from ckptscan.cli import app

from run_factory import write_run

runner = CliRunner()
FINDING_KEYS = {"monitor", "family", "severity", "value", "baseline", "threshold", "message", "rule"}


def loss(step):
    return 3.0 * math.exp(-step / 500) + 1.0 + (0.002 * (step - 1500) if step > 1500 else 0.0)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli-runs")
    return {
        "healthy": write_run(root / "healthy", count=14),
        "collapse": write_run(root / "collapse", count=20, collapse_layer=1, collapse_from=1200, loss=loss),
    }


def invoke(*args):
    return runner.invoke(app, ["trend", *map(str, args)])


def test_table_shows_layers_verdict_loss_and_rollback(runs):
    result = invoke(runs["collapse"])
    assert result.exit_code == 1, result.output
    out = result.stdout
    assert "Δ2 H/ln n" in out and "router ε" in out and "1200 attention" in out
    assert "ALERT: attention monitors fired first, at step 1200" in out
    assert "rollback candidate:" in out and "checkpoint-1100" in out
    assert "loss" in out and "diverged at step" in out and "lead: the first alert came" in out
    assert "using the run's loss log" in result.stderr
    assert "scanning layers" not in result.output  # no progress bar off a terminal


def test_json_output_every_pair_and_effective_thresholds(runs, tmp_path):
    path = tmp_path / "report.json"
    result = invoke(runs["collapse"], "--format", "json", "--json", path, "--set", "alert_sigma=5.5")
    assert result.exit_code == 1
    printed = json.loads(result.stdout)
    written = json.loads(path.read_text())
    assert printed == written
    assert written["command"] == "trend"
    assert len(written["pairs"]) == 19
    assert written["thresholds"]["alert_sigma"] == 5.5
    assert written["thresholds"]["warmup_steps"] == 300  # raised to the LR warm-up of the run's loss log
    summary = written["summary"]
    assert summary["rollback_candidate"]["step"] == 1100
    assert summary["first_alert_step"]["attention"] == 1200
    assert summary["loss_divergence_step"] > 1500 and summary["lead_steps"] > 0
    findings = [f for p in written["pairs"] for layer in p["layers"] for f in layer["findings"]]
    series = [f for f in findings if f["rule"] in ("trend", "level")]
    assert series and all(FINDING_KEYS <= set(f) for f in findings)
    assert all(f["baseline"] is not None and f["threshold"] is not None and f["family"] == "attention"
               for f in series)


def test_markdown_output_and_appended_step_summary(runs, tmp_path, monkeypatch):
    summary = tmp_path / "step_summary.md"
    summary.write_text("# earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = invoke(runs["collapse"], "--format", "markdown")
    assert result.exit_code == 1
    assert result.stdout.startswith("### 🔴 ckptscan trend")
    assert "| layer |" in result.stdout and "| 1 |" in result.stdout
    invoke(runs["healthy"])
    text = summary.read_text()
    assert text.startswith("# earlier step\n")
    assert text.count("ckptscan trend") == 2 and "ALERT" in text and "HEALTHY" in text


def test_markdown_escapes_pipes(runs, tmp_path):
    # Nine checkpoints: the newest pair is the first judged (after 2 warm-up and 5 baseline pairs).
    run = tmp_path / "a|b"
    run.mkdir()
    for ckpt in sorted(runs["healthy"].iterdir())[:9]:
        (run / ckpt.name).symlink_to(ckpt)
    path = tmp_path / "summary.md"
    result = invoke(run, "--markdown-summary", path, "--no-cache")
    assert result.exit_code == 0, result.output
    text = path.read_text()
    assert "a\\|b" in text and "a|b" not in text.replace("a\\|b", "")


def test_config_file_is_read_and_flags_override_it(runs, tmp_path, monkeypatch):
    (tmp_path / ".git").mkdir()
    (tmp_path / "pyproject.toml").write_text('[tool.ckptscan]\nalert_sigma = 1000.0\ndelta2_entropy_norm_floor = 0.0\n'
                                             'cusum_alert = 1000.0\npooled_cusum_alert = 1000.0\n'
                                             'fail_on = "warn"\n')
    monkeypatch.chdir(tmp_path)
    result = invoke(runs["collapse"], "--format", "json")
    report = json.loads(result.stdout)
    assert report["thresholds"]["alert_sigma"] == 1000.0
    assert report["summary"]["status"] == "warn"
    assert result.exit_code == 1  # fail_on = "warn" from the file
    assert invoke(runs["collapse"], "--fail-on", "alert").exit_code == 0
    overridden = invoke(runs["collapse"], "--format", "json", "--set", "alert_sigma=6")
    assert json.loads(overridden.stdout)["summary"]["status"] == "alert"


def test_cache_reuse_location_and_no_cache(runs, tmp_path):
    cache = tmp_path / "cache"
    first = invoke(runs["healthy"], "--cache-dir", cache)
    second = invoke(runs["healthy"], "--cache-dir", cache)
    assert "0 pair(s) reused, 13 computed" in first.stderr
    assert "13 pair(s) reused, 0 computed" in second.stderr
    assert first.stdout == second.stdout
    assert len(list((cache / "pairs").iterdir())) == 13
    assert not list(runs["healthy"].rglob("*.json.tmp")) and not (runs["healthy"] / "pairs").exists()
    uncached = invoke(runs["healthy"], "--no-cache", "--cache-dir", tmp_path / "unused")
    assert uncached.stdout == first.stdout and not (tmp_path / "unused").exists()


def test_default_cache_goes_to_the_user_cache_dir(runs, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert invoke(runs["healthy"]).exit_code == 0
    assert len(list((tmp_path / "xdg" / "ckptscan" / "pairs").iterdir())) == 13


def test_quiet_prints_no_notes(runs):
    result = invoke(runs["collapse"], "--quiet")
    assert "using the run's" not in result.stderr and "cache:" not in result.stderr
    assert "gate failed" in result.stderr


def test_explicit_loss_log_errors_but_a_broken_run_log_is_skipped(runs, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    result = invoke(runs["healthy"], "--loss-log", bad)
    assert result.exit_code == 2 and "bad.jsonl" in result.stderr and "Traceback" not in result.output
    run = tmp_path / "run"
    run.mkdir()
    for ckpt in sorted(runs["healthy"].iterdir())[:9]:
        (run / ckpt.name).symlink_to(ckpt)
    (run / "train_log.jsonl").write_text("not json\n")
    result = invoke(run)
    assert result.exit_code == 0 and "ignoring the run's loss log" in result.stderr


def test_the_runs_probe_is_used_and_an_unusable_one_skipped(runs, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    for ckpt in sorted(runs["healthy"].iterdir())[:9]:
        (run / ckpt.name).symlink_to(ckpt)
    inputs = {f"layers.{i}.router_input": torch.randn(32, 64, generator=torch.Generator().manual_seed(i))
              for i in range(2)}
    save_file(inputs, run / "probe.safetensors")
    result = invoke(run, "--format", "json")
    assert "using the run's probe" in result.stderr
    report = json.loads(result.stdout)
    assert report["probe"] == str(run / "probe.safetensors")
    assert report["pairs"][0]["layers"][0]["router"]["routing_entropy_norm"] is not None
    (run / "probe.safetensors").write_bytes(b"garbage")
    result = invoke(run)
    assert result.exit_code == 0 and "ignoring the run's probe" in result.stderr
    assert invoke(run, "--probe", run / "probe.safetensors").exit_code == 2
