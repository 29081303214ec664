"""The exit-code contract, the same for every command that judges or renders
(`ckptscan --help`, docs/cli.md):

- 0 healthy;
- 1 the gate failed, its reason on stderr (`report` renders, it never gates);
- 2 a usage, input or internal error: one line on stderr, no traceback, no report file;
- 130 interrupted (Ctrl-C);
- a reader of stdout that goes away (`ckptscan trend RUN | head -1`) changes
  none of them: the command's own code, its gate line on stderr, no noise.

The matrix: diff, trend, compare, watch and report × healthy, alert, bad
input, internal error (in-process, the real entry point), closed pipe and
SIGINT (the `ckptscan` console script in processes of its own), on the
bundled sample runs. The scanning commands share one cache, so each sample pair is
computed once.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Callable

import pytest
from typer.testing import CliRunner
from hostile.helpers import CliResult, assert_one_line_error, run_cli

import ckptscan.scan.tasks
import ckptscan.document.reading
from ckptscan.cli import app

ROOT = Path(__file__).resolve().parents[2]
HEALTHY = ROOT / "sample_checkpoints" / "healthy"
FAULT = ROOT / "sample_checkpoints" / "attention_fault"
COMMANDS = ("diff", "trend", "compare", "watch", "report")
GATES = COMMANDS[:4]  # report renders a saved verdict: it never gates
WATCH_ENDS = ("--timeout", "1", "--poll", "--interval", "0.05")


@pytest.fixture(scope="module")
def where(tmp_path_factory) -> dict[str, Path]:
    """The shared cache, a second copy of the healthy run (compare needs two
    healthy runs), and the JSON reports `report` renders."""
    root = tmp_path_factory.mktemp("exit-codes")
    (root / "sweep").mkdir()
    (root / "sweep" / "healthy-a").symlink_to(HEALTHY)
    (root / "sweep" / "healthy-b").symlink_to(HEALTHY)
    return {"root": root, "cache": root / "cache", "sweep": root / "sweep",
            "healthy.json": root / "healthy.json", "alert.json": root / "alert.json"}


def args(command: str, case: str, where: dict[str, Path]) -> list[object]:
    """The command line of `command` on a healthy run, an alerting run, or a missing path."""
    cache = ("--cache-dir", where["cache"])
    missing = where["root"] / "missing"
    table = {
        "diff": {"healthy": [HEALTHY / "checkpoint-1000", HEALTHY / "checkpoint-1100"],
                 "alert": [FAULT / "checkpoint-1900", FAULT / "checkpoint-2000"],
                 "bad input": [HEALTHY / "checkpoint-1000", missing]},
        "trend": {"healthy": [HEALTHY, *cache], "alert": [FAULT, *cache], "bad input": [missing]},
        "compare": {"healthy": [where["sweep"] / "healthy-a", where["sweep"] / "healthy-b", *cache],
                    "alert": [HEALTHY, FAULT, *cache], "bad input": [HEALTHY, missing]},
        "watch": {"healthy": [HEALTHY, *WATCH_ENDS, *cache], "alert": [FAULT, *WATCH_ENDS, *cache],
                  "bad input": [missing, *WATCH_ENDS]},
        "report": {"healthy": [where["healthy.json"], "--junit", where["root"] / "healthy.xml"],
                   "alert": [where["alert.json"], "--junit", where["root"] / "alert.xml"],
                   "bad input": [where["root"] / "missing.json", "--junit", where["root"] / "x.xml"]},
    }
    return [command, *table[command][case], "--quiet"]


@pytest.fixture(scope="module")
def reports(where) -> dict[str, Path]:
    """The healthy and the alerting run's JSON reports, written by `trend` (the shared cache warmed)."""
    for case, run in (("healthy", HEALTHY), ("alert", FAULT)):
        result = CliRunner().invoke(app, ["trend", str(run), "--cache-dir", str(where["cache"]),
                                          "--json", str(where[f"{case}.json"]), "--quiet"])
        assert result.exit_code == (0 if case == "healthy" else 1), result.output
    return where


def assert_gate(result: CliResult, code: int) -> None:
    """`code`, and the gate's reason on stderr (passed or failed), no traceback."""
    assert result.code == code, (result.code, result.stderr)
    assert f"gate {'passed' if code == 0 else 'failed'} (--fail-on" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_a_healthy_run_exits_0(command, reports, capsys):
    result = run_cli(capsys, *args(command, "healthy", reports))
    if command in GATES:
        assert_gate(result, 0)
    else:
        assert result.code == 0 and result.stderr == "", result.stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_an_alerting_run_exits_1_with_the_gates_reason(command, reports, capsys):
    result = run_cli(capsys, *args(command, "alert", reports))
    if command in GATES:
        assert_gate(result, 1)
        assert "ALERT" in result.stderr
    else:  # rendering an alerting run's report is no failure
        assert result.code == 0 and result.stderr == "", result.stderr
        assert (reports["root"] / "alert.xml").read_text().count("<failure") >= 1


