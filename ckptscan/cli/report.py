"""`ckptscan report REPORT.json --html out.html`: the HTML page, figures,
TensorBoard events and JUnit XML of a saved JSON report, without reading any
checkpoint again."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ckptscan.cli.app import command, user_errors
from ckptscan.cli.options import FailOn
from ckptscan.cli.outputs import RenderOutputs


@command
def report(
    report_json: Annotated[Path, typer.Argument(metavar="REPORT_JSON",
                                                help="JSON report written by ckptscan trend/diff --json.")],
    *,  # the options, in --help order; a bare name is a shared option (cli.options)
    outputs: RenderOutputs,
    fail_on: Annotated[Optional[FailOn], typer.Option(
        "--fail-on", help="The level that fails a JUnit test case (default: fail_on from the config, else "
        "not_judged).")] = None,
    quiet,
) -> None:
    """Render a saved JSON report as an HTML page, PNG figures, TensorBoard events and/or JUnit XML."""
    with user_errors():
        from ckptscan.config import load_config
        from ckptscan.report.load import load_report
        from ckptscan.results import DEFAULT_FAIL_ON

        outputs.check()
        # The config is read only when it matters (a bad one must not stop an HTML rendering).
        level = FailOn(fail_on).value if fail_on else (
            load_config().fail_on if outputs.junit is not None else DEFAULT_FAIL_ON)
        outputs.write(load_report(report_json), level, quiet)
