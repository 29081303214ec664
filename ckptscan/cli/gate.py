"""The CI gate: whether a verdict reaches `--fail-on`, and the exit code
with its one line on stderr."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ckptscan.cli.app import EXIT_GATE, EXIT_OK, err
from ckptscan.cli.options import FailOn

if TYPE_CHECKING:
    from ckptscan.schema.results import ScanReport


def fails(report: ScanReport, fail_on: FailOn | str) -> bool:
    """Whether the verdict reaches the gate level."""
    from ckptscan.schema.results import reaches

    return reaches(report.summary.status, FailOn(fail_on).value)


def gate(report: ScanReport, fail_on: FailOn | str, allow_corrupt: bool = False) -> int:
    """Exit code of the CI gate, with the reason printed either way. A run
    with a corrupt checkpoint skipped fails whatever its verdict (a nightly
    gate must not pass over a damaged checkpoint), unless `allow_corrupt`."""
    from ckptscan.pipeline.discovery import CORRUPT

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
