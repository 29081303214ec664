"""`ckptscan compare RUN...` and `ckptscan trend SWEEP/`: each run judged
against the others (leave-one-out), ranked healthiest first (ok, warn,
alert; within a status the later first alert first), the exit code the worst
run's, `--json` a versioned sweep report holding every run's whole report;
with three runs or more, a run that alerts against all the others is left
out of their bands; runs of another model refused in one line naming the
odd run."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ckptscan.cli import app
from ckptscan.schema.results import SCHEMA_VERSION, SEVERITIES

from run_factory import write_run

runner = CliRunner()
SAMPLES = Path(__file__).resolve().parents[2] / "sample_checkpoints"
RUN_KEYS = {"rank", "path", "status", "first_alert_step", "first_warn_step", "family", "references", "report"}


def invoke(*args):
    return runner.invoke(app, [*map(str, args)])


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One pair cache for the module: each sample run is scanned once."""
    return tmp_path_factory.mktemp("compare-cache")


@pytest.fixture(scope="module")
def samples_compared(cache, tmp_path_factory):
    """`compare sample_checkpoints/*` (the shell's glob: the README too), with --json."""
    path = tmp_path_factory.mktemp("compare") / "sweep.json"
    result = invoke("compare", *sorted(SAMPLES.iterdir()), "--json", path, "--cache-dir", cache)
    return result, json.loads(path.read_text())


@pytest.fixture(scope="module")
def two_seeds(tmp_path_factory):
    root = tmp_path_factory.mktemp("two-seeds")
    return [write_run(root / f"seed{seed}", count=8, seed=seed) for seed in (0, 1)]


def test_the_sample_runs_are_ranked_healthiest_first_and_exit_by_the_worst(samples_compared):
    result, report = samples_compared
    assert result.exit_code == 1, result.output  # four faulty runs alert: the gate fails
    assert "ignoring" in result.stderr and "README.md: a file, not a run directory" in result.stderr
    runs = report["runs"]
    assert [run["rank"] for run in runs] == [1, 2, 3, 4, 5]
    assert runs[0]["path"].endswith("healthy") and runs[0]["status"] == "ok" and runs[0]["first_alert_step"] is None
    assert {Path(run["path"]).name for run in runs[1:]} == {"attention_fault", "router_fault", "silent_fault",
                                                             "both_faults"}
    assert all(run["status"] == "alert" and run["family"] in ("attention", "router") for run in runs[1:])
    # Ranked by status, then the later first alert first.
    keys = [(SEVERITIES.index(run["status"]), -(run["first_alert_step"] or 0)) for run in runs]
    assert keys == sorted(keys)
    table = result.stdout
    assert "5 runs, each judged against the band of the others, less those that alert against all the rest" in table
    rows = [line.split() for line in table.splitlines() if "0–3000" in line]  # rank, run, steps, status, ...
    assert [row[1] for row in rows] == [run["path"] for run in runs]
    assert [row[3] for row in rows] == [run["status"] for run in runs]
    assert [row[-1] for row in rows] == ["4", "1", "1", "1", "1"]  # "against": the healthy run, or all four
    assert f"the worst: {runs[-1]['path']}" in table
    assert "gate failed (--fail-on alert)" in result.stderr


def test_the_sweep_report_is_versioned_and_holds_each_run_judged_against_the_others(samples_compared):
    _, report = samples_compared
    assert report["schema_version"] == SCHEMA_VERSION and report["tool"]["name"] == "ckptscan"
    assert report["command"] == "compare"
    assert report["summary"]["status"] == "alert" and report["summary"]["runs"] == 5
    assert report["summary"]["message"].startswith("ALERT: of 5 runs, 4 alerted; the worst:")
    paths = [run["path"] for run in report["runs"]]
    healthy, faulty = paths[0], sorted(paths[1:])
    assert report["left_out"] == faulty  # each alerts against all the others
    for run in report["runs"]:
        assert set(run) == RUN_KEYS
        others = sorted(p for p in paths if p != run["path"])
        whole = run["report"]
        assert whole["command"] == "trend" and whole["schema_version"] == SCHEMA_VERSION
        notes = whole["settings"]["reference_notes"]
        if run["path"] == healthy:  # every other run alerts: judged against the band of all four
            assert sorted(run["references"]) == sorted(whole["settings"]["reference_runs"]) == others
            assert notes == [f"every run but {healthy} alerts against the rest: it is judged against all of them"]
        else:  # the other faulty runs left out: judged against the healthy run alone
            assert run["references"] == [healthy] and whole["settings"]["reference"] == healthy
            assert "reference_runs" not in whole["settings"]
            assert sorted(n.split(" alerts against all the other runs")[0] for n in notes) == \
                [p for p in faulty if p != run["path"]]
        assert whole["summary"]["status"] == run["status"]
        first = [s for s in whole["summary"]["first_alert_step"].values() if s is not None]
        assert run["first_alert_step"] == (min(first) if first else None)


