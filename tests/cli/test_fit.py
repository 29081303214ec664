"""Output that fits its destination: a report piped to a file is never
wrapped, COLUMNS is respected, --help reads as a person expects, and the
lines that used to mislead (an interrupt after the JSON was written, a cache
write failing under --quiet, a diverged run's loss) say what happened."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import typer
from hostile.helpers import run_cli
from run_factory import write_run

from ckptscan.cli.app import user_errors, wrote

SAMPLES = Path(__file__).resolve().parents[2] / "sample_checkpoints"


@pytest.fixture(scope="module")
def long_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run whose path alone is longer than the old 160-column wrap."""
    return write_run(tmp_path_factory.mktemp("runs") / ("a-run-with-a-long-name-" * 8), count=4)


def test_a_piped_report_is_not_wrapped(long_run: Path, capsys: pytest.CaptureFixture,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    result = run_cli(capsys, "trend", long_run, "--no-cache")
    assert result.code == 0, result.stderr
    title = f"{long_run}: 3 pairs (consecutive), steps 0–300"
    assert len(title) > 200 and title in result.stdout.splitlines()[1]


def test_columns_is_respected_when_set(long_run: Path, capsys: pytest.CaptureFixture,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    result = run_cli(capsys, "trend", long_run, "--no-cache")
    assert result.code == 0, result.stderr
    assert max(len(line) for line in result.stdout.splitlines()) <= 100


def test_help_names_arguments_and_values_in_capitals(capsys: pytest.CaptureFixture) -> None:
    trend = run_cli(capsys, "trend", "--help").stdout
    assert "trend [OPTIONS] {RUN_DIR}" in trend and "--set KEY=VALUE" in trend and "--json FILE" in trend
    assert "{run_dir}" not in trend and "<list[str]>" not in trend and "<path>" not in trend
    diff = run_cli(capsys, "diff", "--help").stdout
    assert "diff [OPTIONS] {CKPT_A} {CKPT_B}" in diff and "--cache-dir" not in diff


def test_top_level_help_shows_each_command_summary_whole(capsys: pytest.CaptureFixture,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    text = " ".join(run_cli(capsys, "--help").stdout.split())
    assert "trend When did each layer become abnormal, through which mechanism, and does the run pass the gate?" \
        in text
    assert "..." not in text.split("Commands:")[1]


def test_a_diverged_runs_loss_line_gives_where_it_diverged_from(capsys: pytest.CaptureFixture) -> None:
    result = run_cli(capsys, "trend", SAMPLES / "attention_fault", "--no-cache")
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("loss ")]
    assert line.endswith(f"first pair 3.64, lowest 1.59 (steps 1600–1700), last pair 2.37; diverged at step 1999 "
                         f"({SAMPLES / 'attention_fault' / 'train_log.jsonl'})")


def test_an_interrupt_after_a_report_was_written_names_it(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(typer.Exit) as stopped:
        with user_errors():
            wrote("report.json")
            raise KeyboardInterrupt
    assert stopped.value.exit_code == 130
    assert capsys.readouterr().err == "interrupted: only report.json written\n"


def test_an_interrupt_before_any_report_says_none_was_written(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(typer.Exit):
        with user_errors():
            raise KeyboardInterrupt
    assert capsys.readouterr().err == "interrupted: no report was written\n"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through permissions")
def test_a_failed_cache_write_prints_one_line_even_with_quiet(long_run: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o500)
    result = run_cli(capsys, "trend", long_run, "--cache-dir", cache, "--quiet")
    assert result.code == 0
    lines = result.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"warning: cache not written: {cache}: ") and \
        lines[1].startswith("gate passed")


def test_a_cache_path_that_is_a_file_prints_one_line_even_with_quiet(long_run: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    cache = tmp_path / "cache"
    cache.write_text("not a directory")
    result = run_cli(capsys, "trend", long_run, "--cache-dir", cache, "--quiet")
    assert result.code == 0
    lines = result.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"warning: cache not written: {cache}: "), lines
    assert lines[1].startswith("gate passed")
