"""Where reports go: a FIFO keeps being a FIFO and its reader gets the report,
a device stays a device, `--json -` is stdout, and a destination that cannot
take the report (full, read-only) is one line and exit 2 with the previous
file intact."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hostile.helpers import assert_one_line_error, deadline, run_cli, write_pair
from test_output import FifoReader, make_char_device

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def no_step_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)


@pytest.mark.parametrize("via_symlink", [False, True])
def test_json_to_a_fifo_with_a_reader(tmp_path: Path, capsys: pytest.CaptureFixture, via_symlink: bool) -> None:
    a, b = write_pair(tmp_path / "ckpts")
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    target = fifo
    if via_symlink:
        target = tmp_path / "report.json"
        target.symlink_to(fifo)
    reader = FifoReader(fifo)
    reader.start()
    with deadline(120):
        result = run_cli(capsys, "diff", a, b, "--json", target)
    reader.join(timeout=30)
    assert result.code == 0, result.stderr
    assert json.loads(reader.data)["command"] == "diff"
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert not via_symlink or target.is_symlink()


def test_json_to_a_full_device_is_exit_2_and_the_device_stays(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The issue's `--json /dev/full`, on a private node of the same device."""
    a, b = write_pair(tmp_path / "ckpts")
    full = make_char_device(tmp_path / "full", 7)
    result = run_cli(capsys, "diff", a, b, "--json", full)
    assert_one_line_error(result, str(full), "No space left on device")
    assert "gate" not in result.stderr
    assert stat.S_ISCHR(full.lstat().st_mode)


def test_markdown_summary_to_a_full_device(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a, b = write_pair(tmp_path / "ckpts")
    full = make_char_device(tmp_path / "full", 7)
    assert_one_line_error(run_cli(capsys, "diff", a, b, "--markdown-summary", full), str(full), "No space left")
    assert stat.S_ISCHR(full.lstat().st_mode)


def test_json_to_a_null_device(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a, b = write_pair(tmp_path / "ckpts")
    null = make_char_device(tmp_path / "null", 3)
    result = run_cli(capsys, "diff", a, b, "--json", null)
    assert result.code == 0, result.stderr
    assert stat.S_ISCHR(null.lstat().st_mode)


def test_json_dash_is_the_report_alone_on_stdout(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a, b = write_pair(tmp_path / "ckpts")
    result = run_cli(capsys, "diff", a, b, "--json", "-")
    assert result.code == 0, result.stderr
    assert json.loads(result.stdout)["command"] == "diff"  # nothing else on stdout
    assert "layer" in result.stderr and "gate passed" in result.stderr  # the table moved to stderr
    result = run_cli(capsys, "diff", a, b, "--json", "-", "--format", "json")
    assert json.loads(result.stdout)["command"] == "diff"  # once, not twice


def test_json_dash_with_markdown_format(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a, b = write_pair(tmp_path / "ckpts")
    result = run_cli(capsys, "diff", a, b, "--json", "-", "--format", "markdown")
    assert json.loads(result.stdout)["command"] == "diff"
    assert "### " in result.stderr


def test_inspect_json_dash(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a, _ = write_pair(tmp_path / "ckpts")
    result = run_cli(capsys, "inspect", a, "--json", "-")
    assert result.code == 0, result.stderr
    assert "checkpoint" in json.loads(result.stdout)


# Runs inside a private mount namespace (`unshare -m`): mounts a small tmpfs
# at argv[1] holding the previous report, makes it full or read-only, runs
# `ckptscan diff` with --json into it, and prints what happened as JSON.
IN_A_NAMESPACE = r"""
import json, os, subprocess, sys
mnt, how, *cli = sys.argv[1:]
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", mnt], check=True)
report = os.path.join(mnt, "report.json")
with open(report, "w") as f:
    f.write('{"previous": 1}')
if how == "full":
    with open(os.path.join(mnt, "filler"), "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass
else:
    subprocess.run(["mount", "-o", "remount,ro", mnt], check=True)
proc = subprocess.run([sys.executable, "-m", "ckptscan", *cli, "--json", report], capture_output=True, text=True)
print(json.dumps({"code": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr,
                  "report": open(report).read(), "listing": sorted(os.listdir(mnt))}))
"""


def _unshare_works() -> bool:
    unshare = shutil.which("unshare")
    return unshare is not None and subprocess.run([unshare, "-m", "mount", "-t", "tmpfs", "tmpfs", "/mnt"],
                                                  capture_output=True).returncode == 0


@pytest.mark.parametrize("how, reason", [("full", "No space left on device"), ("read-only", "Read-only file system")])
def test_full_or_read_only_filesystem_keeps_the_previous_report(tmp_path: Path, how: str, reason: str) -> None:
    """ENOSPC and EROFS for real, on a tmpfs mounted in a private namespace."""
    if not _unshare_works():
        pytest.skip("cannot mount a tmpfs in a private mount namespace here (needs root or user namespaces)")
    a, b = write_pair(tmp_path / "ckpts")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.run(["unshare", "-m", sys.executable, "-c", IN_A_NAMESPACE, str(mnt), how, "diff", str(a),
                           str(b)], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["code"] == 2, seen
    lines = [line for line in seen["stderr"].splitlines() if line.strip()]
    assert len(lines) == 1 and str(mnt / "report.json") in lines[0] and reason in lines[0], seen["stderr"]
    assert seen["report"] == '{"previous": 1}'
    assert seen["listing"] == (["filler", "report.json"] if how == "full" else ["report.json"])  # no temp file


@pytest.mark.parametrize("output", ["table", "json", "markdown"])
def test_stdout_on_a_full_device_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture,
                                           monkeypatch: pytest.MonkeyPatch, output: str) -> None:
    """`ckptscan diff A B > /dev/full`: the report could not be printed, so
    the command fails, instead of Python's lost-flush warning at exit."""
    a, b = write_pair(tmp_path / "ckpts")
    full = make_char_device(tmp_path / "full", 7)
    stdout = open(full, "w")
    monkeypatch.setattr(sys, "stdout", stdout)
    result = run_cli(capsys, "diff", a, b, "--format", output)
    monkeypatch.undo()
    with contextlib.suppress(OSError):  # what the failed write may have left in the buffer
        stdout.close()
    assert_one_line_error(result, "stdout", "No space left on device")


def test_html_page_and_figures_to_special_destinations(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """`ckptscan report`'s outputs go through the same writer: the page to a
    FIFO's reader, a full device refused with exit 2, figures atomically."""
    pytest.importorskip("matplotlib")
    a, b = write_pair(tmp_path / "ckpts")
    assert run_cli(capsys, "diff", a, b, "--json", tmp_path / "r.json").code == 0
    fifo = tmp_path / "page.fifo"
    os.mkfifo(fifo)
    reader = FifoReader(fifo)
    reader.start()
    with deadline(120):
        result = run_cli(capsys, "report", tmp_path / "r.json", "--html", fifo, "--png", tmp_path / "png")
    reader.join(timeout=30)
    assert result.code == 0, result.stderr
    assert reader.data.startswith(b"<!DOCTYPE html>") and stat.S_ISFIFO(fifo.lstat().st_mode)
    assert sorted(p.suffix for p in (tmp_path / "png").iterdir()) == [".png"]
    full = make_char_device(tmp_path / "full", 7)
    assert_one_line_error(run_cli(capsys, "report", tmp_path / "r.json", "--html", full), str(full), "No space left")
    assert stat.S_ISCHR(full.lstat().st_mode)
