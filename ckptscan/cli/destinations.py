"""The destinations a report is written to: stdout in --format, --json,
--junit, --markdown-summary, GitHub annotations, --html, --png,
--tensorboard; the services --wandb, --mlflow, --notify and watch's
--metrics-port.

Each destination is one `Destination` (`report.destinations`): it checks
its target before any long scan (what it needs installed, a well-formed
target: exit 2 with the fix), and writes after. `DESTINATIONS` registers
them once, in the order they are written; each takes from a command's
group of options (`cli.outputs`) what it needs, and is asked when its flag
was given. Every file write goes through `ckptscan.system.output`; a failed
one is one line and exit 2. A service is not a file the user asked for but
a place the scan is also shown: each is written through
`report.destinations.deliver`, so one that fails (no network, a bad store,
a full disk) is one line on stderr and changes neither the exit code nor
the JSON report.

A new destination (say --wandb) is: its option in `cli.options` (a
declaration and its `SHARED` entry, under the field's name), a field in the
groups of the commands that offer it (`cli.outputs`: where the field stands
is where --help lists it), and one `Destination` here with its line in
`DESTINATIONS`. The commands themselves do not change.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ckptscan.cli.app import note, out, report_console, wrote
from ckptscan.cli.options import Format
from ckptscan.errors import CkptScanError
from ckptscan.report.destinations import Delivery, Destination

if TYPE_CHECKING:
    from ckptscan.report.prometheus import MetricsServer
    from ckptscan.schema.results import ScanReport


def json_to_stdout(json_path: Path | None) -> bool:
    """`--json -`: the JSON report alone on stdout, for a pipe."""
    from ckptscan.system.output import own_descriptor

    return json_path is not None and own_descriptor(str(json_path)) == 1


@dataclass
class StdoutReport(Destination):
    """The report on stdout in --format; on stderr when `--json -` has
    stdout (nothing more for --format json)."""

    flag: ClassVar[str] = "--format"
    format: Format
    per_head: str
    json_to_stdout: bool

    @classmethod
    def asked(cls, outputs: Any) -> StdoutReport | None:
        if getattr(outputs, "format", None) is None:
            return None
        return cls(Format(outputs.format), outputs.per_head, json_to_stdout(outputs.json_path))

    def named(self) -> list[str]:
        return [] if self.format is Format.table else [f"--format {self.format.value}"]

    def write(self, delivery: Delivery) -> None:
        from ckptscan.system.output import STDOUT, write_output
        from ckptscan.document.writing import report_json
        from ckptscan.report.markdown import markdown_report

        report, text_path = delivery.report, "/dev/stderr" if self.json_to_stdout else STDOUT
        try:
            if self.format is Format.json and not self.json_to_stdout:
                write_output(STDOUT, report_json(report, self.per_head))
            elif self.format is Format.markdown:
                write_output(text_path, markdown_report(report))
            elif self.format is Format.junit:
                write_output(text_path, delivery.junit())
            elif self.format is Format.table and delivery.print_table is not None:
                console = report_console(stderr=True) if self.json_to_stdout else out()
                delivery.print_table(console, report)
                console.file.flush()
        except OSError as e:
            where = "stdout" if text_path == STDOUT else text_path
            raise CkptScanError(f"cannot write the report: {e.strerror or e}", path=where) from None


@dataclass
class JsonFile(Destination):
    """--json: the whole report (for a watch, the series judged so far), atomically."""

    flag: ClassVar[str] = "--json"
    path: Path
    per_head: str

    @classmethod
    def asked(cls, outputs: Any) -> JsonFile | None:
        path = getattr(outputs, "json_path", None)
        return None if path is None else cls(path, outputs.per_head)

    def check(self) -> None:
        check_file_outputs({self.flag: self.path})

    def write(self, delivery: Delivery) -> None:
        from ckptscan.document.writing import write_json

        write_json(delivery.report, self.path, self.per_head)
        if delivery.new is None and not json_to_stdout(self.path):
            wrote(self.path)
            note(f"wrote {self.path}", quiet=delivery.quiet)


@dataclass
class JunitFile(Destination):
    """--junit: one test case per layer and family, failing at the gate level."""

    flag: ClassVar[str] = "--junit"
    path: Path

    @classmethod
    def asked(cls, outputs: Any) -> JunitFile | None:
        path = getattr(outputs, "junit", None)
        return None if path is None else cls(path)

    def check(self) -> None:
        check_file_outputs({self.flag: self.path})

    def write(self, delivery: Delivery) -> None:
        from ckptscan.report.junit import write_junit
        from ckptscan.system.output import own_descriptor

        write_junit(delivery.junit(), self.path)
        if own_descriptor(str(self.path)) is None:  # a file, not '-' (stdout) or a descriptor
            wrote(self.path)
            note(f"wrote {self.path}", quiet=delivery.quiet)


@dataclass
class Annotations(Destination):
    """GitHub annotations on stderr, when GITHUB_ACTIONS=true (a report's
    commands only: `annotations` in their group)."""

    flag: ClassVar[str] = "GITHUB_ACTIONS"

    @classmethod
    def asked(cls, outputs: Any) -> Annotations | None:
        return cls() if getattr(outputs, "annotations", False) else None

    def named(self) -> list[str]:
        return []

    def write(self, delivery: Delivery) -> None:
        from ckptscan.report.annotations import github_annotations

        if os.environ.get("GITHUB_ACTIONS") == "true":
            # Raw lines: the runner must see each command whole, unwrapped and unstyled.
            sys.stderr.write("".join(line + "\n" for line in github_annotations(delivery.report, delivery.fail_on)))
            sys.stderr.flush()


@dataclass
class MarkdownSummary(Destination):
    """--markdown-summary (default: $GITHUB_STEP_SUMMARY when set): the
    summary appended; for a watch, its new rows."""

    flag: ClassVar[str] = "--markdown-summary"
    path: Path | None

    @classmethod
    def asked(cls, outputs: Any) -> MarkdownSummary | None:
        return cls(outputs.markdown_summary) if hasattr(outputs, "markdown_summary") else None

    def named(self) -> list[str]:
        return [self.flag] if self.path is not None else []

    def check(self) -> None:
        check_file_outputs({self.flag: self.path})

    def write(self, delivery: Delivery) -> None:
        summary_path = self.path or os.environ.get("GITHUB_STEP_SUMMARY")
        if not summary_path:
            return
        try:
            if delivery.new is None:
                from ckptscan.report.markdown import append_markdown

                append_markdown(delivery.report, summary_path)
            else:
                from ckptscan.report.watch_rows import markdown_rows

                with Path(summary_path).open("a", encoding="utf-8") as f:
                    f.write(markdown_rows(delivery.report, list(delivery.new)))
        except OSError as e:
            raise CkptScanError(f"cannot append the Markdown summary: {e.strerror or e}", path=summary_path) from None
        if delivery.new is None:
            wrote(summary_path)
            if self.path is not None:  # GitHub's own step summary is not a file the user named
                note(f"appended the summary to {summary_path}", quiet=delivery.quiet)


@dataclass
class Figures(Destination):
    """--html / --png: the same rendering for a report just made and for one
    read back from its JSON file (`ckptscan report`): the dict that --json
    writes under the same --per-head."""

    flag: ClassVar[str] = "--html"
    html: Path | None
    png: Path | None
    per_head: str

    @classmethod
    def asked(cls, outputs: Any) -> Figures | None:
        html, png = getattr(outputs, "html", None), getattr(outputs, "png", None)
        if html is None and png is None:
            return None
        return cls(html, png, getattr(outputs, "per_head", "all"))

    def named(self) -> list[str]:
        return [flag for flag, value in (("--html", self.html), ("--png", self.png)) if value is not None]

    def check(self) -> None:
        from ckptscan.report.figures import require_matplotlib

        check_file_outputs({"--html": self.html})
        require_matplotlib()

    def write(self, delivery: Delivery) -> None:
        from ckptscan.report.html import write_report_files
        from ckptscan.document.plain import report_dict

        for path in write_report_files(report_dict(delivery.report, self.per_head), self.html, self.png):
            wrote(path)
            note(f"wrote {path}", quiet=delivery.quiet)


@dataclass
class TensorBoardEvents(Destination):
    """--tensorboard: the report's new steps appended to the event files in
    the directory (only steps not yet in them)."""

    flag: ClassVar[str] = "--tensorboard"
    directory: Path

    @classmethod
    def asked(cls, outputs: Any) -> TensorBoardEvents | None:
        directory = getattr(outputs, "tensorboard", None)
        return None if directory is None else cls(directory)

    def check(self) -> None:
        from ckptscan.report.tensorboard import require_tensorboard

        require_tensorboard()

    def write(self, delivery: Delivery) -> None:
        from ckptscan.report.tensorboard import write_tensorboard

        written, present = write_tensorboard(delivery.report, self.directory)
        note(f"tensorboard: {written} new step(s) written to {self.directory}, {present} already there",
             quiet=delivery.quiet)


@dataclass
class WandbRun(Destination):
    """--wandb PROJECT[/RUN]: the new steps, the verdict and the findings."""

    flag: ClassVar[str] = "--wandb"
    target: str

    @classmethod
    def asked(cls, outputs: Any) -> WandbRun | None:
        target = getattr(outputs, "wandb", None)
        return None if target is None else cls(target)

    def check(self) -> None:
        from ckptscan.report.wandb import parse_target, require_wandb

        parse_target(self.target)
        require_wandb()

    def write(self, delivery: Delivery) -> None:
        from ckptscan.report.destinations import deliver

        if (steps := deliver(self.flag, write_wandb_unprompted, delivery.report, self.target)) is not None:
            note(f"wandb: {steps[0]} new step(s) written to {self.target}, {steps[1]} already there",
                 quiet=delivery.quiet)


@dataclass
class MlflowRun(Destination):
    """--mlflow URI: the new steps' metrics, verdict tags and the reports."""

    flag: ClassVar[str] = "--mlflow"
    uri: str
    experiment: str

    @classmethod
    def asked(cls, outputs: Any) -> MlflowRun | None:
        uri = getattr(outputs, "mlflow", None)
        return None if uri is None else cls(uri, outputs.mlflow_experiment)

    def check(self) -> None:
        from ckptscan.report.mlflow import require_mlflow

        require_mlflow()
        check_mlflow_uri(self.uri)

    def write(self, delivery: Delivery) -> None:
        from ckptscan.report.destinations import deliver
        from ckptscan.report.mlflow import write_mlflow

        if (steps := deliver(self.flag, write_mlflow, delivery.report, self.uri, self.experiment)) is not None:
            note(f"mlflow: {steps[0]} new step(s) written to {self.uri} ({self.experiment}), {steps[1]} already "
                 "there", quiet=delivery.quiet)


