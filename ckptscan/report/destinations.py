"""What every destination of a report shares: the protocol (`Destination`:
check its target before the scan, write after; `Delivery`: what a write is
given), and, for the services beside the report files (W&B, MLflow, a
webhook), which run a report is of, a stable id for it, and what a failure
costs.

A destination is a service the scan does not depend on: one that fails (no
network, a bad URI, a full disk, a server error) costs one line on stderr,
and the scan's exit code and JSON report stay what the checkpoints say.
`deliver` is that rule, around each `write_<destination>` call.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Generic, Sequence, TextIO, TypeVar

from ckptscan.errors import CkptScanError

if TYPE_CHECKING:  # the commands import this module at start-up: no torch (results) before a scan
    from rich.console import Console

    from ckptscan.schema.results import ScanReport

T = TypeVar("T")
R = TypeVar("R")  # what is delivered: a ScanReport, or a sweep's SweepReport
# A failure line is one line; an exception's text can be a page (a server's HTML error body).
MAX_REASON_CHARS = 300


def require_package(module: str, flag: str, package: str, extra: str) -> None:
    """Before any long scan: an output flag whose package is missing is exit 2
    with the fix, rather than a failure after the scan."""
    try:
        importlib.import_module(module)
    except ImportError:
        raise CkptScanError(f"{flag} needs the {package} package: pip install 'ckptscan[{extra}]'") from None


def run_location(report: ScanReport) -> str:
    """The run the report is of: its directory as an absolute path, or its
    URL (s3://, hf://, ...); for `diff`, the two checkpoints compared."""
    run = report.settings.get("run")
    if run:
        return str(run) if "://" in str(run) else os.path.abspath(str(run))
    if report.pairs:
        return " ".join(p if "://" in p else os.path.abspath(p)
                        for p in (report.pairs[0].from_path, report.pairs[-1].to_path))
    return report.command


def run_key(report: ScanReport) -> str:
    """A stable id of the run: the same run location gives the same id on every
    re-run (a nightly scan finds its W&B or MLflow run again by it). 16 hex
    characters, a valid W&B run id."""
    return hashlib.sha256(run_location(report).encode()).hexdigest()[:16]


def deliver(destination: str, write: Callable[..., T], *args: object, stderr: TextIO | None = None,
            **kwargs: object) -> T | None:
    """`write(*args, **kwargs)`; should it fail, one line on stderr naming the
    destination and why, and None. Ctrl-C still interrupts (130)."""
    try:
        return write(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - any failure of a destination is reported, never raised
        reason = " ".join(str(e).split()) or type(e).__name__
        if len(reason) > MAX_REASON_CHARS:
            reason = reason[:MAX_REASON_CHARS - 1] + "…"
        print(f"ckptscan: {destination} not updated: {reason}", file=stderr or sys.stderr, flush=True)
        return None


@dataclass
class Delivery(Generic[R]):
    """What each destination is given once the report is judged: `report`, a
    `ScanReport` (a command's, a watch's, live mode's) or a sweep's
    `SweepReport` (`Delivery[SweepReport]`)."""

    report: R
    fail_on: str  # the gate level: what fails a JUnit case, what is an error annotation
    quiet: bool
    # How the command draws its report as a table (diff's and trend's differ).
    print_table: Callable[[Console, R], None] | None = None
    # A watch's pairs judged since its last delivery; None: a whole report at once.
    new: Sequence[int] | None = None
    # Each file written is named on stderr (`ckptscan report`, whose files are all it makes).
    announce: bool = False
    _junit: str | None = field(default=None, repr=False)

    def junit(self: Delivery[ScanReport]) -> str:
        """The JUnit XML of the report, made once: stdout and --junit get one
        document (one timestamp)."""
        if self._junit is None:
            from ckptscan.report.junit import junit_xml

            self._junit = junit_xml(self.report, self.fail_on)
        return self._junit


class Destination:
    """One place a report goes. `check` runs before the scan (what it needs
    installed, a well-formed target: exit 2 with the fix), `open` before the
    first write (a port to listen on), `write` after each judged report,
    `close` however the command ends."""

    flag: ClassVar[str]  # the option that asks for it

    def named(self) -> list[str]:
        """The flags the user gave for it (a destination with a default
        target, such as $GITHUB_STEP_SUMMARY, names none when defaulted)."""
        return [self.flag]

    def check(self) -> None:
        """Nothing to check unless the destination says so."""

    def open(self, quiet: bool) -> None:
        """Nothing to open unless the destination says so."""

    def write(self, delivery: Delivery[Any]) -> None:
        raise NotImplementedError(type(self).__name__)

    def close(self) -> None:
        """Nothing to close unless the destination says so."""
