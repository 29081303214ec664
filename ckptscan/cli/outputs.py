"""Where a report goes, and the exit code it makes: every destination a
command writes (stdout in --format, --json, --junit, --markdown-summary,
GitHub annotations, --html, --png, --tensorboard) and the gate.

Each group below is a command's set of destinations, as options
(`cli.options.shared_options` spreads a group's fields into flags, in field
order): `ReportOutputs` for diff and trend, `WatchOutputs` for watch (written
again after each judged pair), `RenderOutputs` for `ckptscan report` (a saved
report). A group checks, before any long scan, that what its destinations
need is installed, then writes them all. Every write goes through
`ckptscan.output`; a failed one is one line and exit 2.

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

    from ckptscan.results import ScanReport
    from ckptscan.watch import WatchEvent


@dataclass(frozen=True)
class ReportOutputs:
    """diff's and trend's destinations, in their --help order."""

    json_path: Path | None
    junit: Path | None
    tensorboard: Path | None
    format: Format
    markdown_summary: Path | None
    html: Path | None
    png: Path | None

    def check(self) -> None:
        check_figure_outputs(self.html, self.png)
        check_tensorboard_output(self.tensorboard)

    def write(self, report: ScanReport, fail_on: FailOn | str, print_table: Callable[[Console, ScanReport], None],
              quiet: bool, allow_corrupt: bool = False) -> int:
        """Every destination, then the gate's line on stderr; returns its exit code."""
        emit(report, self.format, self.json_path, self.markdown_summary, print_table, self.junit, fail_on)
        write_figure_outputs(report, self.html, self.png, quiet)
        write_tensorboard_output(report, self.tensorboard, quiet)
        return gate(report, fail_on, allow_corrupt)


@dataclass(frozen=True)
class WatchOutputs:
    """watch's destinations, in its --help order: they follow the run."""

    json_path: Path | None
    markdown_summary: Path | None
    tensorboard: Path | None

    def check(self) -> None:
        check_tensorboard_output(self.tensorboard)

    def write(self, event: WatchEvent, quiet: bool) -> None:
        """After each judged pair, before its rows are printed (a printed row's
        pair is in them): the whole series in the JSON report, the new rows
        appended to the Markdown summary, the new steps to TensorBoard."""
        from ckptscan.report.json import write_json
        from ckptscan.report.watch_rows import markdown_rows

        if self.json_path is not None:
            write_json(event.report, self.json_path)
        summary_path = self.markdown_summary or os.environ.get("GITHUB_STEP_SUMMARY")
        if summary_path:
            try:
                with Path(summary_path).open("a", encoding="utf-8") as f:
                    f.write(markdown_rows(event.report, event.new))
            except OSError as e:
                raise CkptScanError(f"cannot append the Markdown summary: {e.strerror or e}",
                                    path=summary_path) from None
        write_tensorboard_output(event.report, self.tensorboard, quiet)


@dataclass(frozen=True)
class RenderOutputs:
    """`ckptscan report`'s destinations, in its --help order: renderings of a
    saved report, with no stdout report and no gate."""

    html: Path | None
    png: Path | None
    tensorboard: Path | None
    junit: Path | None

    def check(self) -> None:
        if self.html is None and self.png is None and self.tensorboard is None and self.junit is None:
            raise CkptScanError("nothing to write: give --html FILE and/or --png DIR "
                                "(or --tensorboard DIR, --junit FILE)")
        check_figure_outputs(self.html, self.png)
        check_tensorboard_output(self.tensorboard)

    def write(self, saved: ScanReport, fail_on: str, quiet: bool) -> None:
        """`fail_on`: the severity that fails a JUnit test case."""
        from ckptscan.report.junit import junit_xml, write_junit

        write_figure_outputs(saved, self.html, self.png, quiet)
        write_tensorboard_output(saved, self.tensorboard, quiet)
        if self.junit is not None:
            write_junit(junit_xml(saved, fail_on), self.junit)
            note(f"wrote {self.junit}", quiet=quiet)


def fails(report: ScanReport, fail_on: FailOn | str) -> bool:
    """Whether the verdict reaches the gate level."""
    from ckptscan.results import SEVERITIES

    status = report.summary.status
    return status in SEVERITIES and SEVERITIES.index(status) >= SEVERITIES.index(FailOn(fail_on).value)


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
         fail_on: FailOn | str = FailOn.alert) -> None:
    """The report on stdout in the chosen format, the JSON and JUnit files, the
    Markdown summary (appended to --markdown-summary, else to $GITHUB_STEP_SUMMARY
    when set), and GitHub annotations on stderr when GITHUB_ACTIONS=true.
    `fail_on` (the gate level) decides what a JUnit failure and an error annotation are.

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
            write_output(STDOUT, report_json(report))
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
        write_json(report, json_path)
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


def check_figure_outputs(html: Path | None, png: Path | None) -> None:
    """Before any long scan: figures asked for need matplotlib (exit 2 with the fix)."""
    if html is not None or png is not None:
        from ckptscan.report.figures import require_matplotlib

        require_matplotlib()


def write_figure_outputs(report: ScanReport, html: Path | None, png: Path | None, quiet: bool) -> None:
    """--html / --png: the same rendering for a report just made and for one
    read back from its JSON file (`ckptscan report`)."""
    if html is None and png is None:
        return
    from ckptscan.report.html import write_report_files
    from ckptscan.report.json import report_dict

    for path in write_report_files(report_dict(report), html, png):
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
