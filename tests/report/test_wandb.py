"""--wandb with the real wandb package in offline mode (no network), the
written run read back from its transaction log with wandb's own protobuf
records: the TensorBoard scalars per step, the verdict and findings tables,
the first alert in the run summary; a re-run over the grown run appends only
the new steps to the same run id."""

import copy
import json

import numpy as np
import pytest
import wandb

from ckptscan.errors import CkptScanError
from ckptscan.report.destinations import deliver, run_key
from ckptscan.document.plain import report_dict
from ckptscan.document.writing import report_json
from ckptscan.report.wandb import FINDINGS_COLUMNS, parse_target, write_wandb

from report.test_tensorboard import expected_scalars
from report.wandb_records import read_run

TABLES = ("ckptscan/verdict", "ckptscan/findings")


@pytest.fixture
def offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    wandb.teardown()  # wandb keeps the settings of its first run in the process; start from this environment
    yield tmp_path / "wandb"
    wandb.teardown()


def earlier(report, pairs):
    """The run as a scan saw it `pairs` pairs ago (the rules look only backward)."""
    shorter = copy.deepcopy(report)
    shorter.pairs = shorter.pairs[:pairs]
    return shorter


def offline_runs(directory):
    """Each offline run's (run id, history, summary, files dir), oldest first."""
    wandb.teardown()  # wandb's service writes the log behind the run's finish(); this waits for it, as exit does
    found = []
    for log in sorted(directory.glob("offline-run-*/run-*.wandb")):
        found.append((*read_run(log), log.parent / "files"))
    return found


def table(files, row, name):
    content = json.loads((files / row[f"{name}/path"]).read_text())
    return content["columns"], content["data"]


def test_scalars_tables_and_summary_read_back(offline, reports):
    report = reports["loss"]
    assert write_wandb(report, "ckptscan-tests/collapse") == (len(report.pairs), 0)
    ((run_id, history, summary, files),) = offline_runs(offline)
    assert run_id == run_key(report)
    expected = expected_scalars(report_dict(report))
    assert sorted(history) == [p.to_step for p in report.pairs]
    for tag, by_step in expected.items():
        got = {step: np.float32(row[tag]) for step, row in history.items() if tag in row}
        assert got == by_step, tag
    newest = history[report.pairs[-1].to_step]
    columns, rows = table(files, newest, "ckptscan/verdict")
    s = report.summary
    assert rows == [["alert", s.message, "attention", 1000, s.rollback_candidate.path, s.rollback_candidate.step]]
    columns, rows = table(files, newest, "ckptscan/findings")
    assert columns == FINDINGS_COLUMNS
    findings = [(p.to_step, layer.layer, f.monitor, f.severity) for p in report.pairs for layer in p.layers
                for f in layer.findings]
    assert [(r[0], r[1], r[4], r[3]) for r in rows] == findings and findings
    assert not any(name in row for name in TABLES for step, row in history.items() if row is not newest)
    assert summary["ckptscan/verdict"] == "alert"
    assert summary["ckptscan/first_alert_step"] == 1000 and summary["ckptscan/first_alert_family"] == "attention"
    assert summary["ckptscan/rollback_candidate"] == s.rollback_candidate.path
    assert summary["ckptscan/newest_step"] == report.pairs[-1].to_step


def test_a_rerun_over_the_grown_run_appends_only_new_steps(offline, reports):
    report = reports["loss"]
    assert write_wandb(earlier(report, 6), "ckptscan-tests") == (6, 0)
    assert write_wandb(report, "ckptscan-tests") == (len(report.pairs) - 6, 6)
    assert write_wandb(report, "ckptscan-tests") == (0, len(report.pairs))
    runs = offline_runs(offline)
    assert {run_id for run_id, *_ in runs} == {run_key(report)}  # one W&B run, resumed
    logged = [step for _, history, _, _ in runs for step in history]
    assert logged == [p.to_step for p in report.pairs]  # each step once, in order
    assert runs[-1][1] == {}  # the third scan had nothing new


def test_targets():
    assert parse_target("proj") == ("proj", None)
    assert parse_target("proj/nightly") == ("proj", "nightly")
    for bad in ("", "/run", "a/b/c"):
        with pytest.raises(CkptScanError, match="--wandb takes PROJECT or PROJECT/RUN"):
            parse_target(bad)


def test_a_failing_wandb_is_one_line_and_changes_nothing(offline, reports, capsys):
    report = reports["loss"]
    before = report_json(report)
    offline.write_text("")  # a file where wandb wants its directory
    assert deliver("--wandb", write_wandb, report, "ckptscan-tests") is None
    err = capsys.readouterr().err
    assert err.startswith("ckptscan: --wandb not updated: ") and err.count("\n") == 1
    assert report_json(report) == before
