"""--markdown-summary FILE (default: $GITHUB_STEP_SUMMARY when set): the
summary appended; for a watch, its new rows."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Optional

from ckptscan.cli.app import note, wrote
from ckptscan.cli.destinations.common import Asked, check_file_outputs
from ckptscan.cli.options import Group, Option
from ckptscan.errors import CkptScanError
from ckptscan.report.destinations import Delivery

MARKDOWN_SUMMARY: Option[Path | None] = Option(
    "markdown_summary", "--markdown-summary", Optional[Path], None, metavar="FILE",
    help="Append a Markdown summary here (default: $GITHUB_STEP_SUMMARY when set).")


@dataclass
class MarkdownSummary(Asked):
    """--markdown-summary (default: $GITHUB_STEP_SUMMARY when set): the
    summary appended; for a watch, its new rows."""

    flag: ClassVar[str] = "--markdown-summary"
    options = (MARKDOWN_SUMMARY,)
    path: Path | None

    @classmethod
    def asked(cls, given: Group) -> MarkdownSummary:
        return cls(given[MARKDOWN_SUMMARY])

    def named(self) -> list[str]:
        return [self.flag] if self.path is not None else []

    def check(self) -> None:
        check_file_outputs({self.flag: self.path})

    def write(self, delivery: Delivery) -> None:
        summary_path = self.path or os.environ.get("GITHUB_STEP_SUMMARY")
        if not summary_path:
            return
        try:
            if delivery.new is None:
                from ckptscan.report.markdown import append_markdown

                append_markdown(delivery.report, summary_path)
            else:
                from ckptscan.report.watch_rows import markdown_rows

                with Path(summary_path).open("a", encoding="utf-8") as f:
                    f.write(markdown_rows(delivery.report, list(delivery.new)))
        except OSError as e:
            raise CkptScanError(f"cannot append the Markdown summary: {e.strerror or e}", path=summary_path) from None
        if delivery.new is None:
            wrote(summary_path)
            if self.path is not None:  # GitHub's own step summary is not a file the user named
                note(f"appended the summary to {summary_path}", quiet=delivery.quiet)
