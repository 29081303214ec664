"""Run directories: checkpoints found per framework, ordered by step; pointers,
temporary and incomplete checkpoints skipped with a reason."""

import json
import shutil

import pytest
import torch
from factories import llama_config, llama_tensors, write_hf_checkpoint
from format_writers import GOLDEN_MEGATRON, write_deepspeed, write_dcp, write_nanogpt

from ckptscan.pipeline.discovery import discover_run
from ckptscan.errors import CkptScanError

CONFIG = llama_config(layers=1)


def hf(directory, seed=1, shards=1):
    return write_hf_checkpoint(directory, llama_tensors(CONFIG, seed), CONFIG, shards=shards)


def steps(run):
    return [c.step for c in run.checkpoints]


def skipped(run):
    return {s["path"].rsplit("/", 1)[-1]: s["reason"] for s in run.skipped}


def test_hf_trainer_run(tmp_path):
    for step in (100, 20, 3):
        hf(tmp_path / f"checkpoint-{step}", seed=step)
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    hf(tmp_path / "tmp-checkpoint-120")  # Trainer's staging directory
    hf(tmp_path / "checkpoint-140", shards=2)
    (tmp_path / "checkpoint-140" / "model-00002-of-00002.safetensors").unlink()  # a shard never written
    (tmp_path / "checkpoint-160").mkdir()  # no model files yet
    (tmp_path / "runs").mkdir()  # tensorboard
    (tmp_path / "train_log.jsonl").write_text("{}\n")
    run = discover_run(tmp_path)
    assert steps(run) == [3, 20, 100]  # numeric, not lexical, order
    assert [c.path.name for c in run.checkpoints] == ["checkpoint-3", "checkpoint-20", "checkpoint-100"]
    reasons = skipped(run)
    assert set(reasons) == {"tmp-checkpoint-120", "checkpoint-140", "checkpoint-160"}
    assert "temporary" in reasons["tmp-checkpoint-120"]
    assert "model-00002-of-00002.safetensors" in reasons["checkpoint-140"]
    assert "no checkpoint recognised" in reasons["checkpoint-160"]


def test_checkpoint_paths_are_the_checkpoints_as_named_not_files_inside(tmp_path):
    hf(tmp_path / "checkpoint-1", shards=2)  # opened through model.safetensors.index.json
    tensors = {k: v.float() for k, v in llama_tensors(CONFIG, 1).items()}
    write_deepspeed(tmp_path, 2, tensors)  # opened through mp_rank_00_model_states.pt
    run = discover_run(tmp_path)
    assert [c.path for c in run.checkpoints] == [tmp_path / "checkpoint-1", tmp_path / "global_step2"]


def test_deepspeed_run_ignores_latest_and_skips_a_save_in_progress(tmp_path):
    tensors = {k: v.float() for k, v in llama_tensors(CONFIG, 1).items()}
    for step in (10, 5, 15):
        write_deepspeed(tmp_path, step, tensors)
    (tmp_path / "latest").write_text("global_step10")  # 15 is still being written
    run = discover_run(tmp_path)
    assert steps(run) == [5, 10] and run.checkpoints[0].format == "deepspeed"
    assert "still being written" in skipped(run)["global_step15"]


def test_megatron_run(tmp_path):
    """A --save directory megatron-core wrote (iterations 10 and 20), and a save that crashed midway."""
    shutil.copytree(GOLDEN_MEGATRON / "legacy", tmp_path, dirs_exist_ok=True)
    (tmp_path / "iter_0000030" / "mp_rank_00").mkdir(parents=True)  # the tracker still says 20
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "20"
    run = discover_run(tmp_path)
    assert steps(run) == [10, 20] and run.checkpoints[1].meta["iteration"] == 20
    assert set(skipped(run)) == {"iter_0000030"}


def test_torchtitan_run_under_dump_checkpoint(tmp_path):
    folder = tmp_path / "checkpoint"
    for step in (10, 5):
        write_dcp(folder / f"step-{step}", {"layers.0.attention.wq.weight": torch.randn(8, 8),
                                            "train_state.step": torch.tensor(step)})
    write_dcp(folder / "step-15", {"layers.0.attention.wq.weight": torch.randn(8, 8)})
    (folder / "step-15" / ".metadata").unlink()  # DCP writes .metadata last
    run = discover_run(tmp_path)  # the user names `dump/`; checkpoints are in dump/checkpoint/
    assert steps(run) == [5, 10]
    assert "no checkpoint recognised" in skipped(run)["step-15"]


def test_olmo_core_run(tmp_path):
    for step in (200, 100):
        write_dcp(tmp_path / f"step{step}" / "model_and_optim", {"model": {"blocks.0.attention.w_q.weight":
                                                                           torch.randn(8, 8)},
                                                                 "optim": {"step": torch.tensor(step)}})
        (tmp_path / f"step{step}" / ".metadata.json").write_text("{}")
    write_dcp(tmp_path / "step300-tmp" / "model_and_optim", {"model": {"w": torch.randn(2)}})
    run = discover_run(tmp_path)
    assert steps(run) == [100, 200] and run.checkpoints[0].tensors.keys() == ["blocks.0.attention.w_q.weight"]
    assert "temporary" in skipped(run)["step300-tmp"]


