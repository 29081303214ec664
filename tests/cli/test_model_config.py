"""--model-config on trend, diff and inspect, on runs the frameworks wrote
(tests/golden/): the geometry a checkpoint does not carry, from the user's file."""

import json
from pathlib import Path

from typer.testing import CliRunner

from ckptscan.cli import app

runner = CliRunner()
GOLDEN = Path(__file__).resolve().parents[1] / "golden"
DEEPSPEED = GOLDEN / "deepspeed" / "plain"  # no config, no args: the framework stores no geometry


def _config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "num_attention_heads": 4, "num_key_value_heads": 2}))
    return str(path)


def test_trend_without_geometry_fails_in_one_line_naming_the_option(tmp_path):
    result = runner.invoke(app, ["trend", str(DEEPSPEED), "--no-cache", "--quiet"])
    assert result.exit_code == 2
    assert "--model-config FILE" in result.output and "Traceback" not in result.output


def test_trend_and_diff_read_the_geometry_from_model_config(tmp_path):
    trend = runner.invoke(app, ["trend", str(DEEPSPEED), "--no-cache", "--quiet", "--format", "json",
                                "--model-config", _config(tmp_path)])
    assert trend.exit_code == 0, trend.output
    report = json.loads(trend.stdout)
    assert [(c["step"], Path(c["path"]).name) for c in report["checkpoints"]] == [(2, "global_step2"),
                                                                                   (4, "global_step4")]
    assert (report["model"]["family"], report["model"]["num_heads"]) == ("llama", 4)
    diff = runner.invoke(app, ["diff", str(DEEPSPEED / "global_step2"), str(DEEPSPEED / "global_step4"),
                               "--format", "json", "--model-config", _config(tmp_path)])
    assert diff.exit_code == 0 and json.loads(diff.stdout)["model"]["num_kv_heads"] == 2


def test_inspect_says_where_the_geometry_came_from(tmp_path):
    result = runner.invoke(app, ["inspect", str(DEEPSPEED / "global_step4"), "--format", "json",
                                 "--model-config", _config(tmp_path)])
    assert result.exit_code == 0
    notes = json.loads(result.stdout)["checkpoint"]["notes"]
    assert notes[0] == f"query heads 4: --model-config {tmp_path / 'config.json'} 'num_attention_heads'"


def test_an_unreadable_model_config_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "job.toml"
    bad.write_text("[model]\nname = 'llama3'\nflavor = 'nope'\n")
    result = runner.invoke(app, ["inspect", str(DEEPSPEED), "--model-config", str(bad)])
    assert result.exit_code == 2 and "flavor 'nope'" in result.output and "Traceback" not in result.output