@pytest.mark.parametrize("command", COMMANDS)
def test_bad_input_is_one_line_and_exit_2(command, where, capsys):
    assert_one_line_error(run_cli(capsys, *args(command, "bad input", where)), "missing")


def fail_inside(monkeypatch, command: str) -> None:
    """An unexpected exception where each command does its work: the pair
    comparison, which runs on the layer worker threads; for `report`, reading
    the saved report."""
    def broken(*_, **__):
        raise RuntimeError("injected\nacross two lines")

    if command == "report":
        monkeypatch.setattr(ckptscan.document.reading, "report_from_dict", broken)
    else:
        monkeypatch.setattr(ckptscan.scan.tasks, "compare", broken)


def uncached(command: str, where: dict[str, Path]) -> list[object]:
    """The healthy case computed afresh (a cached pair would never reach the broken code)."""
    line = args(command, "healthy", where)
    if "--cache-dir" in line:
        at = line.index("--cache-dir")
        line[at:at + 2] = ["--no-cache"]
    return line


@pytest.mark.parametrize("command", COMMANDS)
def test_an_internal_error_is_one_line_and_exit_2_never_the_gates_1(command, reports, capsys, monkeypatch):
    fail_inside(monkeypatch, command)
    result = run_cli(capsys, *uncached(command, reports), "--json" if command != "report" else "--html",
                     reports["root"] / f"{command}-crashed.out")
    assert_one_line_error(result, f"error: internal error in ckptscan {command}: RuntimeError: injected across two "
                          "lines (at ckptscan/", "run with --debug for the traceback")
    assert not (reports["root"] / f"{command}-crashed.out").exists()  # no report, not even part of one


@pytest.mark.parametrize("debug", [["--debug"], []])
def test_debug_shows_the_traceback_of_an_internal_error_in_a_worker(debug, reports, capsys, monkeypatch):
    fail_inside(monkeypatch, "diff")
    if not debug:
        monkeypatch.setenv("CKPTSCAN_DEBUG", "1")
    result = run_cli(capsys, *debug, *args("diff", "healthy", reports), "--json", reports["root"] / "debug.json")
    assert result.code == 2
    assert "Traceback (most recent call last)" in result.stderr and 'in broken' in result.stderr
    assert result.stderr.rstrip().splitlines()[-1].startswith("error: internal error in ckptscan diff: RuntimeError")
    assert not (reports["root"] / "debug.json").exists()


# The `ckptscan` console script (`ckptscan.cli.console.main`, what the
# installed command runs) in a process of its own, with SIGINT's default
# handler as in a terminal (a background job of a script would ignore it:
# see tests/hostile/test_interrupts.py).
#
# PIPED runs each command line of the JSON list in argv[2] in turn, each with
# a stdout whose only reader has gone (a pipe whose read end is closed: `|
# head -0`; `| head -1` leaves after a line), and writes "EXIT <code>" on
# stderr after each: one start-up (importing torch is most of a process's
# time) for all of them. SLOW runs the one command line in argv[2:], tensor
# reads and report loads waiting 0.2 s each, the first announcing itself and
# waiting 1 s more, so that a signal sent 0.3 s after the announcement lands
# mid-command however little is left after it (`report` reads its file once,
# and its last 0.15 s are the process's exit, when a signal is no longer the
# command's).
CONSOLE = """
import signal; signal.signal(signal.SIGINT, signal.default_int_handler)
import json, os, sys, threading, time
from ckptscan.cli.console import main
if sys.argv[1] == "PIPED":
    for line in json.loads(sys.argv[2]):
        read, write = os.pipe()
        os.close(read)
        os.dup2(write, 1)
        os.close(write)
        sys.argv = ["ckptscan", *line]
        try:
            main()
            code = 0
        except SystemExit as e:
            code = e.code
        print(f"EXIT {code}", file=sys.stderr, flush=True)
    sys.exit(0)
import ckptscan.document.reading
from ckptscan.readers import SafetensorsSource
started = threading.Event()
def slowed(real):
    def slow(*args, **kwargs):
        if not started.is_set():
            started.set()
            print("WORKING", file=sys.stderr, flush=True)
            time.sleep(1.0)
        time.sleep(0.2)
        return real(*args, **kwargs)
    return slow
SafetensorsSource.get = slowed(SafetensorsSource.get)
ckptscan.document.reading.read_json_file = slowed(ckptscan.document.reading.read_json_file)
sys.argv = ["ckptscan", *sys.argv[2:]]
main()
"""


def console(mode: str, *argv: str, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CONSOLE, mode, *argv], stderr=subprocess.PIPE, text=True,
                            **popen)


