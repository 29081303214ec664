"""Configuration examples on the pages are the defaults, as the code has them, or say what they change
and why; and a config file that a run reads is named on stderr."""

import re
import sys

from typer.testing import CliRunner

from ckptscan.cli import app
from ckptscan.pipeline.config import Config
from ckptscan.detection.thresholds import Thresholds

from docs.examples import ROOT, blocks, documents

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DEFAULTS = {**Thresholds().as_dict(), "fail_on": Config().fail_on}


def settings(text: str) -> dict:
    """A config example's ckptscan keys: `[tool.ckptscan]` of a pyproject.toml, or a ckptscan.toml's top level."""
    data = tomllib.loads(text)
    return dict(data["tool"]["ckptscan"]) if "tool" in data else data


def config_examples() -> list:
    return [b for page in documents() for b in blocks(page) if b.lang == "toml"
            and ("[tool.ckptscan]" in b.text or set(settings(b.text)) & set(DEFAULTS))]


def test_the_ci_gate_config_example_is_the_defaults():
    page = (ROOT / "docs" / "guides" / "ci-gate.md").read_text()
    example = re.search(r"```toml\n(.*?)```", page, re.S)[1]
    table = settings(example)
    assert {key: DEFAULTS[key] for key in table} == table
    assert len(table) >= 10  # the gate and the thresholds a user is likely to change


def test_a_config_example_that_changes_a_default_says_why_on_its_line():
    examples = config_examples()
    assert examples  # the CI gate guide's, at least
    for block in examples:
        table = settings(block.text)
        assert set(table) <= set(DEFAULTS), f"{block.where}: unknown keys {set(table) - set(DEFAULTS)}"
        for key, value in table.items():
            if value != DEFAULTS[key]:
                line = next(line for line in block.text.splitlines() if line.strip().startswith(f"{key} "))
                assert "#" in line, f"{block.where}: {key} = {value!r} is not the default: say why on its line"


def test_a_config_file_found_by_searching_is_named_on_stderr(tmp_path, monkeypatch):
    (tmp_path / ".git").mkdir()  # the search stops here
    (tmp_path / "ckptscan.toml").write_text("alert_sigma = 5.0\n")
    monkeypatch.chdir(tmp_path)
    run = str(ROOT / "sample_checkpoints" / "healthy")
    named = CliRunner().invoke(app, ["trend", run, "--stride", "10", "--no-cache"])
    assert named.exit_code == 0, named.output
    assert f"using config {tmp_path / 'ckptscan.toml'}\n" in named.stderr
    (tmp_path / "ckptscan.toml").unlink()
    unnamed = CliRunner().invoke(app, ["trend", run, "--stride", "10", "--no-cache"])
    assert "using config" not in unnamed.stderr
