"""A whole run read remotely: `trend s3://bucket/run/` finds the run's own
probe.safetensors and train_log.jsonl under the prefix, as it does locally,
and gives the same report (routing entropy and the loss column included) as
`trend` of the local copy; `--probe` and `--loss-log` take URLs, CSV logs
included; a side file found by default that cannot be used is skipped with
a note, one named explicitly is one line and exit 2."""

from __future__ import annotations

import json
import math

import torch
from remote_helpers import same_numbers
from run_factory import write_run
from safetensors.torch import save_file
from typer.testing import CliRunner

from ckptscan.cli import app

runner = CliRunner()


def trend(*args: str):
    return runner.invoke(app, ["trend", *args, "--format", "json", "--no-cache"])


def moe_run(directory):
    """Six MoE checkpoints, a loss log with an lr column, and a probe."""
    write_run(directory, count=6, layers=2, loss=lambda step: 3.0 - 1e-3 * step)
    inputs = {f"layers.{i}.router_input": torch.randn(32, 64, generator=torch.Generator().manual_seed(i))
              for i in range(2)}
    save_file(inputs, directory / "probe.safetensors")
    return directory


def test_a_remote_run_gives_the_local_report_with_its_probe_and_loss_log(s3, tmp_path):
    run = moe_run(tmp_path / "run")
    url = s3.upload(run, "run")
    local, remote = trend(str(run)), trend(url + "/")
    assert local.exit_code == remote.exit_code == 0, remote.output
    assert "using the run's probe" in remote.stderr and "using the run's loss log" in remote.stderr
    local_report, remote_report = json.loads(local.stdout), json.loads(remote.stdout)
    same_numbers(local_report, remote_report)
    assert remote_report["probe"] == f"{url}/probe.safetensors"
    entropies = [layer["router"]["routing_entropy_norm"] for pair in remote_report["pairs"] for layer in pair["layers"]]
    assert all(isinstance(e, float) and math.isfinite(e) for e in entropies), entropies
    losses = [pair["loss"] for pair in remote_report["pairs"]]  # the loss column
    assert all(isinstance(v, float) for v in losses), losses
    # The cache knows the remote probe by URL, size and ETag: a second run reuses every pair.
    cache = str(tmp_path / "cache")
    runner.invoke(app, ["trend", url, "--format", "json", "--cache-dir", cache])
    cached = runner.invoke(app, ["trend", url, "--format", "json", "--cache-dir", cache])
    assert "5 pair(s) reused, 0 computed" in cached.stderr, cached.stderr
    same_numbers(local_report, json.loads(cached.stdout))


def test_probe_and_loss_log_given_as_urls_and_a_csv_log(s3, tmp_path):
    run = moe_run(tmp_path / "run")
    side = tmp_path / "side"
    side.mkdir()
    (run / "probe.safetensors").rename(side / "probe.safetensors")
    records = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
    (run / "train_log.jsonl").unlink()
    (side / "loss.csv").write_text("step,loss,lr\n" + "".join(f"{r['step']},{r['loss']},{r['lr']}\n" for r in records))
    url = s3.upload(run, "run")
    side_url = s3.upload(side, "side")
    local = trend(str(run), "--probe", str(side / "probe.safetensors"), "--loss-log", str(side / "loss.csv"))
    remote = trend(url, "--probe", f"{side_url}/probe.safetensors", "--loss-log", f"{side_url}/loss.csv")
    assert local.exit_code == remote.exit_code == 0, remote.output
    same_numbers(json.loads(local.stdout), json.loads(remote.stdout))
    assert json.loads(remote.stdout)["probe"] == f"{side_url}/probe.safetensors"


def test_unusable_side_files_are_skipped_when_found_and_an_error_when_named(s3, tmp_path):
    run = moe_run(tmp_path / "run")
    (run / "probe.safetensors").write_bytes(b"garbage")
    (run / "train_log.jsonl").write_text("not json\n")
    url = s3.upload(run, "run")
    result = trend(url)
    assert result.exit_code == 0, result.output
    assert "ignoring the run's probe" in result.stderr and "ignoring the run's loss log" in result.stderr
    for flag, name in (("--probe", "probe.safetensors"), ("--loss-log", "train_log.jsonl"),
                       ("--loss-log", "no-such-log.jsonl")):
        result = trend(url, flag, f"{url}/{name}")
        assert result.exit_code == 2, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {url}/{name}"), result.stderr


def test_a_reference_may_be_a_run_or_a_report_at_a_url(s3, tmp_path):
    """`--reference s3://bucket/run/` is scanned like a local run and
    `--reference s3://bucket/report.json` read like a local report: both
    judge as the local run directory does."""
    run = moe_run(tmp_path / "run")
    reference = write_run(tmp_path / "reference", count=6, layers=2, seed=3)
    saved = tmp_path / "saved"
    saved.mkdir()
    runner.invoke(app, ["trend", str(reference), "--json", str(saved / "reference.json"), "--no-cache", "-q"])
    run_url, saved_url = s3.upload(reference, "reference"), s3.upload(saved, "saved")
    local = trend(str(run), "--reference", str(reference))
    assert local.exit_code in (0, 1), local.output
    local_report = json.loads(local.stdout)
    del local_report["settings"]["reference"]
    for url in (run_url + "/", f"{saved_url}/reference.json"):
        remote = trend(str(run), "--reference", url)
        assert remote.exit_code == local.exit_code, remote.output
        remote_report = json.loads(remote.stdout)
        assert remote_report["settings"].pop("reference") == url.rstrip("/")
        same_numbers(local_report, remote_report)
