"""--json FILE of a sweep (`compare`, `trend SWEEP/`): the ranking with every
run's whole report, under --per-head."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from ckptscan.cli.app import note, wrote
from ckptscan.cli.destinations.common import Asked, check_file_outputs, json_to_stdout
from ckptscan.cli.destinations.json_file import JSON, PER_HEAD
from ckptscan.cli.options import Group
from ckptscan.report.destinations import Delivery

if TYPE_CHECKING:
    from ckptscan.schema.results import SweepReport


@dataclass
class SweepJson(Asked):
    """--json: the sweep's report, atomically (named on stderr unless it is stdout)."""

    flag: ClassVar[str] = "--json"
    options = (JSON, PER_HEAD)
    path: Path
    per_head: str

    @classmethod
    def asked(cls, given: Group) -> SweepJson | None:
        path = given[JSON]
        return None if path is None else cls(path, given[PER_HEAD])

    def check(self) -> None:
        check_file_outputs({self.flag: self.path})

    def write(self, delivery: Delivery[SweepReport]) -> None:
        from ckptscan.document.sweep import write_sweep_json

        write_sweep_json(delivery.report, self.path, self.per_head)
        if not json_to_stdout(self.path):
            wrote(self.path)
            note(f"wrote {self.path}", quiet=delivery.quiet)
