"""--html FILE / --png DIR: the same rendering for a report just made and for
one read back from its JSON file (`ckptscan report`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Optional

from ckptscan.cli.app import note, wrote
from ckptscan.cli.destinations.common import Asked, check_file_outputs
from ckptscan.cli.destinations.json_file import PER_HEAD
from ckptscan.cli.options import Group, Option
from ckptscan.report.destinations import Delivery

HTML: Option[Path | None] = Option(
    "html", "--html", Optional[Path], None, metavar="FILE", help="Write a self-contained HTML report with figures "
    "here (needs matplotlib: pip install 'ckptscan[report]').")
PNG: Option[Path | None] = Option("png", "--png", Optional[Path], None, metavar="DIR",
                                  help="Write the report's figures as PNG files into this directory.")


@dataclass
class Figures(Asked):
    """--html / --png: the same rendering for a report just made and for one
    read back from its JSON file (`ckptscan report`): the dict that --json
    writes under the same --per-head."""

    flag: ClassVar[str] = "--html"
    options = (HTML, PNG)
    html: Path | None
    png: Path | None
    per_head: str

    @classmethod
    def asked(cls, given: Group) -> Figures | None:
        html, png = given[HTML], given[PNG]
        if html is None and png is None:
            return None
        return cls(html, png, given.get(PER_HEAD, "all"))

    def named(self) -> list[str]:
        return [flag for flag, value in (("--html", self.html), ("--png", self.png)) if value is not None]

    def check(self) -> None:
        from ckptscan.report.figures import require_matplotlib

        check_file_outputs({"--html": self.html})
        require_matplotlib()

    def write(self, delivery: Delivery) -> None:
        from ckptscan.report.html_page import write_report_files
        from ckptscan.document.plain import report_dict

        for path in write_report_files(report_dict(delivery.report, self.per_head), self.html, self.png):
            wrote(path)
            note(f"wrote {path}", quiet=delivery.quiet)
