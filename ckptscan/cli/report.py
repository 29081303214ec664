"""`ckptscan report REPORT.json --html out.html`: the HTML page and figures of
a saved JSON report, without reading any checkpoint again."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ckptscan.cli.app import HtmlOut, PngDir, Quiet, app, note, user_errors

if TYPE_CHECKING:
    from ckptscan.results import ScanReport


@app.command()
def report(
    report_json: Annotated[Path, typer.Argument(help="JSON report written by ckptscan trend/diff --json.")],
    html: HtmlOut = None,
    png: PngDir = None,
    quiet: Quiet = False,
) -> None:
    """Render a saved JSON report as an HTML page and/or PNG figures."""
    with user_errors():
        from ckptscan.errors import CkptScanError
        from ckptscan.report.load import load_report

        if html is None and png is None:
            raise CkptScanError("nothing to write: give --html FILE and/or --png DIR")
        check_figure_outputs(html, png)
        write_figure_outputs(load_report(report_json), html, png, quiet)


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
        note(f"wrote {path}", quiet=quiet)
