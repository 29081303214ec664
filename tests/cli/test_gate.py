"""The CI gate's exit codes: 0 passed, 1 the verdict reached --fail-on (the
reason printed), 2 usage or input errors (one line, no traceback). The
levels, in order: warn < not_judged < alert; the default, alert, fails an
alert only; not_judged also fails a run no pair of which could be judged
(whose verdict says NOT JUDGED whatever the level, never HEALTHY)."""

import pytest
from typer.testing import CliRunner

from ckptscan.cli import app

from run_factory import write_run

runner = CliRunner()
# Alerts become impossible, warnings stay: a run whose verdict is "warn".
ONLY_WARN = ["--set", "alert_sigma=1000", "--set", "cusum_alert=1000", "--set", "pooled_cusum_alert=1000",
             "--set", "delta2_entropy_norm_floor=0"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("gate-runs")
    return {
        "healthy": write_run(root / "healthy", count=12),
        "collapse": write_run(root / "collapse", count=12, collapse_layer=1, collapse_from=800),
        # A freshly started run: its two pairs are the warm-up.
        "fresh": write_run(root / "fresh", count=3),
        # ... whose newest pair has collapsed under the Δ2 entropy floor (normalised 0.17 < 0.2).
        "fresh_collapse": write_run(root / "fresh_collapse", count=3, collapse_layer=0, collapse_from=200),
    }


def invoke(*args):
    return runner.invoke(app, list(map(str, args)))


@pytest.mark.parametrize("fail_on", ["alert", "warn"])
def test_healthy_run_passes(runs, fail_on):
    result = invoke("trend", runs["healthy"], "--fail-on", fail_on)
    assert result.exit_code == 0
    assert f"gate passed (--fail-on {fail_on}): HEALTHY" in result.stderr


@pytest.mark.parametrize("fail_on", ["alert", "warn"])
def test_alert_fails_the_gate_with_its_reason(runs, fail_on):
    result = invoke("trend", runs["collapse"], "--fail-on", fail_on)
    assert result.exit_code == 1
    assert f"gate failed (--fail-on {fail_on}): ALERT: attention monitors fired first" in result.stderr


def test_default_gate_is_alert_which_fails_an_alert_and_passes_a_warning(runs):
    assert invoke("trend", runs["collapse"]).exit_code == 1
    warned = invoke("trend", runs["collapse"], *ONLY_WARN)
    assert warned.exit_code == 0 and "gate passed (--fail-on alert): WARN" in warned.stderr


@pytest.mark.parametrize("fail_on, code", [(None, 0), ("warn", 1), ("not_judged", 1), ("alert", 0)])
def test_a_run_that_could_not_be_judged_fails_the_gate_at_not_judged_and_below(runs, fail_on, code):
    result = invoke("trend", runs["fresh"], *(["--fail-on", fail_on] if fail_on else []))
    assert result.exit_code == code, result.output
    level = fail_on or "alert"
    verdict = "failed" if code else "passed"
    assert (f"gate {verdict} (--fail-on {level}): NOT JUDGED: none of the 2 pairs could be judged yet: warm-up "
            "(the first 2 pairs)") in result.stderr
    assert "HEALTHY" not in result.output


@pytest.mark.parametrize("fail_on, trend_code", [("warn", 1), ("not_judged", 1), ("alert", 0)])
def test_a_collapse_in_the_warm_up_is_not_judged_by_trend_and_an_alert_of_diff(runs, fail_on, trend_code):
    # Healthy runs dip toward the floors at the end of the LR ramp, so trend leaves them out of the
    # warm-up and says so (never HEALTHY); diff knows no warm-up and applies them.
    trend = invoke("trend", runs["fresh_collapse"], "--fail-on", fail_on, "--no-cache")
    diff = invoke("diff", runs["fresh_collapse"] / "checkpoint-100", runs["fresh_collapse"] / "checkpoint-200",
                  "--fail-on", fail_on)
    assert (trend.exit_code, diff.exit_code) == (trend_code, 1)
    assert "NOT JUDGED" in trend.stdout and "HEALTHY" not in trend.output
    assert "normalised Δ2 entropy 0.167 below the floor 0.2" in diff.stdout


def test_warn_verdict_fails_only_a_warn_gate(runs):
    result = invoke("trend", runs["collapse"], *ONLY_WARN, "--fail-on", "warn")
    assert result.exit_code == 1 and "gate failed (--fail-on warn): WARN" in result.stderr


@pytest.mark.parametrize("args, message", [
    (["--fail-on", "sometimes"], "Invalid value for '--fail-on'"),
    (["--format", "yaml"], "Invalid value for '--format'"),
    (["--stride", "0"], "--stride must be"),
    (["--base", "last"], "Invalid value for '--base'"),
    (["--set", "alert_sigm=5"], "unknown setting"),
    (["--set", "warn_sigma=9"], "invalid thresholds"),
    (["--reference", "missing.json"], "cannot read the report"),
    (["--baseline", "missing.json"], "cannot read the report"),
    (["--loss-log", "missing.jsonl"], "cannot read the loss log"),
    (["--layers", "7"], "no layer(s) [7]"),
    (["--config", "missing.toml"], "no such config file"),
])
def test_bad_options_exit_2_with_one_line(runs, args, message):
    result = invoke("trend", runs["healthy"], "--no-cache", *args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "Traceback" not in result.output


def test_a_bad_option_value_is_one_clean_line(runs):
    result = invoke("trend", runs["healthy"], "--format", "never")
    assert result.exit_code == 2
    assert result.stderr == ("error: Invalid value for '--format': 'never' is not one of 'table', 'json', 'markdown', "
                             "'junit' (see --help)\n")


def test_usage_and_input_errors_exit_2(tmp_path):
    assert invoke("trend").exit_code == 2  # missing RUN_DIR
    assert invoke("trend", tmp_path, "--no-such-flag").exit_code == 2
    missing = invoke("trend", tmp_path / "nope")
    assert missing.exit_code == 2 and missing.stderr == f"error: {tmp_path / 'nope'}: does not exist\n"
    empty = invoke("trend", tmp_path)
    assert empty.exit_code == 2 and "no checkpoint directories" in empty.stderr


def test_diff_gate_and_formats(runs, tmp_path):
    healthy = [runs["healthy"] / "checkpoint-500", runs["healthy"] / "checkpoint-600"]
    assert invoke("diff", *healthy).exit_code == 0
    markdown = invoke("diff", *healthy, "--format", "markdown", "--markdown-summary", tmp_path / "s.md")
    assert markdown.exit_code == 0 and markdown.stdout.startswith("### 🟢 ckptscan diff")
    assert (tmp_path / "s.md").read_text() == markdown.stdout
    collapsed = [runs["collapse"] / "checkpoint-700", runs["collapse"] / "checkpoint-800"]
    result = invoke("diff", *collapsed, "--format", "json")
    assert result.exit_code == 1 and '"command": "diff"' in result.stdout
    assert "gate failed (--fail-on alert)" in result.stderr
    assert invoke("diff", *collapsed, "--set", "delta2_entropy_norm_floor=0").exit_code == 0
    assert invoke("diff", *healthy, "--set", "nope=1").exit_code == 2