@dataclass
class Webhook(Destination):
    """--notify URL: a JSON message at the run's first warning and first alert, once each."""

    flag: ClassVar[str] = "--notify"
    url: str
    events: tuple[str, ...]

    @classmethod
    def asked(cls, outputs: Any) -> Webhook | None:
        url = getattr(outputs, "notify", None)
        return None if url is None else cls(url, notify_events(outputs.notify_on))

    def check(self) -> None:
        from ckptscan.report.notify import Notifier

        Notifier(self.url, self.events)  # checks the URL's scheme and the events

    def write(self, delivery: Delivery) -> None:
        from ckptscan.report.destinations import deliver
        from ckptscan.report.notify import write_notify

        for notice in deliver(self.flag, write_notify, delivery.report, self.url, self.events) or ():
            note(f"notify: posted the first {notice.kind} ({notice.family}, step {notice.step})", quiet=delivery.quiet)


@dataclass
class MetricsEndpoint(Destination):
    """--metrics-port N: Prometheus gauges of the newest report, served for
    as long as the watch runs (a port in use: exit 2 before anything is judged)."""

    flag: ClassVar[str] = "--metrics-port"
    port: int
    addr: str
    server: MetricsServer | None = None

    @classmethod
    def asked(cls, outputs: Any) -> MetricsEndpoint | None:
        port = getattr(outputs, "metrics_port", None)
        return None if port is None else cls(port, outputs.metrics_addr)

    def check(self) -> None:
        from ckptscan.report.prometheus import require_prometheus

        require_prometheus()

    def open(self, quiet: bool) -> None:
        from ckptscan.report.prometheus import MetricsServer

        self.server = MetricsServer(self.port, self.addr)
        note(f"serving metrics on http://{self.addr}:{self.server.port}/metrics", quiet=quiet)

    def write(self, delivery: Delivery) -> None:
        from ckptscan.report.destinations import deliver

        if self.server is not None:
            deliver(self.flag, self.server.update, delivery.report)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


