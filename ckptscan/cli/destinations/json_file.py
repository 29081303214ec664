"""--json FILE: the whole report (for a watch, the series judged so far),
atomically; --per-head, which layers keep their per-head results in it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Optional

from ckptscan.cli.app import note, wrote
from ckptscan.cli.destinations.common import Asked, check_file_outputs, json_to_stdout
from ckptscan.cli.options import DEFAULT_PER_HEAD, Group, Option
from ckptscan.report.destinations import Delivery

JSON: Option[Path | None] = Option(
    "json_path", "--json", Optional[Path], None, metavar="FILE", help="Write the JSON report here (atomically; '-' "
    "for stdout, the table then going to stderr).")
PER_HEAD: Option[str] = Option(
    "per_head", "--per-head", str, DEFAULT_PER_HEAD, metavar="flagged+newest|all|flagged|newest",
    help="Which layers keep their per-head results in the JSON report: flagged+newest (the default: layers at warn "
    "or alert, and the newest pair's), all, flagged or newest. They are most of a long run's report (a report over "
    "2,000 layer and head results is also written without indentation; FILE.json.gz: gzip).")


@dataclass
class JsonFile(Asked):
    """--json: the whole report (for a watch, the series judged so far), atomically."""

    flag: ClassVar[str] = "--json"
    options = (JSON, PER_HEAD)
    path: Path
    per_head: str

    @classmethod
    def asked(cls, given: Group) -> JsonFile | None:
        path = given[JSON]
        return None if path is None else cls(path, given[PER_HEAD])

    def check(self) -> None:
        check_file_outputs({self.flag: self.path})

    def write(self, delivery: Delivery) -> None:
        from ckptscan.document.writing import write_json

        write_json(delivery.report, self.path, self.per_head)
        if delivery.new is None and not json_to_stdout(self.path):
            wrote(self.path)
            note(f"wrote {self.path}", quiet=delivery.quiet)
