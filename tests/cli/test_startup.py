"""The command line answers --help, --version and completion without the heavy
imports (torch, the library, the W&B, MLflow and Prometheus clients, urllib's
HTTP client): a person typing `ckptscan --help` waits for nothing. (Its speed
is measured in bench/diff_overhead.py, not here.)"""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys
sys.argv = ["ckptscan", *{args!r}]
from ckptscan.cli.console import main
try:
    main()
except SystemExit as e:
    code = e.code
heavy = sorted(m for m in ("torch", "numpy", "ckptscan.scan", "ckptscan.pipeline.metrics", "rich", "wandb", "mlflow",
                           "prometheus_client", "urllib.request") if m in sys.modules)
print("HEAVY", heavy, "CODE", code)
"""


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["trend", "--help"], ["diff", "--help"],
                                  ["watch", "--help"], ["report", "--help"], ["--show-completion", "bash"]])
def test_answers_without_importing_torch(args):
    proc = subprocess.run([sys.executable, "-c", PROBE.format(args=args)], capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "SHELL": "/bin/bash"})
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("HEAVY [] CODE"), proc.stdout + proc.stderr


def test_version_prints_the_package_version():
    import ckptscan

    proc = subprocess.run([sys.executable, "-m", "ckptscan", "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == f"ckptscan {ckptscan.__version__}\n"


def test_help_shows_the_choices():
    proc = subprocess.run([sys.executable, "-m", "ckptscan", "trend", "--help"], capture_output=True, text=True,
                          timeout=60)
    text = " ".join(proc.stdout.split())
    for choices in ("<table|json|markdown|junit>", "<float32|float64>", "<warn|not_judged|alert>", "<previous|first>",
                    "[cpu|cuda|cuda:N|auto]", "[tool.ckptscan]", "--reference"):
        assert choices in text, choices
    assert "--baseline" not in text  # the deprecated alias still works, but is not advertised