def test_a_faulty_run_left_with_the_healthy_run_is_judged_as_against_that_run_alone(samples_compared, cache, tmp_path):
    """Leaving the other faulty runs out makes a faulty run's sweep judgement
    exactly `trend RUN --reference HEALTHY`'s."""
    _, compared = samples_compared
    healthy = compared["runs"][0]["path"]
    for run in compared["runs"][1:]:
        path = tmp_path / f"{Path(run['path']).name}.json"
        result = invoke("trend", run["path"], "--reference", healthy, "--json", path, "--cache-dir", cache)
        assert result.exit_code == 1, result.output
        alone = json.loads(path.read_text())
        assert alone["summary"] == run["report"]["summary"]
        assert alone["pairs"] == run["report"]["pairs"]


def test_leaving_alerting_runs_out_makes_faulty_runs_alert_no_later(samples_compared, cache):
    """Against bands that hold the other faulty runs (`leave_out=False`, the
    first round) the faulty runs alert no earlier: the faulty members widen the
    bands. (On the sample runs both attention faults now alert at the logit
    scale's ceiling, which no band moves: 1400 and 500 either way.) The
    healthy run is judged against all four either way."""
    from ckptscan.caches.pair_cache import PairCache
    from ckptscan.pipeline.sweep import compare_runs

    _, compared = samples_compared
    first_round = compare_runs([run["path"] for run in compared["runs"]], cache=PairCache(cache), leave_out=False)
    assert first_round.left_out == []
    before = {run.path: run for run in first_round.runs}
    for run in compared["runs"]:
        assert sorted(before[run["path"]].references) == sorted(p["path"] for p in compared["runs"]
                                                                if p["path"] != run["path"])
        old, new = before[run["path"]].first_alert_step, run["first_alert_step"]
        if old is None:
            assert new is None and run["status"] == "ok"  # the healthy run
        else:
            assert new <= old


def test_trend_of_a_sweep_directory_is_compare_of_its_runs(samples_compared, cache, tmp_path):
    _, compared = samples_compared
    path = tmp_path / "trend.json"
    result = invoke("trend", SAMPLES, "--json", path, "--cache-dir", cache)
    assert result.exit_code == 1, result.output
    assert json.loads(path.read_text()) == compared
    assert "150 pair(s) reused, 0 computed" in result.stderr  # each run scanned once, by compare, ever


def test_trend_of_a_sweep_refuses_what_names_one_run(cache):
    result = invoke("trend", SAMPLES, "--reference", SAMPLES / "healthy", "--cache-dir", cache)
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "--reference: not for a sweep" in result.stderr


def test_trend_of_a_sweep_switches_every_run_s_loss_log_off_with_no_loss_log(samples_compared, cache, tmp_path):
    """--no-loss-log reaches every run of the sweep (it was ignored): no
    run's report reads its train_log.jsonl, where with it each does."""
    _, compared = samples_compared
    assert all(run["report"]["settings"].get("loss_log") for run in compared["runs"])
    path = tmp_path / "trend.json"
    result = invoke("trend", SAMPLES, "--no-loss-log", "--json", path, "--cache-dir", cache)
    assert result.exit_code == 1, result.output
    runs = json.loads(path.read_text())["runs"]
    assert len(runs) == 5
    assert all("loss_log" not in run["report"]["settings"] for run in runs)
    assert all(pair["loss"] is None for run in runs for pair in run["report"]["pairs"])


def test_compare_switches_every_run_s_probe_off_with_no_probe(cache, tmp_path):
    runs = [SAMPLES / "healthy", SAMPLES / "router_fault"]
    assert all((run / "probe.safetensors").is_file() for run in runs)
    for flags, routed in (((), True), (("--no-probe",), False)):
        path = tmp_path / f"sweep{len(flags)}.json"
        result = invoke("compare", *runs, *flags, "--json", path, "--cache-dir", cache)
        assert result.exit_code in (0, 1), result.output
        reports = [run["report"] for run in json.loads(path.read_text())["runs"]]
        entropies = [layer["router"]["routing_entropy"] for report in reports for pair in report["pairs"]
                     for layer in pair["layers"] if layer.get("router")]
        assert entropies and all((e is not None) == routed for e in entropies)
        assert all((report["probe"] is not None) == routed for report in reports)


