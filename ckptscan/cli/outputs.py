"""The groups of output options of each command, and what they write: a
group is a command's tuple of destinations (`cli.destinations.registry`),
whose options `cli.options.shared_options` spreads into flags, in member
order. `ReportOutputs` for diff, `TrendOutputs` for trend, `WatchOutputs`
for watch (written again after each judged pair), `RenderOutputs` for
`ckptscan report` (a saved report), `SweepOutputs` for a sweep's ranking. A
command checks its group, then writes what was asked (in the registry's
order), then gates (`cli.gate`).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterator

from ckptscan.cli.destinations import registry
from ckptscan.cli.destinations.common import Asked
from ckptscan.cli.destinations.json_file import PER_HEAD
from ckptscan.cli.gate import gate
from ckptscan.cli.options import FailOn, Group
from ckptscan.errors import CkptScanError
from ckptscan.report.destinations import Delivery, Destination

if TYPE_CHECKING:
    from rich.console import Console

    from ckptscan.schema.results import ScanReport, SweepReport


class Outputs(Group):
    """What the groups share: ask for what was given, check it, open it, write a report."""

    members: ClassVar[tuple[type[Asked], ...]] = ()

    @classmethod
    def written(cls) -> list[type[Asked]]:
        """The members in the order they are written: the registry's, then any other (`Group.offering`)."""
        return [kind for kind in registry.DESTINATIONS if kind in cls.members] + \
            [kind for kind in cls.members if kind not in registry.DESTINATIONS]

    def destinations(self) -> list[Destination]:
        """The destinations the values ask for, in write order."""
        return [destination for kind in self.written() if (destination := kind.asked(self)) is not None]

    def check(self) -> None:
        if PER_HEAD in self:
            from ckptscan.document.plain import check_per_head

            check_per_head(self[PER_HEAD])
        for destination in self.destinations():
            destination.check()

    def open(self, quiet: bool) -> Destinations:
        return Destinations(self.destinations(), quiet)

    def deliver(self, delivery: Delivery[Any]) -> None:
        """Every destination asked for, once."""
        with _closing(self.open(delivery.quiet)) as destinations:
            destinations.write(delivery)


class ReportOutputs(Outputs):
    """diff's destinations (and the first of trend's)."""

    members = registry.REPORT

    def write(self, report: ScanReport, fail_on: FailOn | str, print_table: Callable[[Console, ScanReport], None],
              quiet: bool, allow_corrupt: bool = False) -> int:
        """Every destination, then the gate's line on stderr; returns its exit code."""
        self.deliver(Delivery(report, FailOn(fail_on).value, quiet, print_table))
        return gate(report, fail_on, allow_corrupt)


class TrendOutputs(ReportOutputs):
    """trend's destinations: diff's, then the services that follow a run."""

    members = registry.TREND


class WatchOutputs(Outputs):
    """watch's destinations: they follow the run. After each judged pair,
    before its rows are printed (a printed row's pair is in them): the whole
    series in the JSON report, the new rows appended to the Markdown
    summary, the new steps to TensorBoard, then the services (W&B and MLflow
    get the new steps; --notify posts a first warning or alert once), then
    the gauges of the newest report."""

    members = registry.WATCH


class RenderOutputs(Outputs):
    """`ckptscan report`'s destinations: renderings of a saved report, with no
    stdout report and no gate."""

    members = registry.RENDER

    def check(self) -> None:
        if not self.destinations():
            raise CkptScanError("nothing to write: give --html FILE and/or --png DIR "
                                "(or --tensorboard DIR, --junit FILE, --wandb PROJECT, --mlflow URI)")
        super().check()

    def write(self, saved: ScanReport, fail_on: str, quiet: bool) -> None:
        """`fail_on`: the severity that fails a JUnit test case."""
        self.deliver(Delivery(saved, fail_on, quiet, announce=True))


class SweepOutputs(Outputs):
    """A sweep's destinations (`compare`, `trend SWEEP/`): the ranking on
    stdout (or the sweep's JSON, with --format json), --json and --html, each
    file named on stderr as it is written (not with `quiet`)."""

    members = registry.SWEEP

    def check(self) -> None:
        """The files only: --per-head is checked by `cli.compare.judge_sweep`, before any scan."""
        for destination in self.destinations():
            destination.check()

    def write(self, sweep: SweepReport, quiet: bool = False) -> None:
        self.deliver(Delivery(sweep, sweep.fail_on, quiet))


class Destinations:
    """The destinations of one command while it runs: opened once, written
    after each judged report, closed however the command ends."""

    def __init__(self, destinations: list[Destination], quiet: bool) -> None:
        self.destinations = destinations
        for destination in destinations:
            destination.open(quiet)

    def write(self, delivery: Delivery[Any]) -> None:
        for destination in self.destinations:
            destination.write(delivery)

    def close(self) -> None:
        for destination in self.destinations:
            destination.close()


@contextmanager
def _closing(destinations: Destinations) -> Iterator[Destinations]:
    try:
        yield destinations
    finally:
        destinations.close()