def closed_pipes(lines: list[list[object]]) -> list[tuple[int, str]]:
    """Each `ckptscan LINE` with a stdout nobody reads any more: [(exit code, stderr)]."""
    proc = console("PIPED", json.dumps([[str(word) for word in line] for line in lines]),
                   stdout=subprocess.DEVNULL)
    with proc.stderr:
        stderr = proc.stderr.read()
    assert proc.wait(timeout=300) == 0, stderr
    results, lines_of_one = [], []
    for text in stderr.splitlines(keepends=True):
        if text.startswith("EXIT "):
            results.append((int(text.split()[1]), "".join(lines_of_one)))
            lines_of_one = []
        else:
            lines_of_one.append(text)
    assert len(results) == len(lines), stderr
    return results


def head_under_pipefail(where: dict[str, Path]) -> tuple[int, str]:
    """Issue 52's pipeline, verbatim but for the paths: (exit code, stdout lines + stderr)."""
    script = (f"set -o pipefail; {sys.executable} -m ckptscan trend {HEALTHY} --cache-dir {where['cache']} "
              "--quiet | head -1")
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=300)
    return proc.returncode, f"{len(proc.stdout.splitlines())} line(s) on stdout\n{proc.stderr}"


def interrupted(line: list[object]) -> tuple[int, str]:
    """`ckptscan LINE` sent SIGINT 0.3 s into its first read: (exit code, stderr without the marker)."""
    proc = console("SLOW", *map(str, line), stdout=subprocess.DEVNULL)
    try:
        first = proc.stderr.readline()
        assert first == "WORKING\n", first + proc.stderr.read()
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
        return code, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()


@pytest.fixture(scope="module")
def processes(reports) -> dict[tuple[str, str], tuple[int, str]]:
    """Every process case, three processes at a time: (command, case) -> (exit code, stderr)."""
    piped: dict[tuple[str, str], list[object]] = {}
    jobs: dict[tuple[str, str], Callable[[], tuple[int, str]]] = {}
    for command in COMMANDS:
        for case in ("healthy", "alert"):
            line = args(command, case, reports)
            if command == "report":
                line[line.index("--junit") + 1] = "-"  # report's output on stdout
            piped[command, f"closed pipe, {case}"] = line
        line = uncached(command, reports)
        if command == "watch":  # until Ctrl-C
            at = line.index("--timeout")
            del line[at:at + 2]
        jobs[command, "interrupt"] = partial(interrupted, line)
    jobs["trend", "| head -1"] = partial(head_under_pipefail, reports)
    with ThreadPoolExecutor(max_workers=3) as pool:
        all_piped = pool.submit(closed_pipes, list(piped.values()))
        futures = {key: pool.submit(job) for key, job in jobs.items()}
        results = {key: future.result() for key, future in futures.items()}
        results.update(zip(piped, all_piped.result()))
    return results


@pytest.mark.parametrize("case", ["healthy", "alert"])
@pytest.mark.parametrize("command", COMMANDS)
def test_a_closed_stdout_leaves_the_command_its_own_exit_code(command, case, processes):
    code, stderr = processes[command, f"closed pipe, {case}"]
    assert "Traceback" not in stderr and "pipe" not in stderr.lower(), stderr
    if command in GATES:
        assert code == (0 if case == "healthy" else 1), stderr
        assert stderr.startswith(f"gate {'passed' if case == 'healthy' else 'failed'} (--fail-on"), stderr
    else:
        assert (code, stderr) == (0, "")


def test_a_healthy_trend_piped_into_head_passes_under_pipefail(processes):
    code, output = processes["trend", "| head -1"]
    assert code == 0, output
    assert output.startswith("1 line(s) on stdout\ngate passed") and "Traceback" not in output


@pytest.mark.parametrize("command", COMMANDS)
def test_sigint_mid_command_exits_130_with_one_line(command, processes):
    code, stderr = processes[command, "interrupt"]
    assert code == 130, stderr
    assert len(stderr.strip().splitlines()) == 1 and "interrupted" in stderr and "Traceback" not in stderr


def test_an_exception_outside_any_command_is_one_line_and_exit_2(monkeypatch, capsys):
    """The console script's own last resort: what no command caught (start-up,
    option parsing) ends the same way as a command's internal error."""
    import ckptscan.cli
    import ckptscan.cli.console
    import ckptscan.cli.process

    def broken() -> None:
        raise RuntimeError("start-up failed")

    monkeypatch.setattr(ckptscan.cli, "main", broken)
    monkeypatch.setattr(ckptscan.cli.process, "claim_process", lambda: None)  # this process stays pytest's
    with pytest.raises(SystemExit) as exit:
        ckptscan.cli.console.main()
    assert exit.value.code == 2
    assert re.fullmatch(r"error: internal error in ckptscan: RuntimeError: start-up failed "
                        r"\(at ckptscan/cli/console\.py:\d+; run with --debug for the traceback\)\n",
                        capsys.readouterr().err)