def test_two_healthy_runs_each_judged_against_the_other_pass(two_seeds, tmp_path):
    path = tmp_path / "sweep.json"
    result = invoke("compare", *two_seeds, "--json", path)
    assert result.exit_code == 0, result.output
    assert "2 runs, each judged against the other run" in result.stdout
    assert "HEALTHY: none of the 2 runs departed from the others" in result.stdout
    assert json.loads(path.read_text())["left_out"] == []
    assert "gate passed (--fail-on alert)" in result.stderr
    runs = json.loads(path.read_text())["runs"]
    assert [run["status"] for run in runs] == ["ok", "ok"]
    assert [run["path"] for run in runs] == [str(d) for d in two_seeds]  # a tie keeps the order given
    for run, other in zip(runs, reversed(two_seeds)):
        settings = run["report"]["settings"]
        assert settings["reference"] == str(other) and "reference_runs" not in settings  # one reference, no band


def test_a_run_of_another_model_is_refused_in_one_line_naming_it(two_seeds, tmp_path):
    odd = write_run(tmp_path / "three-layers", count=8, layers=3)
    result = invoke("compare", two_seeds[0], odd, two_seeds[1])
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.output
    assert f"error: {odd}: is of a different model than the other runs (num_layers: 3 vs 2" in result.stderr


def test_fewer_than_two_runs_is_an_input_error(two_seeds):
    result = invoke("compare", two_seeds[0])
    assert result.exit_code == 2
    assert "a comparison needs at least two runs, got 1" in result.stderr



def test_runs_of_different_lengths_are_aligned_by_step_and_the_report_says_where_one_ended(two_seeds, tmp_path):
    short = write_run(tmp_path / "short", count=5, seed=2)  # steps 0-400; the others run to 700
    path = tmp_path / "sweep.json"
    result = invoke("compare", *two_seeds, short, "--json", path)
    assert result.exit_code in (0, 1), result.output
    report = json.loads(path.read_text())
    ended = f"reference {short} ends at step 400: later pairs are judged against the other references"
    assert any(note.startswith(ended) for note in report["notes"])
    assert f"note: {ended}" in result.stdout
    for run in report["runs"]:
        notes = run["report"]["settings"].get("reference_notes", [])
        assert any(n.startswith(ended) for n in notes) == (run["path"] != str(short))


def test_a_sweep_renders_as_html_from_the_run_and_from_its_json_alike(two_seeds, tmp_path):
    page, again, path = tmp_path / "sweep.html", tmp_path / "again.html", tmp_path / "sweep.json"
    result = invoke("compare", *two_seeds, "--json", path, "--html", page)
    assert result.exit_code == 0, result.output
    rendered = invoke("report", path, "--html", again)
    assert rendered.exit_code == 0, rendered.output  # was: "not a ckptscan JSON report"
    assert page.read_bytes() == again.read_bytes()
    text = page.read_text()
    assert "<h2>Runs, healthiest first</h2>" in text and all(str(run) in text for run in two_seeds)
    assert "HEALTHY: none of the 2 runs departed from the others" in text
    refused = invoke("report", path, "--png", tmp_path / "figs")
    assert refused.exit_code == 2 and "a sweep's report renders as --html FILE only" in refused.stderr


def test_the_sweep_pages_notes_name_each_left_out_run_once():
    """A run left out of the others' bands is named by its note; the page adds a line only for a run no note
    names (a report written before the notes did)."""
    from ckptscan.report.sweep_html import sweep_notes

    noted = "b alerts against all the other runs: left out of the others' bands"
    assert sweep_notes({"notes": [noted, noted], "left_out": ["b"]}) == [noted]
    assert sweep_notes({"notes": [], "left_out": ["b", "c"]}) == [
        "left out of the others' bands: b", "left out of the others' bands: c"]
    assert sweep_notes({"notes": [noted], "left_out": ["b", "c"]}) == [noted, "left out of the others' bands: c"]


def test_each_run_has_one_first_alert_in_its_row_and_in_the_notes(samples_compared):
    """A note that gives a run's first alert gives the one its row gives (one first alert per run)."""
    result, report = samples_compared
    rows = {run["path"]: run["first_alert_step"] for run in report["runs"]}
    noted = [note for note in [*report["notes"], *result.stdout.splitlines()] if "(first alert at step " in note]
    for note in noted:
        path = note.removeprefix("note: ").split(" alerts against all the other runs")[0]
        step = int(note.split("(first alert at step ")[1].split(")")[0])
        assert rows[path] == step, note
