"""Where a report goes, and the exit code it makes: every destination a
command writes (stdout in --format, --json, --junit, --markdown-summary,
GitHub annotations, --html, --png, --tensorboard; the services --wandb,
--mlflow, --notify and watch's --metrics-port) and the gate.

Each group below is a command's set of destinations, as options
(`cli.options.shared_options` spreads a group's fields into flags, in field
order): `ReportOutputs` for diff, `TrendOutputs` for trend, `WatchOutputs`
for watch (written again after each judged pair), `RenderOutputs` for
`ckptscan report` (a saved report). A group checks, before any long scan,
that what its destinations need is installed and that their targets are
well formed, then writes them all. Every file write goes through
`ckptscan.output`; a failed one is one line and exit 2. A service is not a
file the user asked for but a place the scan is also shown: each is written
through `report.destinations.deliver`, so one that fails (no network, a bad
store, a full disk) is one line on stderr and changes neither the exit code
nor the JSON report.

A new destination (say --wandb) is: its option in `cli.options` (a
declaration and its `SHARED` entry, under the field's name), a field in the
groups of the commands that offer it (where the field stands is where --help
lists it), and its lines in those groups' `check` (what it needs installed)
and `write`. The commands themselves do not change.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ckptscan.cli.app import EXIT_GATE, EXIT_OK, err, note, out, report_console, wrote
from ckptscan.cli.options import FailOn, Format
from ckptscan.errors import CkptScanError

if TYPE_CHECKING:
    from rich.console import Console

    from ckptscan.report.prometheus import MetricsServer
    from ckptscan.results import ScanReport, SweepReport
    from ckptscan.watch import WatchEvent


@dataclass(frozen=True)
class ReportOutputs:
    """diff's destinations (and the first of trend's), in their --help order."""

    json_path: Path | None
    per_head: str
    junit: Path | None
    tensorboard: Path | None
    format: Format
    markdown_summary: Path | None
    html: Path | None
    png: Path | None

    def check(self) -> None:
        from ckptscan.report.json import check_per_head

        check_per_head(self.per_head)
        check_file_outputs({"--json": self.json_path, "--junit": self.junit, "--markdown-summary": self.markdown_summary,
                            "--html": self.html})
        check_figure_outputs(self.html, self.png)
        check_tensorboard_output(self.tensorboard)

    def write(self, report: ScanReport, fail_on: FailOn | str, print_table: Callable[[Console, ScanReport], None],
              quiet: bool, allow_corrupt: bool = False) -> int:
        """Every destination, then the gate's line on stderr; returns its exit code."""
        self.write_destinations(report, fail_on, print_table, quiet)
        return gate(report, fail_on, allow_corrupt)

    def write_destinations(self, report: ScanReport, fail_on: FailOn | str,
                           print_table: Callable[[Console, ScanReport], None], quiet: bool) -> None:
        emit(report, self.format, self.json_path, self.markdown_summary, print_table, self.junit, fail_on,
             self.per_head)
        write_figure_outputs(report, self.html, self.png, quiet, self.per_head)
        write_tensorboard_output(report, self.tensorboard, quiet)


@dataclass(frozen=True)
class TrendOutputs(ReportOutputs):
    """trend's destinations: diff's, then the services that follow a run."""

    wandb: str | None
    mlflow: str | None
    mlflow_experiment: str
    notify: str | None
    notify_on: str

    def check(self) -> None:
        super().check()
        check_service_outputs(self.wandb, self.mlflow, self.notify, self.notify_on)

    def write_destinations(self, report: ScanReport, fail_on: FailOn | str,
                           print_table: Callable[[Console, ScanReport], None], quiet: bool) -> None:
        super().write_destinations(report, fail_on, print_table, quiet)
        write_service_outputs(report, self.wandb, self.mlflow, self.mlflow_experiment, self.notify, self.notify_on,
                              quiet)


