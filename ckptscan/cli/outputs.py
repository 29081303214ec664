"""The groups of output options of each command, and what they write: a
group is a command's set of destinations (`cli.options.shared_options`
spreads its fields into flags, in field order). `ReportOutputs` for diff,
`TrendOutputs` for trend, `WatchOutputs` for watch (written again after
each judged pair), `RenderOutputs` for `ckptscan report` (a saved report),
`SweepOutputs` for a sweep's ranking. A command checks its group, then
writes what was asked (`cli.destinations`), then gates (`cli.gate`).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, ClassVar, Iterator

from ckptscan.cli.app import note, out, report_console, wrote
from ckptscan.cli.destinations import Destinations, asked, json_to_stdout
from ckptscan.cli.gate import gate
from ckptscan.cli.options import FailOn, Format
from ckptscan.errors import CkptScanError
from ckptscan.report.destinations import Delivery, Destination

if TYPE_CHECKING:
    from rich.console import Console

    from ckptscan.schema.results import ScanReport, SweepReport


class Outputs:
    """What the groups share: check what they ask for, open it, write a report."""

    def destinations(self) -> list[Destination]:
        return asked(self)

    def check(self) -> None:
        per_head = getattr(self, "per_head", None)
        if per_head is not None:
            from ckptscan.document.plain import check_per_head

            check_per_head(per_head)
        for destination in self.destinations():
            destination.check()

    def open(self, quiet: bool) -> Destinations:
        return Destinations(self.destinations(), quiet)

    def deliver(self, delivery: Delivery) -> None:
        """Every destination asked for, once."""
        with _closing(self.open(delivery.quiet)) as destinations:
            destinations.write(delivery)


@dataclass(frozen=True)
class ReportOutputs(Outputs):
    """diff's destinations (and the first of trend's), in their --help order."""

    annotations: ClassVar[bool] = True  # GitHub annotations accompany the report
    json_path: Path | None
    per_head: str
    junit: Path | None
    tensorboard: Path | None
    format: Format
    markdown_summary: Path | None
    html: Path | None
    png: Path | None

    def write(self, report: ScanReport, fail_on: FailOn | str, print_table: Callable[[Console, ScanReport], None],
              quiet: bool, allow_corrupt: bool = False) -> int:
        """Every destination, then the gate's line on stderr; returns its exit code."""
        self.deliver(Delivery(report, FailOn(fail_on).value, quiet, print_table))
        return gate(report, fail_on, allow_corrupt)


@dataclass(frozen=True)
class TrendOutputs(ReportOutputs):
    """trend's destinations: diff's, then the services that follow a run."""

    wandb: str | None
    mlflow: str | None
    mlflow_experiment: str
    notify: str | None
    notify_on: str


@dataclass(frozen=True)
class WatchOutputs(Outputs):
    """watch's destinations, in its --help order: they follow the run. After
    each judged pair, before its rows are printed (a printed row's pair is in
    them): the whole series in the JSON report, the new rows appended to the
    Markdown summary, the new steps to TensorBoard, then the services (W&B
    and MLflow get the new steps; --notify posts a first warning or alert
    once), then the gauges of the newest report."""

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


@dataclass(frozen=True)
class RenderOutputs(Outputs):
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
        if not self.destinations():
            raise CkptScanError("nothing to write: give --html FILE and/or --png DIR "
                                "(or --tensorboard DIR, --junit FILE, --wandb PROJECT, --mlflow URI)")
        super().check()

    def write(self, saved: ScanReport, fail_on: str, quiet: bool) -> None:
        """`fail_on`: the severity that fails a JUnit test case."""
        self.deliver(Delivery(saved, fail_on, quiet, announce=True))


@contextmanager
def _closing(destinations: Destinations) -> Iterator[Destinations]:
    try:
        yield destinations
    finally:
        destinations.close()


@dataclass(frozen=True)
class SweepOutputs:
    """A sweep's destinations (`compare`, `trend SWEEP/`): the ranking on
    stdout (or the sweep's JSON, `as_json`), --json and --html."""

    json_path: Path | None
    html: Path | None
    per_head: str = "all"  # which layers of each run's report keep their per-head results
    as_json: bool = False

    def write(self, sweep: SweepReport, quiet: bool = False) -> None:
        """The ranking (stdout; stderr when the JSON report goes to stdout), then --json and --html, each file
        named on stderr as it is written (not with `quiet`)."""
        from ckptscan.system.output import STDOUT, write_output
        from ckptscan.document.sweep import sweep_dict, write_sweep_json
        from ckptscan.report.sweep_table import print_sweep

        to_stdout = json_to_stdout(self.json_path)
        if self.as_json and not to_stdout:
            import json

            write_output(STDOUT, json.dumps(sweep_dict(sweep, self.per_head), indent=2, allow_nan=False) + "\n")
        elif not self.as_json:
            console = report_console(stderr=True) if to_stdout else out()
            print_sweep(console, sweep)
            console.file.flush()
        if self.json_path is not None:
            write_sweep_json(sweep, self.json_path, self.per_head)
            if not to_stdout:
                wrote(self.json_path)
                note(f"wrote {self.json_path}", quiet=quiet)
        if self.html is not None:
            from ckptscan.document.reading import as_json_values
            from ckptscan.report.sweep_html import write_sweep_html

            # Through a JSON round trip: the page `ckptscan report SWEEP.json --html` makes of the file.
            write_sweep_html(as_json_values(sweep_dict(sweep)), self.html)
            wrote(self.html)
            note(f"wrote {self.html}", quiet=quiet)
