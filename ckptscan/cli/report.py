"""`ckptscan report REPORT.json --html out.html`: the HTML page, figures,
TensorBoard events and JUnit XML of a saved JSON report, without reading any
checkpoint again."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from ckptscan.cli.app import FailOn, HtmlOut, JunitOut, PngDir, Quiet, TensorBoardDir, app, note, user_errors

if TYPE_CHECKING:
    from ckptscan.results import ScanReport


@app.command()
def report(
    report_json: Annotated[Path, typer.Argument(help="JSON report written by ckptscan trend/diff --json.")],
    html: HtmlOut = None,
    png: PngDir = None,
    tensorboard: TensorBoardDir = None,
    junit: JunitOut = None,
    fail_on: Annotated[Optional[FailOn], typer.Option(
        "--fail-on", help="The severity that fails a JUnit test case (default: fail_on from the config, else "
        "alert).")] = None,
    quiet: Quiet = False,
) -> None:
    """Render a saved JSON report as an HTML page, PNG figures, TensorBoard events and/or JUnit XML."""
    with user_errors():
        from ckptscan.config import load_config
        from ckptscan.errors import CkptScanError
        from ckptscan.report.junit import junit_xml, write_junit
        from ckptscan.report.load import load_report

        if html is None and png is None and tensorboard is None and junit is None:
            raise CkptScanError("nothing to write: give --html FILE and/or --png DIR "
                                "(or --tensorboard DIR, --junit FILE)")
        check_figure_outputs(html, png)
        check_tensorboard_output(tensorboard)
        # The config is read only when it matters (a bad one must not stop an HTML rendering).
        level = FailOn(fail_on).value if fail_on else (load_config().fail_on if junit is not None else "alert")
        saved = load_report(report_json)
        write_figure_outputs(saved, html, png, quiet)
        write_tensorboard_output(saved, tensorboard, quiet)
        if junit is not None:
            write_junit(junit_xml(saved, level), junit)
            note(f"wrote {junit}", quiet=quiet)


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


def check_tensorboard_output(directory: Path | None) -> None:
    """Before any long scan: --tensorboard needs the tensorboard package."""
    if directory is not None:
        from ckptscan.report.tensorboard import require_tensorboard

        require_tensorboard()


def write_tensorboard_output(report: ScanReport, directory: Path | None, quiet: bool) -> None:
    """--tensorboard: append the report's new steps to the event files in `directory`."""
    if directory is None:
        return
    from ckptscan.report.tensorboard import write_tensorboard

    written, present = write_tensorboard(report, directory)
    note(f"tensorboard: {written} new step(s) written to {directory}, {present} already there", quiet=quiet)