@dataclass(frozen=True)
class WatchOutputs:
    """watch's destinations, in its --help order: they follow the run."""

    json_path: Path | None
    per_head: str
    markdown_summary: Path | None
    tensorboard: Path | None
    wandb: str | None
    mlflow: str | None
    mlflow_experiment: str
    notify: str | None
    notify_on: str
    metrics_port: int | None
    metrics_addr: str

    def check(self) -> None:
        from ckptscan.report.json import check_per_head

        check_per_head(self.per_head)
        check_file_outputs({"--json": self.json_path, "--markdown-summary": self.markdown_summary})
        check_tensorboard_output(self.tensorboard)
        check_service_outputs(self.wandb, self.mlflow, self.notify, self.notify_on)
        if self.metrics_port is not None:
            from ckptscan.report.prometheus import require_prometheus

            require_prometheus()

    def open(self, quiet: bool) -> WatchDestinations:
        """The destinations for one watch, its metrics endpoint listening from
        now until `close` (a port in use: exit 2 before anything is judged)."""
        if self.metrics_port is None:
            return WatchDestinations(self, None)
        from ckptscan.report.prometheus import MetricsServer

        server = MetricsServer(self.metrics_port, self.metrics_addr)
        note(f"serving metrics on http://{self.metrics_addr}:{server.port}/metrics", quiet=quiet)
        return WatchDestinations(self, server)

    def write(self, event: WatchEvent, quiet: bool) -> None:
        """After each judged pair, before its rows are printed (a printed row's
        pair is in them): the whole series in the JSON report, the new rows
        appended to the Markdown summary, the new steps to TensorBoard, then
        the services (W&B and MLflow get the new steps; --notify posts a first
        warning or alert once)."""
        from ckptscan.report.json import write_json
        from ckptscan.report.watch_rows import markdown_rows

        if self.json_path is not None:
            write_json(event.report, self.json_path, self.per_head)
        summary_path = self.markdown_summary or os.environ.get("GITHUB_STEP_SUMMARY")
        if summary_path:
            try:
                with Path(summary_path).open("a", encoding="utf-8") as f:
                    f.write(markdown_rows(event.report, event.new))
            except OSError as e:
                raise CkptScanError(f"cannot append the Markdown summary: {e.strerror or e}",
                                    path=summary_path) from None
        write_tensorboard_output(event.report, self.tensorboard, quiet)
        write_service_outputs(event.report, self.wandb, self.mlflow, self.mlflow_experiment, self.notify,
                              self.notify_on, quiet)


@dataclass(frozen=True)
class WatchDestinations:
    """watch's destinations while it runs: WatchOutputs, and the Prometheus
    endpoint that lives as long as the watch (closed however it ends)."""

    outputs: WatchOutputs
    metrics: MetricsServer | None

    def write(self, event: WatchEvent, quiet: bool) -> None:
        """WatchOutputs.write, then the gauges of the newest report."""
        from ckptscan.report.destinations import deliver

        self.outputs.write(event, quiet)
        if self.metrics is not None:
            deliver("--metrics-port", self.metrics.update, event.report)

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()


@dataclass(frozen=True)
class RenderOutputs:
    """`ckptscan report`'s destinations, in its --help order: renderings of a
    saved report, with no stdout report and no gate."""

    html: Path | None
    png: Path | None
    tensorboard: Path | None
    junit: Path | None
    wandb: str | None
    mlflow: str | None
    mlflow_experiment: str

    def check(self) -> None:
        if all(v is None for v in (self.html, self.png, self.tensorboard, self.junit, self.wandb, self.mlflow)):
            raise CkptScanError("nothing to write: give --html FILE and/or --png DIR "
                                "(or --tensorboard DIR, --junit FILE, --wandb PROJECT, --mlflow URI)")
        check_file_outputs({"--html": self.html, "--junit": self.junit})
        check_figure_outputs(self.html, self.png)
        check_tensorboard_output(self.tensorboard)
        check_service_outputs(self.wandb, self.mlflow)

    def write(self, saved: ScanReport, fail_on: str, quiet: bool) -> None:
        """`fail_on`: the severity that fails a JUnit test case."""
        from ckptscan.report.junit import junit_xml, write_junit

        write_figure_outputs(saved, self.html, self.png, quiet)
        write_tensorboard_output(saved, self.tensorboard, quiet)
        if self.junit is not None:
            write_junit(junit_xml(saved, fail_on), self.junit)
            note(f"wrote {self.junit}", quiet=quiet)
        write_service_outputs(saved, self.wandb, self.mlflow, self.mlflow_experiment, quiet=quiet)


