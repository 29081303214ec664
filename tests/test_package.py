"""A real package: `python -m build` makes the sdist and, from it, the wheel;
the wheel holds the code and the metadata, the sdist the source, neither any
sample run; installed into a fresh venv, the wheel runs `ckptscan --version`,
`diff` on a sample pair and `trend` on a sample run, outside the source tree.

The build uses --no-isolation (the test extra brings setuptools and build), so
nothing is downloaded; the fresh venv sees the dependencies (torch, …) through
a .pth line to this environment's site-packages, and the wheel is installed
into it with --no-deps --no-index. Selected alone with `pytest -m wheel`.
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from ckptscan import __version__

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_checkpoints"
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info", "build", "dist", ".hypothesis",
                                    ".pytest_cache", "out")


def run(*args, cwd, env=None, timeout=300):
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """The sdist and wheel, built from a copy of the tree (the checkout is not written to)."""
    tmp = tmp_path_factory.mktemp("package")
    source = tmp / "src"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCE)
    assert (source / "sample_checkpoints").is_dir()  # present at build time: the exclusion below is real
    built = run(sys.executable, "-m", "build", "--no-isolation", "--outdir", tmp / "dist", source, cwd=tmp)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = (tmp / "dist").glob("ckptscan-*.whl")
    (sdist,) = (tmp / "dist").glob("ckptscan-*.tar.gz")
    return {"wheel": wheel, "sdist": sdist, "tmp": tmp}


@pytest.mark.wheel
def test_wheel_holds_the_code_and_metadata_but_no_sample_runs(dist):
    assert dist["wheel"].name == f"ckptscan-{__version__}-py3-none-any.whl"
    assert dist["sdist"].name == f"ckptscan-{__version__}.tar.gz"
    with zipfile.ZipFile(dist["wheel"]) as wheel:
        names = wheel.namelist()
        info = f"ckptscan-{__version__}.dist-info"
        metadata = Parser().parsestr(wheel.read(f"{info}/METADATA").decode())
        entry_points = wheel.read(f"{info}/entry_points.txt").decode()
    assert not [n for n in names if "sample_checkpoints" in n or n.endswith((".safetensors", ".bin", ".pt"))]
    assert {n.split("/")[0] for n in names} == {"ckptscan", info}
    for module in ("cli/app.py", "report/tensorboard.py", "report/junit.py", "report/annotations.py"):
        assert f"ckptscan/{module}" in names
    assert "ckptscan = ckptscan.cli.console:main" in entry_points
    assert set(metadata.get_all("Provides-Extra")) >= {"report", "tensorboard", "test", "docs"}
    assert metadata["License-Expression"] == "Apache-2.0" and metadata["Requires-Python"] == ">=3.10"
    assert any(c.startswith("Programming Language :: Python :: 3.11") for c in metadata.get_all("Classifier"))
    assert metadata.get_all("Project-URL") is None  # no public home yet: no placeholder URL either
    assert metadata.get_payload().startswith("# ckptscan")  # the README is the long description


@pytest.mark.wheel
def test_sdist_is_the_source_without_sample_runs_or_partial_tests(dist):
    with tarfile.open(dist["sdist"]) as sdist:
        names = [name.split("/", 1)[1] for name in sdist.getnames() if "/" in name]
    assert {"README.md", "pyproject.toml", "ckptscan/cli/app.py", "ckptscan/report/junit.py"} <= set(names)
    assert not [n for n in names if n.startswith(("sample_checkpoints", "tests/")) or n.endswith(".safetensors")]


@pytest.mark.wheel
def test_installed_wheel_runs_version_diff_and_trend(dist):
    tmp = dist["tmp"]
    # A clean environment: no PYTHONPATH (pip would take a source tree's metadata for an installed ckptscan).
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY")}
    env["XDG_CACHE_HOME"] = str(tmp / "cache")
    venv = tmp / "venv"
    made = run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp, env=env)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    purelib = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                       cwd=tmp, env=env).stdout.strip())
    installed = run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index",
                    dist["wheel"], cwd=tmp, env=env)
    assert installed.returncode == 0, installed.stderr
    assert (purelib / "ckptscan" / "cli" / "app.py").is_file()
    # Then the dependencies only (torch is large): this environment's site-packages, after the venv's own
    # (added after the install, or pip would take this environment's ckptscan for an installed one).
    (purelib / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    where = run(python, "-c", "import ckptscan; print(ckptscan.__file__)", cwd=tmp, env=env)
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout + where.stderr  # not this source tree
    ckptscan = venv / "bin" / "ckptscan"

    version = run(ckptscan, "--version", cwd=tmp, env=env)
    assert (version.returncode, version.stdout) == (0, f"ckptscan {__version__}\n"), version.stderr

    fault = SAMPLES / "attention_fault"
    diff = run(ckptscan, "diff", fault / "checkpoint-1700", fault / "checkpoint-1800", "--format", "json",
               cwd=tmp, env=env)
    assert diff.returncode == 1, diff.stderr  # README: layer 1 alerts on this pair
    assert json.loads(diff.stdout)["summary"]["flagged_layers"] == [1]

    trend = run(ckptscan, "trend", SAMPLES / "healthy", "--json", tmp / "healthy.json", "-q", cwd=tmp, env=env)
    assert trend.returncode == 0, trend.stdout + trend.stderr
    report = json.loads((tmp / "healthy.json").read_text())
    assert report["summary"]["status"] == "ok" and len(report["pairs"]) == 30
