"""A shared option is declared once (ckptscan.cli.options.SHARED, or beside
its destination: `Option`): a command names it as a bare parameter, and a
group-typed parameter stands for its destinations' options, handed to the
command as one instance."""

from pathlib import Path
from typing import Annotated

import pytest
import typer
from typer.testing import CliRunner

from ckptscan.cli import app
from ckptscan.cli.destinations.registry import DESTINATIONS
from ckptscan.cli.options import SHARED, shared_options
from ckptscan.cli.outputs import WatchOutputs

runner = CliRunner()


def one_command_app(function) -> typer.Typer:
    toy = typer.Typer(rich_markup_mode=None)
    toy.command()(shared_options(function))
    toy.callback()(lambda: None)  # keep `toy run ...` a subcommand, as in ckptscan
    return toy


def test_bare_parameters_and_groups_become_the_shared_options_in_signature_order():
    received = {}

    def run(path: Annotated[str, typer.Argument()], *, quiet, outputs: WatchOutputs,
            limit: Annotated[int, typer.Option("--limit")] = 3) -> None:
        received.update(path=path, quiet=quiet, outputs=outputs, limit=limit)

    toy = one_command_app(run)
    result = runner.invoke(toy, ["run", "ckpt", "--json", "r.json", "-q", "--tensorboard", "tb"])
    assert result.exit_code == 0, result.output
    assert received == {"path": "ckpt", "quiet": True, "limit": 3,
                        "outputs": WatchOutputs(json_path=Path("r.json"), per_head="flagged+newest", markdown_summary=None,
                                                tensorboard=Path("tb"), wandb=None, mlflow=None,
                                                mlflow_experiment="ckptscan", notify=None, notify_on="warn,alert",
                                                metrics_port=None, metrics_addr="127.0.0.1")}
    help_text = runner.invoke(toy, ["run", "--help"]).output
    flags = ["--quiet", "--json", "--markdown-summary", "--tensorboard", "--limit"]
    assert sorted(flags, key=help_text.index) == flags


def test_a_bare_parameter_that_is_no_shared_option_is_refused_when_declared():
    def run(*, quite) -> None:
        pass

    with pytest.raises(TypeError, match="'quite' is not a shared option"):
        shared_options(run)


def test_every_command_takes_a_shared_flag_with_its_one_declaration():
    declared = {}
    annotations = [annotation for annotation, _ in SHARED.values()]
    annotations += [option.annotation for kind in DESTINATIONS for option in kind.options]
    for annotation in annotations:
        option = annotation.__metadata__[0]
        declared.setdefault(option.default, set()).add(option.help)
    # The commands' own variants of a shared flag are the only other declarations.
    variants = {("inspect", "--format"), ("diff", "--probe"), ("diff", "--loss-log"), ("report", "--fail-on")}
    for command in typer.main.get_group(app).commands.values():
        for parameter in command.params:
            for flag in set(parameter.opts) & declared.keys():
                assert (command.name, flag) in variants or parameter.help in declared[flag], (command.name, flag)
