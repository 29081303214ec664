"""GitHub annotations on stderr, when GITHUB_ACTIONS=true: no flag asks for
them; the groups of the commands that make a report offer them."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import ClassVar

from ckptscan.cli.destinations.common import Asked
from ckptscan.cli.options import Group
from ckptscan.report.destinations import Delivery


@dataclass
class Annotations(Asked):
    """GitHub annotations on stderr, when GITHUB_ACTIONS=true (a report's
    commands only: a member of their group)."""

    flag: ClassVar[str] = "GITHUB_ACTIONS"

    @classmethod
    def asked(cls, given: Group) -> Annotations:
        return cls()

    def named(self) -> list[str]:
        return []

    def write(self, delivery: Delivery) -> None:
        from ckptscan.report.annotations import github_annotations

        if os.environ.get("GITHUB_ACTIONS") == "true":
            # Raw lines: the runner must see each command whole, unwrapped and unstyled.
            sys.stderr.write("".join(line + "\n" for line in github_annotations(delivery.report, delivery.fail_on)))
            sys.stderr.flush()
