"""What the destinations share (report/destinations.py): a stable id per run
location, one stderr line for a failure (never an exception out of the scan,
Ctrl-C excepted), and no heavy package imported until a destination is used."""

import copy
import io
import os
import subprocess
import sys

import pytest

from ckptscan.report.destinations import MAX_REASON_CHARS, deliver, run_key, run_location


def test_the_run_key_is_stable_and_follows_the_location(reports, tmp_path, monkeypatch):
    report = reports["loss"]
    again = copy.deepcopy(report)
    assert run_key(again) == run_key(report) and len(run_key(report)) == 16
    # The same directory named relatively is the same run.
    monkeypatch.chdir(os.path.dirname(report.settings["run"]))
    again.settings["run"] = os.path.basename(report.settings["run"])
    assert run_location(again) == run_location(report) and run_key(again) == run_key(report)
    other = copy.deepcopy(report)
    other.settings["run"] = "s3://bucket/runs/main"
    assert run_location(other) == "s3://bucket/runs/main" and run_key(other) != run_key(report)


def test_a_failure_is_one_line_naming_the_destination():
    def fail():
        raise RuntimeError("server said:\n<html>\n" + "x" * 1000)

    err = io.StringIO()
    assert deliver("--mlflow", fail, stderr=err) is None
    line = err.getvalue()
    assert line.count("\n") == 1 and line.startswith("ckptscan: --mlflow not updated: server said: <html> xxx")
    assert len(line) < MAX_REASON_CHARS + 50


def test_success_returns_what_the_writer_returns():
    assert deliver("--wandb", lambda a, b=0: (a, b), 1, b=2) == (1, 2)


def test_ctrl_c_still_interrupts():
    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        deliver("--notify", interrupted)


def test_the_destination_modules_import_their_packages_only_when_used():
    modules = ["ckptscan.report.wandb", "ckptscan.report.mlflow", "ckptscan.report.prometheus",
               "ckptscan.report.notify"]
    probe = (f"import sys, {', '.join(modules)}; "
             "print(sorted(m for m in ('wandb', 'mlflow', 'prometheus_client') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr
