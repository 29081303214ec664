"""`ckptscan diff`: the table, the JSON report's public keys, and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from factories import llama_config, llama_tensors, random_weights, write_hf_checkpoint
from typer.testing import CliRunner

from ckptscan.cli import app

runner = CliRunner()

# The keys the foundation issue promises to users' CI scripts.
TOP_KEYS = {"schema_version", "tool", "command", "model", "checkpoints", "pairs", "summary"}
MODEL_KEYS = {"family", "num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "num_experts"}
LAYER_KEYS = {"layer", "status", "findings", "attention", "router"}
FINDING_KEYS = {"monitor", "family", "severity", "value", "message"}
ATTENTION_KEYS = {
    "delta2_entropy", "delta2_entropy_min", "delta2_entropy_norm", "delta3_entropy", "dwq_entropy",
    "dwk_entropy", "dwq_rel_norm", "dwk_rel_norm", "qk_logit_bound", "heads",
}
HEAD_KEYS = {"head", "kv_head", "delta2_entropy", "delta3_entropy", "dwq_entropy", "dwk_entropy"}
ROUTER_KEYS = {"epsilon", "cosine_similarity", "dwr_entropy"}
SUMMARY_KEYS = {"status", "flagged_layers", "first_alert_step"}


def _pair(tmp_path, plant: bool):
    config = llama_config(layers=5, hidden=32, heads=4, kv_heads=2, experts=4)
    a = llama_tensors(config, seed=1)
    b = {k: v + 1e-2 * random_weights(v.shape, 100 + i) for i, (k, v) in enumerate(sorted(a.items()))}
    if plant:
        name = "model.layers.2.self_attn.q_proj.weight"
        b[name] = a[name] + 0.05 * random_weights((32, 1), 7, 1.0) @ random_weights((1, 32), 8, 1.0)
        b["model.layers.2.self_attn.k_proj.weight"] = a["model.layers.2.self_attn.k_proj.weight"]
    return (
        str(write_hf_checkpoint(tmp_path / "checkpoint-10", a, config)),
        str(write_hf_checkpoint(tmp_path / "checkpoint-20", b, config)),
    )


def _strict_json(path):
    def refuse(constant):
        raise ValueError(f"non-JSON constant {constant}")

    return json.loads(path.read_text(), parse_constant=refuse)


def test_healthy_pair_exits_0_and_prints_the_table(tmp_path):
    a, b = _pair(tmp_path, plant=False)
    result = runner.invoke(app, ["diff", a, b])
    assert result.exit_code == 0, result.output
    assert "Δ2 H" in result.output and "HEALTHY" in result.output


def test_planted_layer_fails_the_gate_with_exit_1_and_a_reason(tmp_path):
    a, b = _pair(tmp_path, plant=True)
    result = runner.invoke(app, ["diff", a, b])
    assert result.exit_code == 1
    assert "gate failed" in result.output
    assert "layer 2 [attention] alert" in result.output


def test_json_report_has_every_promised_key_and_no_nan(tmp_path):
    a, b = _pair(tmp_path, plant=True)
    out = tmp_path / "report.json"
    runner.invoke(app, ["diff", a, b, "--json", str(out)])
    report = _strict_json(out)
    assert TOP_KEYS <= report.keys()
    assert report["schema_version"] == 1 and report["command"] == "diff"
    assert report["tool"]["name"] == "ckptscan"
    assert MODEL_KEYS <= report["model"].keys()
    assert [c["step"] for c in report["checkpoints"]] == [10, 20]
    pair = report["pairs"][0]
    assert (pair["from_step"], pair["to_step"]) == (10, 20)
    for layer in pair["layers"]:
        assert LAYER_KEYS <= layer.keys()
        assert ATTENTION_KEYS <= layer["attention"].keys()
        assert ROUTER_KEYS <= layer["router"].keys()
        for head in layer["attention"]["heads"]:
            assert HEAD_KEYS <= head.keys()
        for finding in layer["findings"]:
            assert FINDING_KEYS <= finding.keys()
            assert finding["family"] in {"attention", "router", "numeric"}
    assert SUMMARY_KEYS <= report["summary"].keys()
    assert {"attention", "router"} <= report["summary"]["first_alert_step"].keys()
    assert report["summary"]["flagged_layers"] == [2]


@pytest.mark.parametrize("fail_on, expected", [("warn", 1), ("alert", 1)])
def test_fail_on_levels(tmp_path, fail_on, expected):
    a, b = _pair(tmp_path, plant=True)
    assert runner.invoke(app, ["diff", a, b, "--fail-on", fail_on]).exit_code == expected


def test_missing_checkpoint_is_one_line_and_exit_2(tmp_path):
    a, _ = _pair(tmp_path, plant=False)
    result = runner.invoke(app, ["diff", a, str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert "no such file or directory" in result.output
    assert "Traceback" not in result.output


def test_bad_flag_values_are_usage_errors(tmp_path):
    a, b = _pair(tmp_path, plant=False)
    assert runner.invoke(app, ["diff", a, b, "--fail-on", "sometimes"]).exit_code == 2
    assert runner.invoke(app, ["diff", a, b, "--layers", "x-y"]).exit_code == 2
    assert runner.invoke(app, ["diff", a, b, "--precision", "float16"]).exit_code == 2
    assert runner.invoke(app, ["diff", a]).exit_code == 2


def test_diff_takes_the_same_output_options_as_trend(tmp_path):
    a, b = _pair(tmp_path, plant=True)
    html, png = tmp_path / "r.html", tmp_path / "figs"
    result = runner.invoke(app, ["diff", str(a), str(b), "--format", "json", "--quiet", "--html", str(html),
                                 "--png", str(png)])
    assert result.exit_code == 1, result.output
    assert json.loads(result.stdout)["command"] == "diff"
    assert html.is_file() and list(png.glob("*.png"))
    assert "wrote" not in result.stderr  # --quiet


def test_checkpoints_whose_names_carry_no_step_are_judged_but_their_order_is_not(tmp_path):
    a, b = _pair(tmp_path, plant=False)
    after, before = (tmp_path / "checkpoint-10").rename(tmp_path / "after"), (tmp_path / "checkpoint-20").rename(
        tmp_path / "before")
    result = runner.invoke(app, ["diff", str(after), str(before), "--json", str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    assert "note: no step in the checkpoints' names: their order is not checked" in result.stderr
    summary = _strict_json(tmp_path / "r.json")["summary"]
    assert summary["status"] == "ok" and summary["judged_pairs"] == 1
    assert summary["not_judged"] == [
        "routing entropy and expert load: no probe (--probe FILE, or RUN/probe.safetensors)",
        "the order of the checkpoints: no step in their names to check that the older one came first"]
    assert "; the order of the checkpoints: no step in their names" in summary["message"]


def test_checkpoints_apart_use_no_run_side_files(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    a, b = _pair(tmp_path / "x", plant=False)
    moved = (tmp_path / "x" / "checkpoint-20").rename(tmp_path / "y" / "checkpoint-20")
    (tmp_path / "x" / "train_log.jsonl").write_text('{"step": 0, "loss": 3.0}\n')
    result = runner.invoke(app, ["diff", a, str(moved)])
    assert result.exit_code == 0, result.output
    assert "using the run's" not in result.stderr


@pytest.mark.parametrize("flag", ["--json", "--junit", "--markdown-summary", "--html"])
def test_a_directory_given_as_a_file_destination_is_refused_before_the_scan(tmp_path, flag):
    a, b = _pair(tmp_path, plant=False)
    (tmp_path / "out").mkdir()
    result = runner.invoke(app, ["diff", a, b, flag, str(tmp_path / "out")])
    assert result.exit_code == 2
    assert result.stderr == f"error: {tmp_path / 'out'}: {flag} needs a file, and this is a directory\n"
    assert result.stdout == ""  # no table, no verdict: nothing was scanned


def test_a_config_file_found_and_read_is_named_on_stderr(tmp_path, monkeypatch):
    a, b = _pair(tmp_path, plant=False)
    (tmp_path / ".git").mkdir()  # the search for a config stops at a repository root
    (tmp_path / "ckptscan.toml").write_text("alert_sigma = 7\n")
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["diff", a, b])
    assert result.exit_code == 0, result.output
    assert f"using config {tmp_path / 'ckptscan.toml'}\n" in result.stderr
    assert "using config" not in runner.invoke(app, ["diff", a, b, "--quiet"]).stderr


SAMPLES = Path(__file__).resolve().parents[2] / "sample_checkpoints"


@pytest.mark.skipif(not (SAMPLES / "healthy").is_dir(), reason="sample_checkpoints/ not present")
def test_a_diff_in_the_warm_up_says_what_its_verdict_rests_on():
    """trend leaves the pair 0 → 100 unjudged (warm-up); diff judges it on its own and says by what."""
    healthy = SAMPLES / "healthy"
    result = runner.invoke(app, ["diff", str(healthy / "checkpoint-0"), str(healthy / "checkpoint-100")])
    assert result.exit_code == 0, result.output
    assert ("rests on: this pair alone, by the floors, the ceilings, the non-finite check and the cross-layer rule; a "
            "trend of its run does not judge it (step 0 is within the run's first 2 intervals of 100 steps and before "
            "the learning rate's warm-up ends at step 99: the warm-up), and neither the update's size nor any baseline "
            "is judged here") in " ".join(result.stdout.split())
    later = runner.invoke(app, ["diff", str(healthy / "checkpoint-1700"), str(healthy / "checkpoint-1800")])
    assert "rests on" not in later.stdout
