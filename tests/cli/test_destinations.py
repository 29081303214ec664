"""The destinations of `cli.destinations`, as a protocol: each is one module
declaring its options beside its write, registered once in `DESTINATIONS`, in
the order a command writes them; a command's group of options asks for those
whose flag was given, and loops over them to check before the scan and to
write after. The flags a destination names are the
ones the user gave (a Markdown summary that defaults to
$GITHUB_STEP_SUMMARY names none), which is what a sweep refuses."""

from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ckptscan.cli import app
from ckptscan.cli.destinations.figures import Figures
from ckptscan.cli.destinations.github_annotations import Annotations
from ckptscan.cli.destinations.json_file import JsonFile
from ckptscan.cli.destinations.junit_file import JunitFile
from ckptscan.cli.destinations.markdown_summary import MarkdownSummary
from ckptscan.cli.destinations.metrics_endpoint import MetricsEndpoint
from ckptscan.cli.destinations.registry import DESTINATIONS, REPORT, RENDER, SWEEP, TREND, WATCH
from ckptscan.cli.destinations.stdout_report import StdoutReport
from ckptscan.cli.destinations.tensorboard_events import TensorBoardEvents
from ckptscan.cli.destinations.wandb_run import WandbRun
from ckptscan.cli.options import Format
from ckptscan.cli.outputs import RenderOutputs, TrendOutputs, WatchOutputs
from ckptscan.report.destinations import Delivery, Destination

from run_factory import write_run

runner = CliRunner()


def trend_outputs(**given):
    fields = dict(json_path=None, per_head="all", junit=None, tensorboard=None, format=Format.table,
                  markdown_summary=None, html=None, png=None, wandb=None, mlflow=None, mlflow_experiment="ckptscan",
                  notify=None, notify_on="warn,alert")
    return TrendOutputs(**{**fields, **given})


def test_each_destination_is_registered_once_and_each_option_declared_once():
    assert all(issubclass(kind, Destination) for kind in DESTINATIONS)
    assert max(Counter(DESTINATIONS).values()) == 1
    options = {option for kind in DESTINATIONS for option in kind.options}
    assert max(Counter(option.flag for option in options).values()) == 1
    assert max(Counter(option.name for option in options).values()) == 1
    # Every destination a command offers is registered: it has its place in the write order.
    assert {kind for group in (REPORT, TREND, WATCH, RENDER, SWEEP) for kind in group} == set(DESTINATIONS)


def test_a_group_asks_for_what_was_given_in_the_order_they_are_written(tmp_path):
    outputs = trend_outputs(json_path=tmp_path / "r.json", junit=tmp_path / "r.xml", html=tmp_path / "r.html",
                            wandb="project")
    assert [type(d) for d in outputs.destinations()] == [StdoutReport, JsonFile, JunitFile, Annotations,
                                                         MarkdownSummary, Figures, WandbRun]
    # Nothing given: the report on stdout, annotations and the (default) Markdown summary, naming no flag.
    plain = trend_outputs().destinations()
    assert [type(d) for d in plain] == [StdoutReport, Annotations, MarkdownSummary]
    assert [flag for d in plain for flag in d.named()] == []


def test_watch_and_report_groups_offer_only_their_own_destinations(tmp_path):
    watch = WatchOutputs(json_path=None, per_head="all", markdown_summary=None, tensorboard=tmp_path, wandb=None,
                         mlflow=None, mlflow_experiment="ckptscan", notify=None, notify_on="warn,alert",
                         metrics_port=0, metrics_addr="127.0.0.1")
    assert [type(d) for d in watch.destinations()] == [MarkdownSummary, TensorBoardEvents, MetricsEndpoint]
    render = RenderOutputs(html=None, png=tmp_path, tensorboard=None, junit=tmp_path / "j.xml", wandb=None,
                           mlflow=None, mlflow_experiment="ckptscan")
    assert [type(d) for d in render.destinations()] == [JunitFile, Figures]
    assert [flag for d in render.destinations() for flag in d.named()] == ["--junit", "--png"]


def test_a_directory_where_a_file_is_asked_for_is_refused_by_its_destination_s_check(tmp_path):
    from ckptscan.errors import CkptScanError

    with pytest.raises(CkptScanError, match="--junit needs a file, and this is a directory"):
        trend_outputs(junit=tmp_path).check()


def test_the_junit_document_is_made_once_per_delivery(tmp_path):
    from ckptscan import scan_run

    report = scan_run(write_run(tmp_path / "run", count=4), config=None)
    delivery = Delivery(report, "alert", quiet=True)
    assert delivery.junit() is delivery.junit()


def test_a_sweep_refuses_the_destinations_of_one_run_by_the_flags_given(tmp_path):
    for name in ("a", "b"):
        write_run(tmp_path / "sweep" / name, count=4)
    result = runner.invoke(app, ["trend", str(tmp_path / "sweep"), "--junit", str(tmp_path / "j.xml"), "--png",
                                 str(tmp_path / "png"), "--format", "markdown", "--no-cache"])
    assert result.exit_code == 2
    assert "--format markdown, --junit, --png: not for a sweep" in result.stderr


@pytest.mark.parametrize("flag", ["--json", "--junit", "--markdown-summary"])
def test_a_report_file_in_a_folder_that_does_not_exist_is_refused_before_the_scan(tmp_path, flag):
    """No folder is made for a report file: a typo in its path is one line naming it, exit 2, and nothing
    created (the scan is not run)."""
    run = write_run(tmp_path / "run", count=4)
    target = tmp_path / "no" / "such" / "folder" / "report.out"
    result = runner.invoke(app, ["trend", str(run), flag, str(target), "--no-cache"])
    assert result.exit_code == 2
    assert result.stderr == (f"error: {target}: {flag}: the folder {target.parent} does not exist (ckptscan creates "
                             "no folder for a report file: create it first)\n")
    assert not (tmp_path / "no").exists()


def test_inspect_refuses_a_json_file_in_a_missing_folder_and_names_the_file_it_writes(tmp_path):
    run = write_run(tmp_path / "run", count=2)
    missing = tmp_path / "no" / "x.json"
    refused = runner.invoke(app, ["inspect", str(run / "checkpoint-0"), "--json", str(missing)])
    assert refused.exit_code == 2 and "the folder" in refused.stderr and not (tmp_path / "no").exists()
    written = runner.invoke(app, ["inspect", str(run / "checkpoint-0"), "--json", str(tmp_path / "x.json")])
    assert written.exit_code == 0 and f"wrote {tmp_path / 'x.json'}\n" in written.stderr


def test_every_report_file_written_is_named_on_stderr(tmp_path):
    run = write_run(tmp_path / "run", count=4)
    files = {"--json": tmp_path / "r.json", "--junit": tmp_path / "j.xml", "--markdown-summary": tmp_path / "s.md"}
    result = runner.invoke(app, ["trend", str(run), "--no-cache", *[str(a) for pair in files.items() for a in pair]])
    assert result.exit_code in (0, 1), result.output
    lines = result.stderr.splitlines()
    assert f"wrote {files['--json']}" in lines and f"wrote {files['--junit']}" in lines
    assert f"appended the summary to {files['--markdown-summary']}" in lines
    quiet = runner.invoke(app, ["trend", str(run), "--no-cache", "--quiet", "--json", str(files["--json"])])
    assert "wrote" not in quiet.stderr
