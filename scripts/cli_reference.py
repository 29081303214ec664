"""Write docs/cli.md, the CLI reference, from the app itself.

Each command's page section is exactly what `ckptscan COMMAND --help` prints
(click's formatter at a fixed width of 100 columns, so the file does not
depend on the terminal that ran this). tests/docs/test_cli_reference.py fails
when the committed file differs from what this renders:

    python scripts/cli_reference.py          # rewrite docs/cli.md
"""

from __future__ import annotations

import sys
from pathlib import Path

import click
import typer

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "docs" / "cli.md"
WIDTH = 100


def help_text(command: click.Command, name: str, parent: click.Context | None = None) -> str:
    context = click.Context(command, info_name=name, parent=parent, terminal_width=WIDTH, max_content_width=WIDTH)
    return command.get_help(context)


def render() -> str:
    sys.path.insert(0, str(ROOT))
    from ckptscan.cli import app

    group = typer.main.get_command(app)
    root = click.Context(group, info_name="ckptscan", terminal_width=WIDTH, max_content_width=WIDTH)
    parts = [
        "# CLI reference",
        "",
        "Generated from the app by `python scripts/cli_reference.py`: each section is the command's",
        "`--help`. Exit codes, for every command: **0** healthy, **1** the gate failed (the verdict reached",
        "`--fail-on`, its reason printed), **2** a usage, input or internal error (one line; `ckptscan --debug`",
        "shows an internal error's traceback), **130** interrupted; a reader of stdout that stops early",
        "(`| head`) changes none of them.",
        "",
        "## ckptscan",
        "",
        "```text",
        help_text(group, "ckptscan"),
        "```",
    ]
    for name in group.list_commands(root):
        parts += ["", f"## ckptscan {name}", "", "```text", help_text(group.get_command(root, name), name, root), "```"]
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    TARGET.write_text(render())
    print(f"wrote {TARGET.relative_to(ROOT)}")