@dataclass(frozen=True)
class SweepOutputs:
    """A sweep's destinations (`compare`, `trend SWEEP/`): the ranking on
    stdout (or the sweep's JSON, `as_json`), --json and --html."""

    json_path: Path | None
    html: Path | None
    per_head: str = "all"  # which layers of each run's report keep their per-head results
    as_json: bool = False

    def write(self, sweep: SweepReport) -> None:
        """The ranking (stdout; stderr when the JSON report goes to stdout), then --json and --html."""
        from ckptscan.output import STDOUT, own_descriptor, write_output
        from ckptscan.report.json import sweep_dict, write_sweep_json
        from ckptscan.report.sweep_table import print_sweep

        json_to_stdout = self.json_path is not None and own_descriptor(str(self.json_path)) == 1
        if self.as_json and not json_to_stdout:
            import json

            write_output(STDOUT, json.dumps(sweep_dict(sweep, self.per_head), indent=2, allow_nan=False) + "\n")
        elif not self.as_json:
            console = report_console(stderr=True) if json_to_stdout else out()
            print_sweep(console, sweep)
            console.file.flush()
        if self.json_path is not None:
            write_sweep_json(sweep, self.json_path, self.per_head)
            if not json_to_stdout:
                wrote(self.json_path)
        if self.html is not None:
            from ckptscan.report.load import as_json_values
            from ckptscan.report.sweep_html import write_sweep_html

            # Through a JSON round trip: the page `ckptscan report SWEEP.json --html` makes of the file.
            write_sweep_html(as_json_values(sweep_dict(sweep)), self.html)
            wrote(self.html)


def fails(report: ScanReport, fail_on: FailOn | str) -> bool:
    """Whether the verdict reaches the gate level."""
    from ckptscan.results import reaches

    return reaches(report.summary.status, FailOn(fail_on).value)


def gate(report: ScanReport, fail_on: FailOn | str, allow_corrupt: bool = False) -> int:
    """Exit code of the CI gate, with the reason printed either way. A run
    with a corrupt checkpoint skipped fails whatever its verdict (a nightly
    gate must not pass over a damaged checkpoint), unless `allow_corrupt`."""
    from ckptscan.discovery import CORRUPT

    failed = fails(report, fail_on)
    corrupt = [item for item in report.skipped if item.get("kind") == CORRUPT]
    flags = f"--fail-on {FailOn(fail_on).value}"
    if corrupt:
        first = corrupt[0]["reason"]  # a reader's message, which starts with the path
        more = f" and {len(corrupt) - 1} more" if len(corrupt) > 1 else ""
        if not allow_corrupt:
            err().print(f"gate failed ({flags}): corrupt checkpoint skipped: {first}{more}; without it: "
                        f"{report.summary.message} (--allow-corrupt passes over it)", highlight=False)
            return EXIT_GATE
        flags += f", --allow-corrupt: {len(corrupt)} corrupt checkpoint(s) skipped"
    verdict = "failed" if failed else "passed"
    err().print(f"gate {verdict} ({flags}): {report.summary.message}", highlight=False)
    return EXIT_GATE if failed else EXIT_OK


