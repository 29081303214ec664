"""`ckptscan report REPORT.json --html out.html`: the HTML page, figures,
TensorBoard events and JUnit XML of a saved JSON report, without reading any
checkpoint again."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ckptscan.cli.app import command, note, user_errors
from ckptscan.cli.destinations.figures import HTML
from ckptscan.cli.destinations.junit_file import JUNIT
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
        "alert).")] = None,
    quiet,
) -> None:
    """Render a saved JSON report as an HTML page, PNG figures, TensorBoard events and/or JUnit XML."""
    with user_errors():
        from ckptscan.pipeline.config import load_config
        from ckptscan.errors import CkptScanError
        from ckptscan.document.reading import read_json_file, report_from_dict
        from ckptscan.schema.results import DEFAULT_FAIL_ON

        outputs.check()
        data = read_json_file(report_json)
        if isinstance(data, dict) and data.get("command") == "compare":  # a sweep's report (ckptscan compare --json)
            from ckptscan.report.sweep_html import write_sweep_html

            others = [flag for destination in outputs.destinations() for flag in destination.named()
                      if flag != "--html"]
            html = outputs[HTML]
            if others or html is None:
                raise CkptScanError(f"a sweep's report renders as --html FILE only (not {', '.join(others) or 'none'}"
                                    "; each run's own: ckptscan trend RUN)", path=report_json)
            write_sweep_html(data, html)
            note(f"wrote {html}", quiet=quiet)
            return
        # The config is read only when it matters (a bad one must not stop an HTML rendering).
        level = DEFAULT_FAIL_ON
        if fail_on:
            level = FailOn(fail_on).value
        elif outputs[JUNIT] is not None:
            config = load_config()
            if config.source is not None:  # a config that changes the verdict is named, as trend names it
                note(f"using config {config.source}", quiet=quiet)
            level = config.fail_on
        outputs.write(report_from_dict(data, report_json), level, quiet)
