"""A sweep's ranking (`compare`, `trend SWEEP/`) on stdout, as a table or, with
--format json, as the sweep's JSON; on stderr when `--json -` has stdout."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from ckptscan.cli.app import out, report_console
from ckptscan.cli.destinations.common import Asked, json_to_stdout
from ckptscan.cli.destinations.json_file import JSON, PER_HEAD
from ckptscan.cli.destinations.stdout_report import FORMAT
from ckptscan.cli.options import Format, Group
from ckptscan.report.destinations import Delivery

if TYPE_CHECKING:
    from ckptscan.schema.results import SweepReport


@dataclass
class SweepRanking(Asked):
    """The ranking on stdout (stderr when the JSON report goes to stdout), or
    the sweep's JSON there (`as_json`: `trend SWEEP/ --format json`)."""

    flag: ClassVar[str] = "--format"
    as_json: bool
    per_head: str
    json_to_stdout: bool

    @classmethod
    def asked(cls, given: Group) -> SweepRanking:
        return cls(given.get(FORMAT, Format.table) is Format.json, given.get(PER_HEAD, "all"),
                   json_to_stdout(given.get(JSON, None)))

    def named(self) -> list[str]:
        return ["--format json"] if self.as_json else []

    def write(self, delivery: Delivery[SweepReport]) -> None:
        from ckptscan.system.output import STDOUT, write_output
        from ckptscan.document.sweep import sweep_dict
        from ckptscan.report.sweep_table import print_sweep

        if self.as_json and not self.json_to_stdout:
            import json

            write_output(STDOUT, json.dumps(sweep_dict(delivery.report, self.per_head), indent=2, allow_nan=False)
                         + "\n")
        elif not self.as_json:
            console = report_console(stderr=True) if self.json_to_stdout else out()
            print_sweep(console, delivery.report)
            console.file.flush()
