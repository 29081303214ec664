"""--tensorboard DIR: the report's new steps appended to the event files in
the directory (only steps not yet in them)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Optional

from ckptscan.cli.app import note
from ckptscan.cli.destinations.common import Asked
from ckptscan.cli.options import Group, Option
from ckptscan.report.destinations import Delivery

TENSORBOARD: Option[Path | None] = Option(
    "tensorboard", "--tensorboard", Optional[Path], None, metavar="DIR", help="Append the monitors, per-family "
    "summaries and findings to TensorBoard event files in this directory (new steps only; needs pip install "
    "'ckptscan[tensorboard]').")


@dataclass
class TensorBoardEvents(Asked):
    """--tensorboard: the report's new steps appended to the event files in
    the directory (only steps not yet in them)."""

    flag: ClassVar[str] = "--tensorboard"
    options = (TENSORBOARD,)
    directory: Path

    @classmethod
    def asked(cls, given: Group) -> TensorBoardEvents | None:
        directory = given[TENSORBOARD]
        return None if directory is None else cls(directory)

    def check(self) -> None:
        from ckptscan.report.tensorboard import require_tensorboard

        require_tensorboard()

    def write(self, delivery: Delivery) -> None:
        from ckptscan.report.tensorboard import write_tensorboard

        written, present = write_tensorboard(delivery.report, self.directory)
        note(f"tensorboard: {written} new step(s) written to {self.directory}, {present} already there",
             quiet=delivery.quiet)