def emit(report: ScanReport, output: Format | str, json_path: Path | None, markdown_path: Path | None,
         print_table: Callable[[Console, ScanReport], None], junit_path: Path | None = None,
         fail_on: FailOn | str = FailOn.not_judged, per_head: str = "all") -> None:
    """The report on stdout in the chosen format, the JSON and JUnit files, the
    Markdown summary (appended to --markdown-summary, else to $GITHUB_STEP_SUMMARY
    when set), and GitHub annotations on stderr when GITHUB_ACTIONS=true.
    `fail_on` (the gate level) decides what a JUnit failure and an error annotation are;
    `per_head`, which layers keep their per-head results in the JSON (`report_dict`).

    `--json -` puts the JSON report on stdout, alone, for a pipe; the chosen
    format then goes to stderr (nothing more for --format json).
    """

    from ckptscan.output import STDOUT, own_descriptor, write_output
    from ckptscan.report.annotations import github_annotations
    from ckptscan.report.json import report_json, write_json
    from ckptscan.report.junit import junit_xml, write_junit
    from ckptscan.report.markdown import append_markdown, markdown_report

    output, fail_on = Format(output), FailOn(fail_on).value
    junit = junit_xml(report, fail_on) if output is Format.junit or junit_path is not None else ""
    json_to_stdout = json_path is not None and own_descriptor(str(json_path)) == 1
    text_path = "/dev/stderr" if json_to_stdout else STDOUT
    try:
        if output is Format.json and not json_to_stdout:
            write_output(STDOUT, report_json(report, per_head))
        elif output is Format.markdown:
            write_output(text_path, markdown_report(report))
        elif output is Format.junit:
            write_output(text_path, junit)
        elif output is Format.table:
            console = report_console(stderr=True) if json_to_stdout else out()
            print_table(console, report)
            console.file.flush()
    except OSError as e:
        where = "stdout" if text_path == STDOUT else text_path
        raise CkptScanError(f"cannot write the report: {e.strerror or e}", path=where) from None
    if json_path is not None:
        write_json(report, json_path, per_head)
        if not json_to_stdout:
            wrote(json_path)
    if junit_path is not None:
        write_junit(junit, junit_path)
        wrote(junit_path)
    if os.environ.get("GITHUB_ACTIONS") == "true":
        # Raw lines: the runner must see each command whole, unwrapped and unstyled.
        sys.stderr.write("".join(line + "\n" for line in github_annotations(report, fail_on)))
        sys.stderr.flush()
    summary_path = markdown_path or os.environ.get("GITHUB_STEP_SUMMARY")
    if summary_path:
        try:
            append_markdown(report, summary_path)
        except OSError as e:
            raise CkptScanError(f"cannot append the Markdown summary: {e.strerror or e}", path=summary_path) from None
        wrote(summary_path)


def check_file_outputs(files: dict[str, Path | None]) -> None:
    """Before any long scan: a file destination ({flag: path}) that is a directory cannot be
    written; found now, not after the scan has printed its verdict (exit 2)."""
    from ckptscan.output import own_descriptor

    for flag, path in files.items():
        if path is not None and own_descriptor(str(path)) is None and Path(path).is_dir():
            raise CkptScanError(f"{flag} needs a file, and this is a directory", path=path)


def check_figure_outputs(html: Path | None, png: Path | None) -> None:
    """Before any long scan: figures asked for need matplotlib (exit 2 with the fix)."""
    if html is not None or png is not None:
        from ckptscan.report.figures import require_matplotlib

        require_matplotlib()


def write_figure_outputs(report: ScanReport, html: Path | None, png: Path | None, quiet: bool,
                         per_head: str = "all") -> None:
    """--html / --png: the same rendering for a report just made and for one
    read back from its JSON file (`ckptscan report`): the dict that --json
    writes under the same --per-head."""
    if html is None and png is None:
        return
    from ckptscan.report.html import write_report_files
    from ckptscan.report.json import report_dict

    for path in write_report_files(report_dict(report, per_head), html, png):
        wrote(path)
        note(f"wrote {path}", quiet=quiet)


def check_tensorboard_output(directory: Path | None) -> None:
    """Before any long scan: --tensorboard needs the tensorboard package."""
    if directory is not None:
        from ckptscan.report.tensorboard import require_tensorboard

        require_tensorboard()


