"""Misuse gives a clear answer, never a silent verdict (docs/guides/misuse.md).

What the paths and steps tell is an input error (exit 2, one line): the same
checkpoint twice, the newer one first, two checkpoints of one step, a path
that does not exist. What only the weights tell is a gate finding (exit 1, a
finding in the report and the JSON): two checkpoints of different runs, a
checkpoint and its copy, a run with another run's checkpoint mixed in. A
corrupt checkpoint in a run fails the gate unless --allow-corrupt; one still
being written (a staging directory) does not.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
from pathlib import Path

import pytest
from hostile.helpers import CliResult, run_cli
from run_factory import write_run

from ckptscan.detection.provenance import UNRELATED_CHANGE


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two runs of one recipe with different seeds (steps 0 … 1500)."""
    root = tmp_path_factory.mktemp("runs")
    return write_run(root / "seed0", count=16), write_run(root / "seed1", count=16, seed=1)


NOT_JUDGED_TAIL = ("; not judged: 2 pairs: warm-up (the first 2 pairs); 5 pairs: no baseline yet (the 5 pairs after the "
                   "warm-up make each series' baseline); routing entropy and expert load: no probe (--probe FILE, or "
                   "RUN/probe.safetensors)")


def _stderr_lines(result: CliResult) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


def test_the_same_checkpoint_twice_is_an_input_error(runs, capsys: pytest.CaptureFixture) -> None:
    ckpt = runs[0] / "checkpoint-1000"
    result = run_cli(capsys, "diff", ckpt, ckpt)
    assert (result.code, result.stderr) == (2, f"error: {ckpt}: the same checkpoint given twice; diff compares an "
                                               "older checkpoint with a newer one\n")


def test_the_same_checkpoint_under_another_name_is_the_same_checkpoint(runs, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture) -> None:
    ckpt = runs[0] / "checkpoint-1000"
    (tmp_path / "checkpoint-1000").symlink_to(ckpt)
    result = run_cli(capsys, "diff", ckpt, tmp_path / "checkpoint-1000")
    assert (result.code, result.stderr) == (2, f"error: {ckpt}: the same checkpoint given twice; diff compares an "
                                               "older checkpoint with a newer one\n")


def test_the_newer_checkpoint_first_is_an_input_error(runs, capsys: pytest.CaptureFixture) -> None:
    newer, older = runs[0] / "checkpoint-1100", runs[0] / "checkpoint-1000"
    result = run_cli(capsys, "diff", newer, older)
    assert (result.code, result.stderr) == (2, f"error: {newer} (step 1100) is newer than {older} (step 1000): give "
                                               "the older checkpoint first\n")


def test_two_checkpoints_of_one_step_are_an_input_error(runs, capsys: pytest.CaptureFixture) -> None:
    a, b = runs[0] / "checkpoint-1000", runs[1] / "checkpoint-1000"
    result = run_cli(capsys, "diff", a, b)
    assert (result.code, result.stderr) == (2, f"error: {a} and {b} are both step 1000: not two steps of one run\n")