def test_accelerate_save_indices_order_the_run_and_are_said_to_be_indices(tmp_path):
    for k in (10, 2, 0):
        hf(tmp_path / "checkpoints" / f"checkpoint_{k}", seed=k)
    run = discover_run(tmp_path)
    assert steps(run) == [0, 2, 10]  # numeric order of K
    assert any("save index, not a training step" in note for note in run.notes)


def test_steps_recorded_inside_win_over_names(tmp_path):
    """A registered accelerate object records the step; the folder name does not count."""
    for k, step in ((0, 500), (1, 1000)):
        folder = tmp_path / "checkpoints" / f"checkpoint_{k}"
        hf(folder, seed=k)
        torch.save({"step": step}, folder / "custom_checkpoint_0.pkl")
    run = discover_run(tmp_path)
    assert steps(run) == [500, 1000] and run.notes == []


def test_a_run_of_checkpoint_files_orders_by_the_step_inside_and_drops_the_last_copy(tmp_path):
    tensors = {k: v.float() for k, v in llama_tensors(CONFIG, 1).items()}
    for name, step in (("epoch=0-step=20.ckpt", 20), ("epoch=1-step=3.ckpt", 300), ("last.ckpt", 300)):
        torch.save({"state_dict": tensors, "global_step": step, "pytorch-lightning_version": "2.6.6"},
                   tmp_path / name)
    torch.save({"state_dict": tensors}, tmp_path / "step_7.pt")  # no step inside: the name's
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    run = discover_run(tmp_path)
    assert steps(run) == [7, 20, 300]
    assert [c.path.name for c in run.checkpoints] == ["step_7.pt", "epoch=0-step=20.ckpt", "epoch=1-step=3.ckpt"]
    assert "same step 300" in skipped(run)["last.ckpt"]
    assert any("step 300 from the checkpoint's 'global_step', not 3 from its name" in n for n in run.notes)


def test_a_folder_of_step_named_safetensors_files_is_a_run_not_one_sharded_checkpoint(tmp_path):
    from safetensors.torch import save_file

    for seed, step in ((1, 100), (2, 200), (3, 300)):
        save_file({k: v.contiguous() for k, v in llama_tensors(CONFIG, seed).items()},
                  tmp_path / f"step_{step}.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    (tmp_path / "probe.safetensors").write_bytes(b"")  # a side file, not a save: no step in its name
    assert steps(discover_run(tmp_path)) == [100, 200, 300]


def test_a_sharded_safetensors_checkpoint_is_still_not_a_run(tmp_path):
    hf(tmp_path / "ckpt", shards=2)
    with pytest.raises(CkptScanError, match="single checkpoint, not a run directory"):
        discover_run(tmp_path / "ckpt")


def test_a_single_nanogpt_checkpoint_is_not_a_run(tmp_path):
    write_nanogpt(tmp_path / "out", {"transformer.h.0.attn.c_attn.weight": torch.randn(12, 4)},
                  {"n_layer": 1, "n_head": 1, "n_embd": 4}, iter_num=5)
    with pytest.raises(CkptScanError, match="single checkpoint, not a run directory"):
        discover_run(tmp_path / "out")


def test_empty_directory_is_not_a_run(tmp_path):
    with pytest.raises(CkptScanError, match="no checkpoint directories"):
        discover_run(tmp_path)


def test_two_folders_for_one_step_are_both_named(tmp_path):
    hf(tmp_path / "checkpoint-100", seed=1)
    hf(tmp_path / "checkpoint-0100", seed=2)
    hf(tmp_path / "checkpoint-200", seed=3)
    run = discover_run(tmp_path)
    assert [c.path.name for c in run.checkpoints] == ["checkpoint-0100", "checkpoint-200"]
    assert skipped(run) == {"checkpoint-100": "checkpoint-0100 is also step 100: two checkpoints of this run claim "
                                              "it and only checkpoint-0100 is read; rename or move the other"}
    assert [s["kind"] for s in run.skipped] == ["duplicate"]


def test_a_config_count_of_the_wrong_type_is_refused_naming_the_file_and_key(tmp_path):
    from typer.testing import CliRunner

    from ckptscan.cli import app

    for step in (100, 200):
        hf(tmp_path / f"checkpoint-{step}", seed=step)
        config = tmp_path / f"checkpoint-{step}" / "config.json"
        config.write_text(json.dumps({**CONFIG, "num_hidden_layers": str(CONFIG["num_hidden_layers"])}))
    result = CliRunner().invoke(app, ["inspect", str(tmp_path / "checkpoint-100")])
    assert result.exit_code == 2
    assert result.output == (f"error: {tmp_path}/checkpoint-100/config.json: 'num_hidden_layers' is '1' (str), "
                             "expected an integer\n")
