"""`ckptscan inspect`: what ckptscan sees in a checkpoint or a run, and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from factories import llama_config, llama_tensors, random_weights, write_hf_checkpoint
from typer.testing import CliRunner

from ckptscan.cli import app

runner = CliRunner()


def _run(tmp_path):
    config = llama_config(layers=3, hidden=32, heads=4, kv_heads=2, experts=4)
    for step in (200, 100):
        write_hf_checkpoint(tmp_path / "run" / f"checkpoint-{step}", llama_tensors(config, step), config, shards=2,
                            dtype=torch.bfloat16)
    (tmp_path / "run" / "checkpoint-300").mkdir()  # an incomplete save
    (tmp_path / "run" / "tmp-checkpoint-400").mkdir()
    return tmp_path / "run"


def test_checkpoint_table_names_the_family_geometry_and_every_tensor_read(tmp_path):
    path = _run(tmp_path) / "checkpoint-100"
    result = runner.invoke(app, ["inspect", str(path)])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "safetensors-sharded, step 100" in out
    assert "mixtral · 3 layers · hidden 32 · 4 heads / 2 KV heads · head_dim 8 · 4 experts, top-2, softmax" in out
    assert "query heads 4: config.json 'num_attention_heads'" in out
    for layer in range(3):
        for name in ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "block_sparse_moe.gate.weight"):
            assert f"model.layers.{layer}.{name}" in out
    assert "BF16" in out and "16x32" in out


def test_json_lists_roles_shapes_and_dtypes_per_layer(tmp_path):
    path = _run(tmp_path) / "checkpoint-200"
    result = runner.invoke(app, ["inspect", str(path), "--format", "json", "--layers", "1",
                                 "--json", str(tmp_path / "out.json")])
    assert result.exit_code == 0, result.output
    description = json.loads(result.stdout)
    assert description == json.loads((tmp_path / "out.json").read_text())
    assert result.stderr == f"wrote {tmp_path / 'out.json'}\n"
    checkpoint = description["checkpoint"]
    assert checkpoint["model"]["family"] == "mixtral" and checkpoint["model"]["num_kv_heads"] == 2
    (layer,) = checkpoint["layers"]
    assert layer["layer"] == 1
    assert [(t["role"], t["shape"], t["dtype"]) for t in layer["tensors"]] == [
        ("W_q", [32, 32], "BF16"), ("W_k", [16, 32], "BF16"), ("input_norm", [32], "BF16"), ("router", [4, 32], "BF16")]


def test_run_lists_steps_in_order_and_what_was_skipped(tmp_path):
    run = _run(tmp_path)
    result = runner.invoke(app, ["inspect", str(run), "--format", "json"])
    assert result.exit_code == 0, result.output
    description = json.loads(result.output)
    assert description["kind"] == "run"
    assert [c["step"] for c in description["run"]["checkpoints"]] == [100, 200]
    skipped = {s["path"].rsplit("/", 1)[-1] for s in description["run"]["skipped"]}
    assert skipped == {"checkpoint-300", "tmp-checkpoint-400"}
    assert description["checkpoint"]["step"] == 200
    table = runner.invoke(app, ["inspect", str(run)])
    assert table.exit_code == 0
    assert "2 checkpoint(s) in step order" in table.output and "skipped" in table.output


def test_unknown_names_print_their_patterns_and_exit_2(tmp_path):
    tensors = {f"blk.{i}.attn_{p}.weight": random_weights((32, 32), i) for i in range(3) for p in "qk"}
    path = write_hf_checkpoint(tmp_path / "ckpt", tensors, None)
    result = runner.invoke(app, ["inspect", str(path)])
    assert result.exit_code == 2
    assert "blk.N.attn_q.weight  x3" in result.output
    assert "no layout resolver recognises these tensor names" in result.output

    (tmp_path / "map.toml").write_text("q = 'blk\\.(\\d+)\\.attn_q\\.weight'\nk = 'blk\\.(\\d+)\\.attn_k\\.weight'\n")
    result = runner.invoke(app, ["inspect", str(path), "--tensor-map", str(tmp_path / "map.toml"), "--num-heads", "4"])
    assert result.exit_code == 0, result.output
    assert "tensor-map · 3 layers · hidden 32 · 4 heads / 4 KV heads" in result.output


def test_missing_path_and_missing_heads_exit_2(tmp_path):
    assert runner.invoke(app, ["inspect", str(tmp_path / "nope")]).exit_code == 2
    config = llama_config(layers=1, hidden=32, heads=4, kv_heads=2)
    tensors = llama_tensors(config, 1)
    path = write_hf_checkpoint(tmp_path / "ckpt", tensors, None)
    result = runner.invoke(app, ["inspect", str(path)])
    assert result.exit_code == 2
    assert "pass --num-heads" in result.output


SAMPLES = Path(__file__).resolve().parents[2] / "sample_checkpoints"


@pytest.mark.skipif(not SAMPLES.is_dir(), reason="sample_checkpoints/ not present")
@pytest.mark.parametrize("run", sorted(p.name for p in SAMPLES.iterdir() if p.is_dir()) if SAMPLES.is_dir() else [])
def test_a_sample_run_is_inspected_as_a_run_and_its_probe_is_named_a_side_file(run):
    """The run folder holds probe.safetensors, which opens alone as a (tiny) safetensors checkpoint: the folder
    is still a run of checkpoint-N folders, and the probe and the loss log are named as what they are."""
    result = runner.invoke(app, ["inspect", str(SAMPLES / run), "--format", "json"])
    assert result.exit_code == 0, result.output
    description = json.loads(result.output)
    assert description["kind"] == "run"
    assert [c["step"] for c in description["run"]["checkpoints"]] == list(range(0, 3001, 100))
    assert description["checkpoint"]["path"].endswith("checkpoint-3000")
    assert description["checkpoint"]["model"]["family"] == "mixtral"
    roles = {Path(s["path"]).name: s["role"] for s in description["run"]["side_files"]}
    assert roles["probe.safetensors"].startswith("the probe:") and roles["train_log.jsonl"].startswith("the loss log:")
    table = runner.invoke(app, ["inspect", str(SAMPLES / run)])
    assert table.exit_code == 0, table.output
    assert "side file" in table.output and "layers.N.router_input" not in table.output


def test_a_lone_safetensors_file_beside_step_named_folders_stays_the_checkpoint_when_it_is_not_a_side_file(tmp_path):
    """Only the known side files give way to the run: a checkpoint folder holding its weights and a step-named
    subfolder (DeepSpeed's global_stepN under HF Trainer's checkpoint-N) is still that one checkpoint."""
    config = llama_config(layers=1, hidden=32, heads=4, kv_heads=2)
    path = write_hf_checkpoint(tmp_path / "checkpoint-100", llama_tensors(config, 1), config)
    (path / "global_step100").mkdir()
    result = runner.invoke(app, ["inspect", str(path), "--format", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["kind"] == "checkpoint"
