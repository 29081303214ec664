"""--junit FILE: one test case per layer and family, failing at the gate level."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Optional

from ckptscan.cli.app import note, wrote
from ckptscan.cli.destinations.common import Asked, check_file_outputs
from ckptscan.cli.options import Group, Option
from ckptscan.report.destinations import Delivery

JUNIT: Option[Path | None] = Option(
    "junit", "--junit", Optional[Path], None, metavar="FILE", help="Write a JUnit XML report here (atomically; '-' "
    "for stdout): one test case per layer and family, failing at the gate level.")


@dataclass
class JunitFile(Asked):
    """--junit: one test case per layer and family, failing at the gate level."""

    flag: ClassVar[str] = "--junit"
    options = (JUNIT,)
    path: Path

    @classmethod
    def asked(cls, given: Group) -> JunitFile | None:
        path = given[JUNIT]
        return None if path is None else cls(path)

    def check(self) -> None:
        check_file_outputs({self.flag: self.path})

    def write(self, delivery: Delivery) -> None:
        from ckptscan.report.junit import write_junit
        from ckptscan.system.output import own_descriptor

        write_junit(delivery.junit(), self.path)
        if own_descriptor(str(self.path)) is None:  # a file, not '-' (stdout) or a descriptor
            wrote(self.path)
            note(f"wrote {self.path}", quiet=delivery.quiet)
