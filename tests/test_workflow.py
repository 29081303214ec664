"""docs/github-nightly.yml: the ready-made nightly workflow does what its
comments say. Its structure is checked (cache restored before and saved
after the gate even when it failed, reports uploaded and published even
then), and each `run:` step that calls ckptscan is run as GitHub runs it
(bash -eo pipefail, the workflow's env, GITHUB_ACTIONS=true, a step summary
file) against the shipped sample runs: exit 0 on the healthy run, 1 on the
attention fault, the reports where the upload steps look for them, the pair
cache where the cache steps save it."""

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / "docs" / "github-nightly.yml"
SAMPLES = ROOT / "sample_checkpoints"


@pytest.fixture(scope="module")
def workflow():
    return yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))


def steps(workflow):
    return workflow["jobs"]["ckptscan"]["steps"]


def step(workflow, uses):
    (found,) = [s for s in steps(workflow) if s.get("uses", "").startswith(uses)]
    return found


def ckptscan_steps(workflow):
    return [s for s in steps(workflow) if re.search(r"^\s*ckptscan ", s.get("run", ""), re.M)]


def test_nightly_gate_with_cache_reports_and_summary(workflow):
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as true
    assert triggers["schedule"][0]["cron"]
    names = [s.get("uses", s.get("name")) for s in steps(workflow)]
    restore, save = step(workflow, "actions/cache/restore"), step(workflow, "actions/cache/save")
    (gate,) = ckptscan_steps(workflow)
    upload, junit = step(workflow, "actions/upload-artifact"), step(workflow, "mikepenz/action-junit-report")
    order = [steps(workflow).index(s) for s in (restore, gate, upload, junit, save)]
    assert order == sorted(order), names
    # After a failed gate the reports and the cache still matter: those steps run always.
    assert all(s.get("if") == "always()" for s in (upload, junit, save))
    assert save["with"]["path"] == restore["with"]["path"] == "~/.cache/ckptscan"  # ckptscan's default cache
    assert save["with"]["key"] == restore["with"]["key"]
    out = workflow["env"]["OUT"]
    assert upload["with"]["path"].rstrip("/") == out and junit["with"]["report_paths"] == f"{out}/junit.xml"
    # No ${{ }} expressions inside the commands: values come in through env (no script injection).
    assert "${{" not in gate["run"]


def run_step(script, env):
    """A `run:` step as GitHub's runner runs it on Linux."""
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def runner_env(workflow, tmp_path):
    """The workflow's env on a fresh runner: `ckptscan` on PATH (this tree), an empty home."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "ckptscan"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -c "from ckptscan.cli.console import main; main()" "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "XDG_"))}
    env.update({k: str(v) for k, v in workflow["env"].items()})
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", PYTHONPATH=str(ROOT), HOME=str(tmp_path / "home"),
               GITHUB_ACTIONS="true", GITHUB_STEP_SUMMARY=str(tmp_path / "step_summary.md"))
    return env


@pytest.mark.parametrize("sample, expected", [("healthy", 0), ("attention_fault", 1)])
def test_the_workflow_commands_on_a_sample_run(workflow, runner_env, tmp_path, sample, expected):
    env = {**runner_env, "RUN": str(SAMPLES / sample), "OUT": str(tmp_path / "work" / runner_env["OUT"])}
    (gate,) = ckptscan_steps(workflow)
    result = run_step(gate["run"], env)
    assert result.returncode == expected, result.stderr

    out = Path(env["OUT"])
    report = json.loads((out / "report.json").read_text())
    assert report["summary"]["status"] == ("alert" if expected else "ok")
    assert (out / "report.html").read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert "<testsuites" in (out / "junit.xml").read_text(encoding="utf-8")
    assert f"ckptscan trend: `{SAMPLES / sample}`" in Path(env["GITHUB_STEP_SUMMARY"]).read_text(encoding="utf-8")
    assert ("::error " in result.stderr) == bool(expected)
    cache = Path(env["HOME"]) / ".cache" / "ckptscan"
    assert any(cache.iterdir())  # where the cache steps restore and save it

    if expected:  # the next night: the restored cache serves every pair, the verdict is the same
        again = run_step(gate["run"], env)
        assert again.returncode == expected
        assert f"cache: {len(report['pairs'])} pair(s) reused, 0 computed" in again.stderr
