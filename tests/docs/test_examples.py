"""Every shell and Python example in README.md and docs/ runs, against the
sample runs, and prints what the page shows (the rules: tests/docs/examples.py).

Each page's examples run in order, in one working directory shared by the
session (sample_checkpoints/, docs/ and tests/golden/megatron/ linked into
it), with the worktree's ckptscan first on PATH and a pair cache of the
session's own, so an example may use a file an earlier one wrote and
repeated trends reuse their pairs.
"""

from __future__ import annotations

import difflib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from docs.examples import ROOT, SHELL, Block, Command, blocks, commands, documents, matches

PAGES = [path for path in documents() if any(b.lang in {"console", "python", "pycon"} for b in blocks(path))]


@pytest.fixture(scope="session")
def shell(tmp_path_factory) -> dict:
    """The working directory and environment the examples run in."""
    work = tmp_path_factory.mktemp("examples")
    for name in ("sample_checkpoints", "docs"):
        (work / name).symlink_to(ROOT / name)
    (work / "tests" / "golden").mkdir(parents=True)  # the Megatron-LM save directory of supported-checkpoints.md
    (work / "tests" / "golden" / "megatron").symlink_to(ROOT / "tests" / "golden" / "megatron")
    bin_dir = tmp_path_factory.mktemp("bin")
    wrapper = bin_dir / "ckptscan"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'import sys; sys.argv[0] = \"ckptscan\"; "
                       f"from ckptscan.cli.console import main; main()' \"$@\"\n")
    wrapper.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "CKPTSCAN_")) and k != "COLUMNS"}
    cache = tmp_path_factory.mktemp("xdg-cache")
    env |= {"PATH": f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
            "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(cache), "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1"}  # stdout and stderr interleaved as a terminal shows them
    # The sample runs, computed once, side by side: the examples' trends (and the sweep of all five, which no
    # single example should wait for) reuse their pairs.
    warming = [subprocess.Popen(["ckptscan", "trend", f"sample_checkpoints/{run}", "--quiet", "--json", "/dev/null"],
                                cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for run in ("attention_fault", "healthy", "router_fault", "silent_fault", "both_faults")]
    for process in warming:
        process.wait(timeout=300)
    return {"cwd": work, "env": env, "paths": {str(cache): "~/.cache", f"{work}/": ""}}


def normalised(output: str, paths: dict[str, str]) -> str:
    for path, shown in paths.items():
        output = output.replace(path, shown)
    return output


def run_block(block: Block, shell: dict) -> list[str]:
    """The failures of one example, each with what differs."""
    failures = []
    if block.lang == "console":
        for cmd in commands(block):
            done = subprocess.run(["bash", "-o", "pipefail", "-c", cmd.command], cwd=shell["cwd"], env=shell["env"],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
            actual = normalised(done.stdout, shell["paths"])
            if done.returncode != cmd.exit_code:
                failures.append(f"{block.where}: `{cmd.command}` exited {done.returncode}, the page says "
                                f"{cmd.exit_code}\n{actual}")
            elif not matches(cmd.expected, actual):
                diff = difflib.unified_diff([line.rstrip() for line in cmd.expected.splitlines()],
                                            [line.rstrip() for line in actual.splitlines()],
                                            "shown on the page", "printed", lineterm="")
                failures.append(f"{block.where}: `{cmd.command}` printed other than shown\n" + "\n".join(diff))
        return failures
    with tempfile.NamedTemporaryFile("w", suffix=".py" if block.lang == "python" else ".txt", dir=shell["cwd"],
                                     delete=False) as script:
        script.write(block.text + "\n")
    args = [script.name] if block.lang == "python" else ["-m", "doctest", "-o", "ELLIPSIS",
                                                         "-o", "NORMALIZE_WHITESPACE", script.name]
    done = subprocess.run([sys.executable, *args], cwd=shell["cwd"], env=shell["env"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300)
    os.unlink(script.name)
    if done.returncode != 0:
        failures.append(f"{block.where}: the {block.lang} example failed\n{normalised(done.stdout, shell['paths'])}")
    return failures


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_example_of_the_page_runs_and_prints_what_it_shows(page, shell):
    failures = []
    for block in blocks(page):
        if block.lang in {"console", "python", "pycon"} and block.not_executed is None:
            failures += run_block(block, shell)
    assert not failures, "\n\n".join(failures)


def test_shell_examples_are_executed_or_say_why_not():
    unexecutable = [b.where for p in documents() for b in blocks(p) if b.lang in SHELL and b.not_executed is None]
    assert not unexecutable, f"write these as ```console with `$ ` prompts, or mark them: {unexecutable}"
    indented = [b.where for p in documents() for b in blocks(p) if b.lang == "indented"]
    assert not indented, f"fence these code blocks, so that they are run or marked: {indented}"


def test_examples_not_executed_are_few_and_each_names_what_it_needs():
    marked = [(b.where, b.not_executed) for p in documents() for b in blocks(p) if b.not_executed is not None]
    print("\n".join(f"not executed: {where}: needs {reason}" for where, reason in marked))
    assert all(reason.strip() for _, reason in marked)
    assert len(marked) <= 20, marked  # infrastructure the tests cannot start cheaply: keep it rare


def test_the_readme_hides_the_harness_markers():
    """GitHub shows the README to users, for whom the docs harness's `*Not executed: …*` lines are noise."""
    shown = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("*Not executed")]
    assert not shown, f"use the hidden form, <!-- Not executed: needs X. -->: {shown}"


def test_the_rules_catch_what_rotted_before():
    """An example whose output drifted from the page fails, and `…` is the only leeway."""
    assert matches("router ε   base\n 0.857 (L0)", "router ε base 0.857 (L0)")
    assert not matches("router ε   base", "routing H/ln E base")
    assert matches("mixtral: …\n…\nALERT: attention … step 1500", "mixtral: 2 layers\nrow\nrow\nALERT: attention fired at step 1500")
    assert not matches("ALERT … step 1500", "ALERT at step 1600")


def test_blocks_are_read_with_their_marker_commands_and_exit_codes(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("text\n\n*Not executed: needs a GPU.*\n```bash\nrun-on-gpu\n```\n\n"
                    "<!-- Not executed: needs a cluster. -->\n```bash\nrun-on-a-cluster\n```\n\n"
                    "```console\n$ ckptscan diff A B \\\n    --json -   # exit 1\nout\n$ echo 'two\nlines'\ntwo\nlines\n```\n\n"
                    "    indented --code\n")
    gpu, cluster, console, indented = blocks(page)
    assert (gpu.lang, gpu.not_executed, gpu.line) == ("bash", "a GPU", 4)
    assert (cluster.lang, cluster.not_executed) == ("bash", "a cluster")
    assert commands(console) == [Command("ckptscan diff A B \\\n    --json -   # exit 1", "out", 1),
                                 Command("echo 'two\nlines'", "two\nlines", 0)]
    assert (indented.lang, indented.not_executed) == ("indented", None)
