"""--format: the report on stdout as a table, JSON, Markdown or JUnit XML; on
stderr when `--json -` has stdout (nothing more for --format json)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ckptscan.cli.app import out, report_console
from ckptscan.cli.destinations.common import Asked, json_to_stdout
from ckptscan.cli.destinations.json_file import JSON, PER_HEAD
from ckptscan.cli.options import DEFAULT_PER_HEAD, Format, Group, Option
from ckptscan.errors import CkptScanError
from ckptscan.report.destinations import Delivery

FORMAT: Option[Format] = Option("format", "--format", Format, Format.table,
                                help="Report on stdout as a table, JSON, Markdown or JUnit XML.")


@dataclass
class StdoutReport(Asked):
    """The report on stdout in --format; on stderr when `--json -` has
    stdout (nothing more for --format json)."""

    flag: ClassVar[str] = "--format"
    options = (FORMAT,)
    format: Format
    per_head: str
    json_to_stdout: bool

    @classmethod
    def asked(cls, given: Group) -> StdoutReport:
        return cls(Format(given[FORMAT]), given.get(PER_HEAD, DEFAULT_PER_HEAD), json_to_stdout(given.get(JSON, None)))

    def named(self) -> list[str]:
        return [] if self.format is Format.table else [f"--format {self.format.value}"]

    def write(self, delivery: Delivery) -> None:
        from ckptscan.system.output import STDOUT, write_output
        from ckptscan.document.writing import report_json
        from ckptscan.report.markdown import markdown_report

        report, text_path = delivery.report, "/dev/stderr" if self.json_to_stdout else STDOUT
        try:
            if self.format is Format.json and not self.json_to_stdout:
                write_output(STDOUT, report_json(report, self.per_head))
            elif self.format is Format.markdown:
                write_output(text_path, markdown_report(report))
            elif self.format is Format.junit:
                write_output(text_path, delivery.junit())
            elif self.format is Format.table and delivery.print_table is not None:
                console = report_console(stderr=True) if self.json_to_stdout else out()
                delivery.print_table(console, report)
                console.file.flush()
        except OSError as e:
            where = "stdout" if text_path == STDOUT else text_path
            raise CkptScanError(f"cannot write the report: {e.strerror or e}", path=where) from None
