"""The configuration example of docs/guides/ci-gate.md shows the defaults, as the code has them."""

import re
import sys

from ckptscan.config import Config
from ckptscan.detection.thresholds import Thresholds

from docs.examples import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def test_the_ci_gate_config_example_is_the_defaults():
    page = (ROOT / "docs" / "guides" / "ci-gate.md").read_text()
    example = re.search(r"```toml\n(.*?)```", page, re.S)[1]
    table = dict(tomllib.loads(example)["tool"]["ckptscan"])
    assert table.pop("fail_on") == Config().fail_on
    defaults = Thresholds().as_dict()
    assert {key: defaults[key] for key in table} == table
