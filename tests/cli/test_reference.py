"""`--reference` (trend, diff, watch): one known-healthy run or several, each
a JSON report, a run directory or a URL of either (tests/storage). A run
directory judges exactly as its `trend --json` report does; several values
(after one flag, or the flag repeated) make a band, listed in
`settings.reference_runs`; a reference that alerts itself (against the
other references, or on its own history when alone) is left out and the
report says so; the old single-file use is unchanged, the flag before the
run included; a reference of another model is one line, exit 2."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ckptscan.cli import app

from run_factory import write_run

runner = CliRunner()
SAMPLES = Path(__file__).resolve().parents[2] / "sample_checkpoints"
FAULTY, HEALTHY, ROUTER, SILENT = (SAMPLES / name for name in ("attention_fault", "healthy", "router_fault",
                                                                 "silent_fault"))


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("reference-cache")


def trend(*args, cache=None):
    result = runner.invoke(app, ["trend", *map(str, args), "--format", "json", "--quiet",
                                 *(["--cache-dir", str(cache)] if cache else ["--no-cache"])])
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout)


def without_reference_paths(report):
    settings = {k: v for k, v in report["settings"].items() if k not in ("reference", "reference_runs")}
    return {**report, "settings": settings}


def test_a_run_directory_judges_as_its_json_report(tmp_path, cache):
    saved = tmp_path / "healthy.json"
    runner.invoke(app, ["trend", str(HEALTHY), "--json", str(saved), "--quiet", "--cache-dir", str(cache)])
    from_report = trend(FAULTY, "--reference", saved, cache=cache)
    from_run = trend(FAULTY, "--reference", HEALTHY, cache=cache)
    assert from_report["settings"]["reference"] == str(saved)
    assert from_run["settings"]["reference"] == str(HEALTHY)
    assert without_reference_paths(from_run) == without_reference_paths(from_report)
    assert from_run["summary"]["status"] == "alert"


@pytest.fixture(scope="module")
def healthy_report(cache, tmp_path_factory):
    """The healthy sample run's `trend --json` report: a second healthy reference."""
    saved = tmp_path_factory.mktemp("healthy-report") / "healthy.json"
    runner.invoke(app, ["trend", str(HEALTHY), "--json", str(saved), "--quiet", "--cache-dir", str(cache)])
    return saved


def test_several_references_make_a_band_listed_in_the_settings(cache, healthy_report):
    listed = trend(FAULTY, "--reference", HEALTHY, healthy_report, cache=cache)
    repeated = trend(FAULTY, "--reference", HEALTHY, "--reference", healthy_report, cache=cache)
    assert listed["settings"]["reference_runs"] == [str(HEALTHY), str(healthy_report)]
    assert "reference_left_out" not in listed["settings"]  # healthy references are all kept
    assert listed == repeated
    one = trend(FAULTY, "--reference", HEALTHY, cache=cache)
    assert "reference_runs" not in one["settings"]  # one reference is no band
    assert one["pairs"] != listed["pairs"]  # judged against the band, not the one run


def test_a_reference_that_alerts_is_left_out_and_the_report_says_why(cache):
    """Two faulty runs among the references: the run is judged exactly as
    against the healthy one alone, and the report and the table say why."""
    screened = trend(FAULTY, "--reference", HEALTHY, ROUTER, SILENT, cache=cache)
    alone = trend(FAULTY, "--reference", HEALTHY, cache=cache)
    settings = screened["settings"]
    assert settings["reference"] == str(HEALTHY) and "reference_runs" not in settings
    assert settings["reference_left_out"] == [str(ROUTER), str(SILENT)]
    notes = settings["reference_notes"]
    assert [n.split(" is left out: it alerts against the band of the other references (")[0] for n in notes] == \
        [f"reference {ROUTER}", f"reference {SILENT}"]
    assert screened["pairs"] == alone["pairs"] and screened["summary"] == alone["summary"]
    table = runner.invoke(app, ["trend", str(FAULTY), "--reference", str(HEALTHY), str(ROUTER), str(SILENT),
                                "--cache-dir", str(cache)])
    assert f"note: reference {ROUTER} is left out: it alerts" in table.stdout.replace("\n", "")


def test_when_every_reference_alerts_the_run_is_judged_against_its_own_history(cache):
    screened = trend(FAULTY, "--reference", SILENT, cache=cache)
    own = trend(FAULTY, cache=cache)
    assert screened["settings"]["reference_left_out"] == [str(SILENT)]
    assert screened["settings"]["reference_notes"] == [
        f"reference {SILENT} is left out: it alerts on its own history (attention, step 500), so it is not a "
        "healthy run to judge against", "every reference alerts: the run is judged against its own history only"]
    assert "reference" not in screened["settings"]
    assert screened["pairs"] == own["pairs"] and screened["summary"] == own["summary"]


def test_the_flag_may_come_before_the_run_as_it_always_could(cache):
    before = trend("--reference", HEALTHY, FAULTY, cache=cache)
    after = trend(FAULTY, "--reference", HEALTHY, cache=cache)
    assert before == after and before["settings"]["reference"] == str(HEALTHY)
    two = trend("--reference", HEALTHY, ROUTER, FAULTY, cache=cache)  # the last word is the run
    assert two["settings"]["reference"] == str(HEALTHY) and two["settings"]["reference_left_out"] == [str(ROUTER)]


def test_diff_takes_a_run_as_its_reference(healthy_report):
    result = runner.invoke(app, ["diff", str(FAULTY / "checkpoint-1700"), str(FAULTY / "checkpoint-1800"),
                                 "--reference", str(HEALTHY), str(healthy_report), "--format", "json", "--quiet"])
    assert result.exit_code in (0, 1), result.output
    assert json.loads(result.stdout)["settings"]["reference_runs"] == [str(HEALTHY), str(healthy_report)]


def test_a_reference_of_another_model_is_one_line_naming_it(tmp_path):
    odd = write_run(tmp_path / "three-layers", count=6, layers=3)
    result = runner.invoke(app, ["trend", str(FAULTY), "--reference", str(HEALTHY), str(odd), "--no-cache", "-q"])
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.output
    assert str(odd) in result.stderr and "different model" in result.stderr and "num_layers" in result.stderr
