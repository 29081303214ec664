"""docs/cli.md is what the app's --help says today (scripts/cli_reference.py
renders it from the typer app; rerun it after changing a command)."""

import importlib.util

from docs.examples import ROOT


def load_generator():
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "scripts" / "cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_cli_reference_is_the_apps_help():
    generator = load_generator()
    assert generator.TARGET.read_text() == generator.render(), "docs/cli.md is stale: run python scripts/cli_reference.py"


def test_the_reference_has_every_command_and_its_options():
    text = (ROOT / "docs" / "cli.md").read_text()
    for command in ("diff", "trend", "inspect", "report", "watch"):
        assert f"## ckptscan {command}\n" in text
    assert "--fail-on" in text and "--executor" in text
