"""`ckptscan report REPORT.json --html out.html`: the HTML page and figures of
a saved JSON report, without reading any checkpoint again."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ckptscan.cli.app import Quiet, app, err, user_errors
from ckptscan.errors import CkptScanError
from ckptscan.report.figures import require_matplotlib
from ckptscan.report.html import write_report_files
from ckptscan.report.json import report_dict
from ckptscan.report.load import read_report
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
    quiet: bool = Quiet,
) -> None:
    """Render a saved JSON report as an HTML page and/or PNG figures."""
    with user_errors():
        if html is None and png is None:
            raise CkptScanError("nothing to write: give --html FILE and/or --png DIR")
        check_figure_outputs(html, png)
        _announce(write_report_files(read_report(report_json), html, png), quiet)


def check_figure_outputs(html: Path | None, png: Path | None) -> None:
    """Before any long scan: figures asked for need matplotlib (exit 2 with the fix)."""
    if html is not None or png is not None:
        require_matplotlib()


def write_figure_outputs(report: ScanReport, html: Path | None, png: Path | None, quiet: bool) -> None:
    """--html / --png of a command that has just made `report`: the same
    rendering as `ckptscan report` of its JSON file."""
    if html is not None or png is not None:
        _announce(write_report_files(report_dict(report), html, png), quiet)


def _announce(written: list[Path], quiet: bool) -> None:
    if not quiet:
        for path in written:
            err.print(f"wrote {path}", highlight=False, style="dim")
