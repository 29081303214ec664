"""A destination is one module: this one, declared here alone (its option and
its write, on the protocol of `report.destinations`), is offered by trend's
group, shows in `trend --help` with its flag, help and metavar, and a real
`ckptscan trend` run writes it, after the registered destinations. No other
file is touched."""

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Optional

from typer.testing import CliRunner

from ckptscan.cli import app
from ckptscan.cli.destinations.common import Asked, check_file_outputs
from ckptscan.cli.options import Group, Option
from ckptscan.cli.outputs import TrendOutputs
from ckptscan.report.destinations import Delivery

from run_factory import write_run

runner = CliRunner()

VERDICT_FILE: Option[Path | None] = Option("verdict_file", "--verdict-file", Optional[Path], None, metavar="FILE",
                                           help="Write the verdict alone, one word, here.")


@dataclass
class VerdictFile(Asked):
    flag: ClassVar[str] = "--verdict-file"
    options = (VERDICT_FILE,)
    path: Path

    @classmethod
    def asked(cls, given: Group) -> "VerdictFile | None":
        path = given[VERDICT_FILE]
        return None if path is None else cls(path)

    def check(self) -> None:
        check_file_outputs({self.flag: self.path})

    def write(self, delivery: Delivery) -> None:
        self.path.write_text(f"{delivery.report.summary.status} {len(delivery.report.pairs)}\n")


def test_a_destination_declared_in_one_module_is_an_option_of_trend_and_is_written(tmp_path):
    run = write_run(tmp_path / "run", count=4)
    target, report = tmp_path / "verdict.txt", tmp_path / "r.json"
    assert "--verdict-file" not in runner.invoke(app, ["trend", "--help"]).output
    with TrendOutputs.offering(VerdictFile):
        help_text = runner.invoke(app, ["trend", "--help"]).output
        result = runner.invoke(app, ["trend", str(run), "--no-cache", "--json", str(report), "--verdict-file",
                                     str(target)])
        refused = runner.invoke(app, ["trend", str(run), "--no-cache", "--verdict-file", str(tmp_path)])
    assert "--verdict-file FILE" in help_text and "Write the verdict alone, one word, here." in help_text
    assert result.exit_code in (0, 1), result.output
    import json

    written = json.loads(report.read_text())
    assert target.read_text() == f"{written['summary']['status']} {len(written['pairs'])}\n"
    # Its check runs before the scan, as every file destination's.
    assert refused.exit_code == 2 and "--verdict-file needs a file, and this is a directory" in refused.stderr
    # Withdrawn when the block ends: trend is as it was.
    assert "--verdict-file" not in runner.invoke(app, ["trend", "--help"]).output
    assert VerdictFile not in TrendOutputs.members