def write_tensorboard_output(report: ScanReport, directory: Path | None, quiet: bool) -> None:
    """--tensorboard: append the report's new steps to the event files in `directory`
    (only steps not yet in them)."""
    if directory is None:
        return
    from ckptscan.report.tensorboard import write_tensorboard

    written, present = write_tensorboard(report, directory)
    note(f"tensorboard: {written} new step(s) written to {directory}, {present} already there", quiet=quiet)


def check_service_outputs(wandb: str | None, mlflow: str | None, notify: str | None = None,
                          notify_on: str = "warn,alert") -> None:
    """Before any long scan: each service asked for has its package, and a
    well-formed target (exit 2 with the fix). Whether it answers is known
    only when it is written to."""
    if wandb is not None:
        from ckptscan.report.wandb import parse_target, require_wandb

        parse_target(wandb)
        require_wandb()
    if mlflow is not None:
        from ckptscan.report.mlflow import require_mlflow

        require_mlflow()
        check_mlflow_uri(mlflow)
    if notify is not None:
        from ckptscan.report.notify import Notifier

        Notifier(notify, notify_events(notify_on))  # checks the URL's scheme and the events


def notify_events(notify_on: str) -> tuple[str, ...]:
    """--notify-on 'warn,alert' -> ('warn', 'alert')."""
    return tuple(event.strip() for event in notify_on.split(",") if event.strip())


def check_mlflow_uri(uri: str) -> None:
    """A tracking URI whose scheme MLflow has no store for (a typo, a missing
    plugin) is a usage error, found before the scan."""
    from mlflow.exceptions import MlflowException
    # MLflow's own registry of store schemes, plugins included (no public
    # function answers "is this a tracking URI" without connecting).
    from mlflow.tracking._tracking_service.utils import _tracking_store_registry

    try:
        _tracking_store_registry.get_store_builder(uri)
    except MlflowException:
        raise CkptScanError(f"--mlflow: {uri!r} is not a tracking URI MLflow can use "
                            "(http(s)://HOST, databricks, sqlite:///FILE, a directory)") from None


def write_service_outputs(report: ScanReport, wandb: str | None, mlflow: str | None, mlflow_experiment: str,
                          notify: str | None = None, notify_on: str = "warn,alert", quiet: bool = False) -> None:
    """--wandb, --mlflow, --notify: each through `deliver` (a failure is one
    line on stderr, and the scan's exit code and JSON stay as they are)."""
    if wandb is None and mlflow is None and notify is None:
        return
    from ckptscan.report.destinations import deliver

    if wandb is not None and (steps := deliver("--wandb", write_wandb_unprompted, report, wandb)) is not None:
        note(f"wandb: {steps[0]} new step(s) written to {wandb}, {steps[1]} already there", quiet=quiet)
    if mlflow is not None:
        from ckptscan.report.mlflow import write_mlflow

        if (steps := deliver("--mlflow", write_mlflow, report, mlflow, mlflow_experiment)) is not None:
            note(f"mlflow: {steps[0]} new step(s) written to {mlflow} ({mlflow_experiment}), {steps[1]} already "
                 "there", quiet=quiet)
    if notify is not None:
        from ckptscan.report.notify import write_notify

        for notice in deliver("--notify", write_notify, report, notify, notify_events(notify_on)) or ():
            note(f"notify: posted the first {notice.kind} ({notice.family}, step {notice.step})", quiet=quiet)


def write_wandb_unprompted(report: ScanReport, target: str) -> tuple[int, int]:
    """`write_wandb`, never waiting at a login prompt: wandb.init asks for an
    API key in a terminal when it finds none, which would hold a nightly job
    or a watch forever. Online with no credentials, the destination fails."""
    import wandb

    from ckptscan.report.wandb import write_wandb

    # Silent: wandb's login and sync chatter is not the scan's stderr.
    settings = wandb.setup(wandb.Settings(silent=True)).settings
    if not (settings._offline or settings._noop) and not wandb.login(prompt=False, verify=False):
        raise CkptScanError("no W&B credentials: set WANDB_API_KEY, run `wandb login`, or WANDB_MODE=offline")
    return write_wandb(report, target)
