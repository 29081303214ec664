"""`~` and `$VAR` in a path mean what the shell would make of them, wherever
ckptscan takes a path; no `./~` folder can ever be created (ckptscan.system.paths)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hostile.helpers import run_cli
from run_factory import write_run

import ckptscan
from ckptscan.inputs.loss_log import read_loss_log
from ckptscan.pipeline.run import resolve_run
from ckptscan.system.paths import expand_path
from ckptscan.document.writing import write_json
from ckptscan.document.reading import load_report


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HOME in tmp_path; the current directory elsewhere, to look for a `~` in."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    return home


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_run(tmp_path_factory.mktemp("runs") / "run", count=4)


def test_expand_path_expands_the_home_and_variables(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNS", "/data/runs")
    assert expand_path("~/.cache/ckptscan") == home / ".cache" / "ckptscan"
    assert expand_path(Path("~")) == home
    assert expand_path("$RUNS/main") == Path("/data/runs/main")
    assert expand_path("${RUNS}/main") == Path("/data/runs/main")
    assert expand_path("runs/a~b") == Path("runs/a~b")  # only a leading ~ is the home


def test_the_readme_pair_cache_lands_in_the_home_not_in_a_tilde_folder(home: Path, run: Path) -> None:
    cache = ckptscan.PairCache("~/.cache/ckptscan")
    ckptscan.scan_run(run, cache=cache, config=None)
    assert cache.directory == home / ".cache" / "ckptscan" and cache.misses == 3
    assert any((home / ".cache" / "ckptscan").iterdir())
    assert list(Path.cwd().iterdir()) == []


def test_cache_dir_in_quotes_lands_in_the_home(home: Path, run: Path, capsys: pytest.CaptureFixture) -> None:
    result = run_cli(capsys, "trend", run, "--cache-dir", "~/ckc", "--quiet")
    assert result.code == 0, result.stderr
    assert any((home / "ckc").iterdir())
    assert list(Path.cwd().iterdir()) == []


def test_every_path_option_is_expanded(home: Path, run: Path, capsys: pytest.CaptureFixture,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUT", str(home / "out"))
    (home / "out").mkdir()
    (home / "ckptscan.toml").write_text("alert_sigma = 7.0\n")
    result = run_cli(capsys, "trend", run, "--json", "$OUT/report.json", "--junit=~/out/report.xml", "--config", "~/ckptscan.toml",
                     "--cache-dir", "${OUT}/cache", "--quiet")
    assert result.code == 0, result.stderr
    report = json.loads((home / "out" / "report.json").read_text())
    assert report["thresholds"]["alert_sigma"] == 7.0
    assert (home / "out" / "report.xml").is_file() and (home / "out" / "cache").is_dir()
    assert list(Path.cwd().iterdir()) == []


def test_run_directories_checkpoints_and_side_files_are_expanded(home: Path, run: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUN", str(run))
    assert [c.step for c in resolve_run("$RUN", config=None).checkpoints] == [0, 100, 200, 300]
    pair = ckptscan.scan_pair("$RUN/checkpoint-100", "${RUN}/checkpoint-200", config=None)
    assert pair.pairs[0].to_path == f"{run}/checkpoint-200"
    write_json(pair, home / "report.json")
    (home / "train_log.jsonl").write_text('{"step": 0, "loss": 3.0}\n{"step": 1, "loss": 2.9}\n')
    assert load_report("~/report.json").pairs[0].to_step == 200
    assert read_loss_log("~/train_log.jsonl").steps == [0, 1]
    assert ckptscan.scan_run("$RUN", config=None, reference="~/report.json", loss_log="~/train_log.jsonl",
                             probe=None).settings["reference"] == str(home / "report.json")


def test_a_missing_home_path_names_the_expanded_path(home: Path, capsys: pytest.CaptureFixture) -> None:
    result = run_cli(capsys, "trend", "~/no-such-run")
    assert (result.code, result.stderr) == (2, f"error: {home / 'no-such-run'}: does not exist\n")
    assert list(Path.cwd().iterdir()) == []


def test_a_url_is_never_expanded(home: Path) -> None:
    from ckptscan.storage import as_path

    assert str(as_path("memory://bucket/~/run")) == "memory://bucket/~/run"