def test_checkpoints_of_different_runs_fail_the_gate_with_a_finding(runs, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    report_path = tmp_path / "report.json"
    result = run_cli(capsys, "diff", runs[0] / "checkpoint-1000", runs[1] / "checkpoint-1100", "--json", report_path)
    report = json.loads(report_path.read_text())
    findings = [f for layer in report["pairs"][0]["layers"] for f in layer["findings"] if f["rule"] == "not_one_run"]
    assert len(findings) == 2 and all(f["severity"] == "alert" and f["family"] == "numeric" for f in findings)
    change = findings[0]["value"]
    assert change > 1.3 and findings[0]["threshold"] == UNRELATED_CHANGE  # independent draws: √2
    assert result.code == 1
    # Independent draws share nothing: cos(W_a, W_b) ≈ 0 ± 1/√n in every layer.
    cosines = [min(layer["attention"]["q_weight_cosine"], layer["attention"]["k_weight_cosine"])
               for layer in report["pairs"][0]["layers"]]
    assert all(abs(c) < 0.05 for c in cosines)
    related = statistics.median(cosines)
    assert _stderr_lines(result)[-1] == (
        f"gate failed (--fail-on alert): ALERT: step 1000 → step 1100 is not an update of one run: the update is as "
        f"large as the weights (‖ΔW‖/‖W‖ {change:.2f}, median over layers, ≥ 1) and the weights are unrelated "
        f"(cos(W_a, W_b) {related:.2f}, median over layers, < 0.1): not two steps of one run "
        "(different runs, a restart, or a checkpoint from another folder)")
    assert report["summary"]["rollback_candidate"] is None
    assert report["summary"]["interventions"] == []  # the input is wrong, not the training
    assert (report["summary"]["primary_family"], report["summary"]["secondary_families"]) == (None, [])  # no mechanism


def test_a_checkpoint_and_its_copy_fail_the_gate_with_a_finding(runs, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(runs[0] / "checkpoint-1000", copy)
    report_path = tmp_path / "report.json"
    result = run_cli(capsys, "diff", runs[0] / "checkpoint-1000", copy, "--json", report_path)
    assert result.code == 1
    assert _stderr_lines(result)[-1] == (
        f"gate failed (--fail-on alert): ALERT: step 1000 → {copy} is not an update of one run: every monitored "
        "weight is bit-identical in the two checkpoints (the same checkpoint twice, a copy, or weights that did not "
        "train): no update to judge")
    report = json.loads(report_path.read_text())
    assert {f["rule"] for layer in report["pairs"][0]["layers"] for f in layer["findings"]} >= {"identical"}


def test_consecutive_checkpoints_of_one_run_are_not_flagged(runs, capsys: pytest.CaptureFixture) -> None:
    result = run_cli(capsys, "diff", runs[0] / "checkpoint-1000", runs[0] / "checkpoint-1100")
    assert result.code == 0 and "not an update of one run" not in result.stdout + result.stderr


def test_another_runs_checkpoint_mixed_into_a_run_fails_the_trend_gate(runs, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture) -> None:
    mixed = tmp_path / "mixed"
    shutil.copytree(runs[0], mixed)
    shutil.rmtree(mixed / "checkpoint-1200")
    shutil.copytree(runs[1] / "checkpoint-1200", mixed / "checkpoint-1200")
    report_path = tmp_path / "report.json"
    result = run_cli(capsys, "trend", mixed, "--no-cache", "--json", report_path)
    assert result.code == 1
    assert _stderr_lines(result)[-1].startswith("gate failed (--fail-on alert): ALERT: step 1100 → step 1200 is not "
                                                "an update of one run: the update is as large as the weights")
    report = json.loads(report_path.read_text())
    flagged = [(p["from_step"], p["to_step"]) for p in report["pairs"]
               if any(f["rule"] == "not_one_run" for layer in p["layers"] for f in layer["findings"])]
    assert flagged == [(1100, 1200), (1200, 1300)]
    assert report["summary"]["interventions"] == []


def test_a_truncated_checkpoint_is_listed_before_the_verdict_and_fails_the_gate(
        runs, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    shutil.copytree(runs[0], run)
    broken = run / "checkpoint-1500" / "model.safetensors"
    size = broken.stat().st_size
    os.truncate(broken, size - 100)
    report_path = tmp_path / "report.json"
    result = run_cli(capsys, "trend", run, "--no-cache", "--json", report_path)
    reason = f"{broken}: truncated: the header declares {size} bytes, the file has {size - 100} (100 missing)"
    assert result.code == 1
    lines = _stderr_lines(result)
    assert lines[0] == f"skipped {reason}"  # before the scan, so before the verdict
    assert lines[-1] == (f"gate failed (--fail-on alert): corrupt checkpoint skipped: {reason}; without it: "
                         f"HEALTHY: no monitor fired over 14 pairs (7 judged){NOT_JUDGED_TAIL} (--allow-corrupt passes "
                         "over it)")
    table = result.stdout.splitlines()
    verdict = next(i for i, line in enumerate(table) if line.startswith("HEALTHY: no monitor fired over 14 pairs"))
    assert table.index(f"skipped {reason}") < verdict
    assert json.loads(report_path.read_text())["skipped"] == [
        {"path": str(run / "checkpoint-1500"), "reason": reason, "kind": "corrupt"}]


def test_allow_corrupt_passes_over_a_corrupt_checkpoint_and_says_so(runs, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    shutil.copytree(runs[0], run)
    os.truncate(run / "checkpoint-1500" / "model.safetensors", 1000)
    result = run_cli(capsys, "trend", run, "--no-cache", "--allow-corrupt", "--quiet")
    assert result.code == 0
    assert _stderr_lines(result) == ["gate passed (--fail-on alert, --allow-corrupt: 1 corrupt checkpoint(s) "
                                     f"skipped): HEALTHY: no monitor fired over 14 pairs (7 judged){NOT_JUDGED_TAIL}"]


def test_a_checkpoint_still_being_written_does_not_fail_the_gate(runs, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    shutil.copytree(runs[0], run)
    shutil.copytree(run / "checkpoint-1500", run / "tmp-checkpoint-1600")
    os.truncate(run / "tmp-checkpoint-1600" / "model.safetensors", 1000)
    report_path = tmp_path / "report.json"
    result = run_cli(capsys, "trend", run, "--no-cache", "--json", report_path)
    assert result.code == 0, result.stderr
    assert json.loads(report_path.read_text())["skipped"] == [
        {"path": str(run / "tmp-checkpoint-1600"), "reason": "temporary directory (still being written, or abandoned)",
         "kind": "in_progress"}]


@pytest.mark.parametrize("command, says", [("trend", "does not exist"), ("watch", "does not exist"),
                                           ("inspect", "no such file or directory")])
def test_a_missing_path_says_it_does_not_exist(command: str, says: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture) -> None:
    missing = tmp_path / "no-such-run"
    result = run_cli(capsys, command, missing)
    assert (result.code, result.stderr) == (2, f"error: {missing}: {says}\n")


def test_a_file_given_as_a_run_directory_says_what_it_is(runs, capsys: pytest.CaptureFixture) -> None:
    file = runs[0] / "checkpoint-0" / "config.json"
    result = run_cli(capsys, "trend", file)
    assert (result.code, result.stderr) == (2, f"error: {file}: is a file, not a run directory (of checkpoint-N/ "
                                               "folders or checkpoint files)\n")


def test_a_missing_checkpoint_says_it_does_not_exist(runs, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    missing = tmp_path / "checkpoint-1100"
    result = run_cli(capsys, "diff", runs[0] / "checkpoint-1000", missing)
    assert (result.code, result.stderr) == (2, f"error: {missing}: no such file or directory\n")