# Every destination, once, in the order a command writes them.
DESTINATIONS: tuple[Any, ...] = (StdoutReport, JsonFile, JunitFile, Annotations, MarkdownSummary, Figures,
                                 TensorBoardEvents, WandbRun, MlflowRun, Webhook, MetricsEndpoint)


def asked(outputs: Any) -> list[Destination]:
    """The destinations a command's group asks for, in write order."""
    return [destination for kind in DESTINATIONS if (destination := kind.asked(outputs)) is not None]


class Destinations:
    """The destinations of one command while it runs: opened once, written
    after each judged report, closed however the command ends."""

    def __init__(self, destinations: list[Destination], quiet: bool) -> None:
        self.destinations = destinations
        for destination in destinations:
            destination.open(quiet)

    def write(self, delivery: Delivery) -> None:
        for destination in self.destinations:
            destination.write(delivery)

    def close(self) -> None:
        for destination in self.destinations:
            destination.close()



def check_file_outputs(files: dict[str, Path | None]) -> None:
    """Before any long scan: a file destination ({flag: path}) that is a directory, or whose
    folder does not exist, cannot be written; found now, not after the scan has printed its
    verdict (exit 2). No folder is created for a report file: a typo in its path is the
    user's to see, not a tree of folders made where they did not look."""
    from ckptscan.system.output import own_descriptor

    for flag, path in files.items():
        if path is None or own_descriptor(str(path)) is not None:
            continue
        if Path(path).is_dir():
            raise CkptScanError(f"{flag} needs a file, and this is a directory", path=path)
        folder = Path(path).parent
        if not folder.is_dir():
            raise CkptScanError(f"{flag}: the folder {folder} does not exist (ckptscan creates no folder for a "
                                "report file: create it first)", path=path)


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
