"""Live mode's resume plan as text (`OUT/resume.txt`), on the destinations'
protocol (`report.destinations`): written once the report alerts, and again
whenever the plan changes (the lines `ckptscan trend` prints: the rollback
candidate, the steps to skip, the learning rate to go back to)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from ckptscan.report.destinations import Delivery, Destination
from ckptscan.report.resume import terminal_lines
from ckptscan.system.atomic import write_atomic

if TYPE_CHECKING:
    from ckptscan.schema.results import ScanReport

log = logging.getLogger("ckptscan.live")


class ResumePlanFile(Destination):
    """The plan of each delivered report, when it is new or changed. A failed
    write is a warning on the `ckptscan.live` logger, as the report file's:
    a full disk must not end the training run."""

    flag = "resume.txt"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines: list[str] = []  # the plan's lines in the file (the scan's thread)

    def write(self, delivery: Delivery[ScanReport]) -> None:
        summary = delivery.report.summary
        lines = terminal_lines(summary) if summary.resume is not None else []
        if not lines or lines == self.lines:
            return
        try:
            write_atomic(self.path, "\n".join(lines) + "\n")
        except OSError as e:
            log.warning("ckptscan: cannot write the resume plan: %s (%s)", e.strerror or e, self.path)
            return
        self.lines = lines
