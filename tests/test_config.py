"""Thresholds from ckptscan.toml / pyproject.toml, overridden by --set."""

import pytest

from ckptscan.pipeline.config import find_config, load_config
from ckptscan.detection.rules import Thresholds
from ckptscan.errors import CkptScanError


@pytest.fixture
def repo(tmp_path):
    (tmp_path / ".git").mkdir()  # the search stops at a repository root
    return tmp_path


def test_defaults_without_a_file(repo):
    config = load_config(start=repo)
    assert config.thresholds == Thresholds() and config.fail_on == "alert" and config.source is None


def test_pyproject_table_found_from_a_subdirectory(repo):
    (repo / "pyproject.toml").write_text('[project]\nname = "x"\n\n[tool.ckptscan]\nalert_sigma = 7\n'
                                         'fail_on = "warn"\ndisabled_monitors = ["epsilon"]\n')
    sub = repo / "a" / "b"
    sub.mkdir(parents=True)
    config = load_config(start=sub)
    assert config.thresholds.alert_sigma == 7.0 and isinstance(config.thresholds.alert_sigma, float)
    assert config.thresholds.disabled_monitors == ("epsilon",)
    assert config.fail_on == "warn"
    assert config.source == str(repo / "pyproject.toml")


def test_pyproject_without_the_table_is_skipped(repo):
    (repo / "pyproject.toml").write_text('[project]\nname = "x"\n')
    assert find_config(repo) is None


def test_ckptscan_toml_wins_in_the_same_directory(repo):
    (repo / "pyproject.toml").write_text("[tool.ckptscan]\nalert_sigma = 7\n")
    (repo / "ckptscan.toml").write_text("alert_sigma = 8\nconsecutive = 3\n")
    config = load_config(start=repo)
    assert (config.thresholds.alert_sigma, config.thresholds.consecutive) == (8.0, 3)


def test_search_stops_at_the_repository_root(repo):
    (repo / "ckptscan.toml").write_text("alert_sigma = 8\n")
    inner = repo / "inner"
    (inner / ".git").mkdir(parents=True)
    assert find_config(inner) is None


def test_flags_override_the_file(repo):
    (repo / "ckptscan.toml").write_text("alert_sigma = 8\nwarn_sigma = 3\n")
    config = load_config(start=repo, overrides=["alert_sigma=9", "disabled_monitors=epsilon,load_cv",
                                                "fail_on=warn"])
    assert config.thresholds.alert_sigma == 9.0 and config.thresholds.warn_sigma == 3.0
    assert config.thresholds.disabled_monitors == ("epsilon", "load_cv")
    assert config.fail_on == "warn"


def test_explicit_path(tmp_path):
    path = tmp_path / "gate.toml"
    path.write_text("[tool.ckptscan]\nwarmup_steps = 2000\n")
    assert load_config(path).thresholds.warmup_steps == 2000


@pytest.mark.parametrize("text, message", [
    ("alert_sigm = 5\n", "unknown setting"),
    ("alert_sigma = 'high'\n", "not a valid float"),
    ("consecutive = 2.5\n", "not a valid int"),
    ("consecutive = true\n", "not a valid int"),
    ("fail_on = 'sometimes'\n", "fail_on must be one of"),
    ("alert_sigma = 2\nwarn_sigma = 3\n", "invalid thresholds"),
    ("alert_sigma = \n", "invalid TOML"),
])
def test_bad_files_are_user_errors_naming_the_file(repo, text, message):
    path = repo / "ckptscan.toml"
    path.write_text(text)
    with pytest.raises(CkptScanError, match=message) as info:
        load_config(start=repo)
    assert str(path) in str(info.value)


def test_bad_overrides(repo):
    with pytest.raises(CkptScanError, match="expected KEY=VALUE"):
        load_config(start=repo, overrides=["alert_sigma"])
    with pytest.raises(CkptScanError, match="unknown setting"):
        load_config(start=repo, overrides=["nope=1"])
    with pytest.raises(CkptScanError, match="no such config file"):
        load_config(repo / "missing.toml")
