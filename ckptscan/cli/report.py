"""`ckptscan report REPORT.json --html out.html`: the HTML page and figures of
a saved JSON report, without reading any checkpoint again."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ckptscan.cli.app import JunitOut, Quiet, TensorBoardDir, app, err, load_settings, user_errors
from ckptscan.errors import CkptScanError
from ckptscan.report.figures import require_matplotlib
from ckptscan.report.html import write_report_files
from ckptscan.report.json import report_dict
from ckptscan.report.junit import GATE_LEVELS, junit_xml, write_junit
from ckptscan.report.load import read_report, report_from_dict
from ckptscan.report.tensorboard import require_tensorboard, write_tensorboard
from ckptscan.results import ScanReport

# No "[report]" in help texts: rich would take it for markup and drop it.
HtmlOut = typer.Option(None, "--html", help="Write a self-contained HTML report with figures here "
                       "(needs matplotlib, ckptscan's 'report' extra).")
PngDir = typer.Option(None, "--png", help="Write the report's figures as PNG files into this directory.")


@app.command()
def report(
    report_json: Path = typer.Argument(..., help="JSON report written by ckptscan trend/diff --json."),
    html: Optional[Path] = HtmlOut,
    png: Optional[Path] = PngDir,
    tensorboard: Optional[Path] = TensorBoardDir,
    junit: Optional[Path] = JunitOut,
    fail_on: Optional[str] = typer.Option(None, "--fail-on", help="The severity that fails a JUnit test case, "
                                          "'warn' or 'alert' (default: fail_on from the config, else alert)."),
    quiet: bool = Quiet,
) -> None:
    """Render a saved JSON report as an HTML page, PNG figures, TensorBoard events and/or JUnit XML."""
    with user_errors():
        if html is None and png is None and tensorboard is None and junit is None:
            raise CkptScanError("nothing to write: give --html FILE and/or --png DIR "
                                "(or --tensorboard DIR, --junit FILE)")
        check_figure_outputs(html, png)
        check_tensorboard_output(tensorboard)
        # The config is read only when it matters (a bad one must not stop an HTML rendering).
        level = fail_on or (load_settings(None, None).fail_on if junit is not None else "alert")
        if level not in GATE_LEVELS:
            raise CkptScanError(f"--fail-on must be 'warn' or 'alert', not {level!r}")
        data = read_report(report_json)
        if html is not None or png is not None:
            _announce(write_report_files(data, html, png), quiet)
        if tensorboard is not None or junit is not None:
            report = report_from_dict(data, report_json)
            write_tensorboard_output(report, tensorboard, quiet)
            if junit is not None:
                write_junit(junit_xml(report, level), junit)
                _announce([junit], quiet)


def check_figure_outputs(html: Path | None, png: Path | None) -> None:
    """Before any long scan: figures asked for need matplotlib (exit 2 with the fix)."""
    if html is not None or png is not None:
        require_matplotlib()


def write_figure_outputs(report: ScanReport, html: Path | None, png: Path | None, quiet: bool) -> None:
    """--html / --png of a command that has just made `report`: the same
    rendering as `ckptscan report` of its JSON file."""
    if html is not None or png is not None:
        _announce(write_report_files(report_dict(report), html, png), quiet)


def check_tensorboard_output(directory: Path | None) -> None:
    """Before any long scan: --tensorboard needs the tensorboard package."""
    if directory is not None:
        require_tensorboard()


def write_tensorboard_output(report: ScanReport, directory: Path | None, quiet: bool) -> None:
    """--tensorboard: append the report's new steps to the event files in `directory`."""
    if directory is None:
        return
    written, present = write_tensorboard(report, directory)
    if not quiet:
        err.print(f"tensorboard: {written} new step(s) written to {directory}, {present} already there",
                  highlight=False, style="dim")


def _announce(written: list[Path], quiet: bool) -> None:
    if not quiet:
        for path in written:
            err.print(f"wrote {path}", highlight=False, style="dim")
