"""--html FILE of a sweep (`compare`, `trend SWEEP/`): the page `ckptscan
report SWEEP.json --html` makes of its JSON report."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from ckptscan.cli.app import note, wrote
from ckptscan.cli.destinations.common import Asked, check_file_outputs
from ckptscan.cli.destinations.figures import HTML
from ckptscan.cli.options import Group
from ckptscan.report.destinations import Delivery

if TYPE_CHECKING:
    from ckptscan.schema.results import SweepReport


@dataclass
class SweepPage(Asked):
    """--html: the sweep's page, through a JSON round trip of its report."""

    flag: ClassVar[str] = "--html"
    options = (HTML,)
    path: Path

    @classmethod
    def asked(cls, given: Group) -> SweepPage | None:
        path = given[HTML]
        return None if path is None else cls(path)

    def check(self) -> None:
        check_file_outputs({self.flag: self.path})

    def write(self, delivery: Delivery[SweepReport]) -> None:
        from ckptscan.document.sweep import sweep_dict
        from ckptscan.report.sweep_html import write_sweep_html
        from ckptscan.document.reading import as_json_values

        # Through a JSON round trip: the page `ckptscan report SWEEP.json --html` makes of the file.
        write_sweep_html(as_json_values(sweep_dict(delivery.report)), self.path)
        wrote(self.path)
        note(f"wrote {self.path}", quiet=delivery.quiet)
