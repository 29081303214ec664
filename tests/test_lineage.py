"""What the folders say about a pair (`ckptscan.inputs.lineage`): two run
folders whose newer run holds its own, different checkpoint at the older
step (or whose loss logs part before it) are two runs, whatever the weights
of the pair say; one folder, a fork or copy of the older run, and a run
resumed into a new folder are not called two runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from run_factory import write_run
from typer.testing import CliRunner

from ckptscan.cli import app
from ckptscan.inputs.lineage import other_run_evidence

SAMPLES = Path(__file__).resolve().parent.parent / "sample_checkpoints"
runner = CliRunner()


@pytest.fixture(scope="module")
def shared_start(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two runs of one seed (one initialisation, the same updates) that part at step 300, where the second
    one's layer-0 q_proj update collapses: before it they are one history."""
    root = tmp_path_factory.mktemp("lineage")
    return write_run(root / "a", count=12), write_run(root / "b", count=12, collapse_layer=0, collapse_from=300)


def test_a_pair_across_two_run_folders_that_parted_before_the_older_step_is_two_runs(shared_start):
    a, b = shared_start
    evidence = other_run_evidence(str(a / "checkpoint-700"), 700, str(b / "checkpoint-800"))
    assert evidence is not None
    assert evidence.startswith("b/ and a/ are two run folders: b/ holds its own step 700 (checkpoint-700), whose "
                               f"weights differ from {a / 'checkpoint-700'}'s")


def test_runs_that_are_one_history_up_to_the_older_step_are_not_two_runs(shared_start):
    """b's checkpoint-200 is a's checkpoint-200 (the same seed and updates): a/200 → b/300 is one history."""
    a, b = shared_start
    assert other_run_evidence(str(a / "checkpoint-200"), 200, str(b / "checkpoint-300")) is None


def test_one_folder_is_never_two_runs_by_its_folders(shared_start):
    a, _ = shared_start
    assert other_run_evidence(str(a / "checkpoint-700"), 700, str(a / "checkpoint-800")) is None


def test_a_fork_that_copied_the_older_checkpoint_is_one_run(shared_start, tmp_path):
    a, _ = shared_start
    fork = tmp_path / "fork"
    for step in (600, 700):
        shutil.copytree(a / f"checkpoint-{step}", fork / f"checkpoint-{step}")
    shutil.copytree(a / "checkpoint-800", fork / "checkpoint-800")
    assert other_run_evidence(str(a / "checkpoint-700"), 700, str(fork / "checkpoint-800")) is None


def test_a_run_resumed_into_a_new_folder_gives_no_evidence(shared_start, tmp_path):
    """The new folder holds no checkpoint of its own at the resumed step, and its log starts after it."""
    a, b = shared_start
    resumed = tmp_path / "resumed"
    for step in (800, 900):
        shutil.copytree(b / f"checkpoint-{step}", resumed / f"checkpoint-{step}")
    (resumed / "train_log.jsonl").write_text("".join(json.dumps({"step": s, "loss": 2.0}) + "\n"
                                                     for s in range(700, 900)))
    (a / "train_log.jsonl").write_text("".join(json.dumps({"step": s, "loss": 3.0}) + "\n" for s in range(700)))
    try:
        assert other_run_evidence(str(a / "checkpoint-700"), 700, str(resumed / "checkpoint-800")) is None
    finally:
        (a / "train_log.jsonl").unlink()


def test_loss_logs_that_part_before_the_older_step_are_two_runs(shared_start, tmp_path):
    """No checkpoint of its own at the older step, but the newer run's log records other losses before it."""
    a, b = shared_start
    other = tmp_path / "other"
    for step in (800, 900):
        shutil.copytree(b / f"checkpoint-{step}", other / f"checkpoint-{step}")
    (other / "train_log.jsonl").write_text("".join(json.dumps({"step": s, "loss": 3.0 - (s >= 250)}) + "\n"
                                                   for s in range(900)))
    (a / "train_log.jsonl").write_text("".join(json.dumps({"step": s, "loss": 3.0}) + "\n" for s in range(900)))
    try:
        evidence = other_run_evidence(str(a / "checkpoint-700"), 700, str(other / "checkpoint-800"))
    finally:
        (a / "train_log.jsonl").unlink()
    assert evidence == "other/ and a/ are two run folders, and their loss logs part at step 250, at or before step 700"


def test_trainer_states_that_part_before_the_older_step_are_two_runs(shared_start, tmp_path):
    a, b = shared_start
    older, newer = tmp_path / "x" / "checkpoint-700", tmp_path / "y" / "checkpoint-800"
    shutil.copytree(a / "checkpoint-700", older)
    shutil.copytree(b / "checkpoint-800", newer)
    (older / "trainer_state.json").write_text(json.dumps({"log_history": [
        {"step": 100, "loss": 4.0}, {"step": 200, "loss": 3.5}, {"step": 200, "eval_loss": 3.9}]}))
    (newer / "trainer_state.json").write_text(json.dumps({"log_history": [
        {"step": 100, "loss": 4.0}, {"step": 200, "loss": 3.25}, {"step": 800, "loss": 3.0}]}))
    assert other_run_evidence(str(older), 700, str(newer)) == (
        "y/ and x/ are two run folders, and their trainer states part at step 200, at or before step 700")


def test_urls_and_missing_paths_give_no_evidence(shared_start):
    a, b = shared_start
    assert other_run_evidence("s3://bucket/a/checkpoint-700", 700, "s3://bucket/b/checkpoint-800") is None
    assert other_run_evidence(str(a / "checkpoint-7000"), 7000, str(b / "checkpoint-800")) is None
    assert other_run_evidence(str(a / "checkpoint-700"), None, str(b / "checkpoint-800")) is None


needs_samples = pytest.mark.skipif(not (SAMPLES / "healthy").is_dir() or not (SAMPLES / "attention_fault").is_dir(),
                                   reason="sample_checkpoints/ not present")


@needs_samples
def test_diff_across_the_sample_runs_is_not_one_run_and_proposes_no_rollback(tmp_path):
    """healthy and attention_fault share their initialisation: the weights alone read the pair as one run's
    update (cos 0.31), too large; the folders say two runs (docs/guides/misuse.md)."""
    report_path = tmp_path / "report.json"
    result = runner.invoke(app, ["diff", str(SAMPLES / "healthy" / "checkpoint-1700"),
                                 str(SAMPLES / "attention_fault" / "checkpoint-1800"), "--json", str(report_path)])
    assert result.exit_code == 1, result.output
    report = json.loads(report_path.read_text())
    rules = {f["rule"] for layer in report["pairs"][0]["layers"] for f in layer["findings"]}
    assert "not_one_run" in rules and "update_size" not in rules
    assert report["summary"]["rollback_candidate"] is None
    assert report["summary"]["message"].startswith(
        "ALERT: step 1700 → step 1800 is not an update of one run: attention_fault/ and healthy/ are two run folders")
    assert "rollback candidate" not in result.output


@needs_samples
def test_diff_within_one_sample_run_is_judged_as_an_update(tmp_path):
    """The same-folder control: healthy/1700 → healthy/1800 is one run's update, and healthy."""
    result = runner.invoke(app, ["diff", str(SAMPLES / "healthy" / "checkpoint-1700"),
                                 str(SAMPLES / "healthy" / "checkpoint-1800"), "--json", str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert not any(f["rule"] == "not_one_run" for layer in report["pairs"][0]["layers"] for f in layer["findings"])
