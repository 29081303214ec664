"""--wandb PROJECT[/RUN]: the new steps, the verdict and the findings, in a
Weights & Biases run (a service: a failure is one line on stderr)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Optional

from ckptscan.cli.app import note
from ckptscan.cli.destinations.common import Asked
from ckptscan.cli.options import Group, Option
from ckptscan.errors import CkptScanError
from ckptscan.report.destinations import Delivery

if TYPE_CHECKING:
    from ckptscan.schema.results import ScanReport

WANDB: Option[str | None] = Option(
    "wandb", "--wandb", Optional[str], None, metavar="PROJECT[/RUN]", help="Append the per-step scalars, the verdict "
    "and the findings to a Weights & Biases run in PROJECT, one per scanned run (RUN names it). Mode and "
    "credentials are W&B's own (WANDB_MODE=offline, WANDB_API_KEY); never asks for a login. Needs pip install "
    "'ckptscan[wandb]'.")


@dataclass
class WandbRun(Asked):
    """--wandb PROJECT[/RUN]: the new steps, the verdict and the findings."""

    flag: ClassVar[str] = "--wandb"
    options = (WANDB,)
    target: str

    @classmethod
    def asked(cls, given: Group) -> WandbRun | None:
        target = given[WANDB]
        return None if target is None else cls(target)

    def check(self) -> None:
        from ckptscan.report.wandb import parse_target, require_wandb

        parse_target(self.target)
        require_wandb()

    def write(self, delivery: Delivery) -> None:
        from ckptscan.report.destinations import deliver

        if (steps := deliver(self.flag, write_wandb_unprompted, delivery.report, self.target)) is not None:
            note(f"wandb: {steps[0]} new step(s) written to {self.target}, {steps[1]} already there",
                 quiet=delivery.quiet)


def write_wandb_unprompted(report: ScanReport, target: str) -> tuple[int, int]:
    """`write_wandb`, never waiting at a login prompt: wandb.init asks for an
    API key in a terminal when it finds none, which would hold a nightly job
    or a watch forever. Online with no credentials, the destination fails."""
    import wandb

    from ckptscan.report.wandb import write_wandb

    # Silent: wandb's login and sync chatter is not the scan's stderr.
    settings = wandb.setup(wandb.Settings(silent=True)).settings
    if not (settings._offline or settings._noop) and not wandb.login(prompt=False, verify=False):
        raise CkptScanError("no W&B credentials: set WANDB_API_KEY, run `wandb login`, or WANDB_MODE=offline")
    return write_wandb(report, target)
