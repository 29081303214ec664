"""torch pickles: HF .bin (single, sharded, legacy), nanoGPT, DeepSpeed; and
pickles that would run code are refused without running it."""

import argparse
import builtins
import os
import subprocess
from pathlib import Path

import pytest
import torch
from factories import llama_config, llama_tensors, random_weights
from format_writers import fake_module, write_deepspeed, write_nanogpt, write_torch_bin

from ckptscan.errors import CkptScanError
from ckptscan.readers import open_checkpoint
from ckptscan.readers.torch_pickle import StandIn, load_pickle


def assert_same_values(checkpoint, stored: dict[str, torch.Tensor]):
    assert sorted(checkpoint.tensors.keys()) == sorted(stored)
    for name, value in stored.items():
        got = checkpoint.tensors.get(name)
        assert got.dtype == value.dtype and got.shape == value.shape, name
        assert torch.equal(got.double(), value.double()), name


def llama_bf16(seed=1):
    return {k: v.to(torch.bfloat16) for k, v in llama_tensors(llama_config(), seed).items()}


def test_pytorch_model_bin(tmp_path):
    tensors = llama_bf16()
    write_torch_bin(tmp_path / "checkpoint-40", tensors, llama_config())
    checkpoint = open_checkpoint(tmp_path / "checkpoint-40")
    assert (checkpoint.format, checkpoint.step, checkpoint.config["num_attention_heads"]) == ("torch", 40, 4)
    assert_same_values(checkpoint, tensors)
    name = "model.layers.1.self_attn.q_proj.weight"
    assert checkpoint.tensors.dtype(name) == "BF16"
    assert torch.equal(checkpoint.tensors.get(name, rows=(8, 24)), tensors[name][8:24])


def test_sharded_bin_loads_shards_only_when_used(tmp_path):
    tensors = {k: v.float() for k, v in llama_tensors(llama_config(), 2).items()}
    write_torch_bin(tmp_path / "ckpt", tensors, llama_config(), shards=3)
    checkpoint = open_checkpoint(tmp_path / "ckpt")
    assert checkpoint.format == "torch-sharded" and len(checkpoint.files) == 4
    assert checkpoint.tensors._loaded == {}  # the index alone gives the names
    assert_same_values(checkpoint, tensors)


def test_sharded_bin_with_a_missing_shard_is_refused(tmp_path):
    write_torch_bin(tmp_path / "ckpt", llama_bf16(), llama_config(), shards=2)
    (tmp_path / "ckpt" / "pytorch_model-00002-of-00002.bin").unlink()
    with pytest.raises(CkptScanError, match="pytorch_model-00002-of-00002.bin.*does not exist"):
        open_checkpoint(tmp_path / "ckpt")


def test_legacy_non_zip_file_is_read_without_mmap(tmp_path):
    tensors = llama_bf16(3)
    write_torch_bin(tmp_path / "ckpt", tensors, llama_config(), legacy=True)
    assert (tmp_path / "ckpt" / "pytorch_model.bin").read_bytes()[:4] != b"PK\x03\x04"
    assert_same_values(open_checkpoint(tmp_path / "ckpt"), tensors)


def nanogpt_tensors(n_layer=2, n_embd=48, seed=4):
    tensors = {"transformer.wte.weight": random_weights((64, n_embd), seed)}
    for i in range(n_layer):
        tensors[f"transformer.h.{i}.attn.c_attn.weight"] = random_weights((3 * n_embd, n_embd), seed + i + 1)
        tensors[f"transformer.h.{i}.attn.c_attn.bias"] = random_weights((3 * n_embd,), seed + i + 11)
        tensors[f"transformer.h.{i}.ln_1.weight"] = random_weights((n_embd,), seed + i + 21) + 1
    return {k: v.float() for k, v in tensors.items()}


@pytest.mark.parametrize("compiled", [True, False])
def test_nanogpt_ckpt(tmp_path, compiled):
    tensors = nanogpt_tensors()
    model_args = {"n_layer": 2, "n_head": 4, "n_embd": 48, "block_size": 64, "bias": True, "vocab_size": 64,
                  "dropout": 0.0}
    path = write_nanogpt(tmp_path / "out", tensors, model_args, iter_num=2500, compiled=compiled)
    for opened in (path, path.parent):
        checkpoint = open_checkpoint(opened)
        assert (checkpoint.format, checkpoint.step) == ("nanogpt", 2500)
        assert checkpoint.meta["model_args"] == model_args and checkpoint.meta["iter_num"] == 2500
        assert_same_values(checkpoint, tensors)  # no `_orig_mod.`, no optimizer state


def test_deepspeed_global_step(tmp_path):
    tensors = llama_bf16(5)
    args = argparse.Namespace(num_attention_heads=4, num_layers=2, hidden_size=64)  # Megatron-DeepSpeed client state
    write_deepspeed(tmp_path / "save", 30, tensors, client_state={"args": args, "iteration": 30})
    checkpoint = open_checkpoint(tmp_path / "save" / "global_step30")
    assert (checkpoint.format, checkpoint.step, checkpoint.meta["global_steps"]) == ("deepspeed", 30, 30)
    assert checkpoint.meta["args"] == {"num_attention_heads": 4, "num_layers": 2, "hidden_size": 64}
    assert_same_values(checkpoint, tensors)


def test_deepspeed_zero3_is_refused(tmp_path):
    write_deepspeed(tmp_path / "save", 30, {"w": torch.empty(0)}, zero_stage=3)
    with pytest.raises(CkptScanError, match="ZeRO-3.*zero_to_fp32"):
        open_checkpoint(tmp_path / "save" / "global_step30")


def test_hf_checkpoint_dir_never_touches_training_args_bin(tmp_path):
    marker = tmp_path / "pwned"
    write_torch_bin(tmp_path / "checkpoint-5", llama_bf16(), llama_config())
    torch.save(RunsCommand(f"touch {marker}"), tmp_path / "checkpoint-5" / "training_args.bin")
    torch.save({"state": {}}, tmp_path / "checkpoint-5" / "optimizer.pt")
    assert open_checkpoint(tmp_path / "checkpoint-5").format == "torch"
    assert not marker.exists()


class RunsCommand:
    """Unpickling this runs a shell command (the classic malicious checkpoint)."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


class RunsPython:
    def __init__(self, code):
        self.code = code

    def __reduce__(self):
        return builtins.exec, (self.code,)


class RunsSubprocess:
    def __init__(self, args):
        self.args = args

    def __reduce__(self):
        return subprocess.call, (self.args,)


@pytest.mark.parametrize("legacy", [False, True])
@pytest.mark.parametrize("payload, global_name", [
    (lambda marker: RunsCommand(f"touch {marker}"), "posix.system"),
    (lambda marker: RunsPython(f"open({str(marker)!r}, 'w').close()"), "exec"),
    (lambda marker: RunsSubprocess(["touch", str(marker)]), ".call'"),  # pickled under its py2 name
])
def test_malicious_pickle_is_refused_and_never_runs(tmp_path, legacy, payload, global_name):
    marker = tmp_path / "pwned"
    state = {"model": {"w": torch.ones(2, 2)}, "model_args": {"n_head": 1}, "iter_num": 1, "x": payload(marker)}
    torch.save(state, tmp_path / "ckpt.pt", _use_new_zipfile_serialization=not legacy)
    with pytest.raises(CkptScanError) as error:
        open_checkpoint(tmp_path / "ckpt.pt")
    assert str(tmp_path / "ckpt.pt") in str(error.value) and global_name in str(error.value)
    assert not marker.exists()


def test_framework_classes_become_inert_stand_ins(tmp_path):
    """A Megatron-namespace callable is never imported or called: the stand-in
    records its arguments instead."""
    marker = tmp_path / "pwned"

    def run(path):
        Path(path).touch()

    class CallsRun:
        def __reduce__(self):
            return run, (str(marker),)

    with fake_module("megatron.core.evil", run=run):
        torch.save({"w": torch.ones(3), "extra": CallsRun()}, tmp_path / "model.pt")
    loaded = load_pickle(tmp_path / "model.pt")
    assert isinstance(loaded["extra"], StandIn) and loaded["extra"].args == (str(marker),)
    assert "megatron.core.evil.run" in repr(loaded["extra"])
    assert not marker.exists()
    assert open_checkpoint(tmp_path / "model.pt").tensors.keys() == ["w"]


def test_corrupt_pickle_is_a_clear_error(tmp_path):
    write_torch_bin(tmp_path / "ckpt", llama_bf16(), llama_config())
    data = (tmp_path / "ckpt" / "pytorch_model.bin").read_bytes()
    (tmp_path / "ckpt" / "pytorch_model.bin").write_bytes(data[: len(data) // 2])
    with pytest.raises(CkptScanError, match="pytorch_model.bin"):
        open_checkpoint(tmp_path / "ckpt")


def test_no_unsafe_torch_load_anywhere():
    package = Path(__file__).parents[2] / "ckptscan"
    offenders = [str(p) for p in package.rglob("*.py") if "weights_only=False" in p.read_text()]
    assert offenders == []


def test_a_transformers_config_in_lightning_hyper_parameters_is_an_inert_record(tmp_path):
    """Lightning pickles what save_hyperparameters() kept, e.g. a transformers
    config object: its class is never imported, its state is kept as data, and
    a transformers-namespace callable is recorded, not called."""
    marker = tmp_path / "pwned"

    def run(path):
        Path(path).touch()

    class LlamaConfig:
        def __init__(self):
            self.num_attention_heads = 4

    class CallsRun:
        def __reduce__(self):
            return run, (str(marker),)

    with fake_module("transformers.models.llama.configuration_llama", LlamaConfig=LlamaConfig, run=run):
        torch.save({"state_dict": {"w": torch.ones(3)}, "pytorch-lightning_version": "2.6.6", "global_step": 7,
                    "hyper_parameters": {"config": LlamaConfig(), "hook": CallsRun()}}, tmp_path / "a.ckpt")
    checkpoint = open_checkpoint(tmp_path / "a.ckpt")
    assert (checkpoint.format, checkpoint.step, checkpoint.tensors.keys()) == ("lightning", 7, ["w"])
    config = checkpoint.meta["hyper_parameters"]["config"]
    assert config == {"__class__": "transformers.models.llama.configuration_llama.LlamaConfig",
                      "num_attention_heads": 4}
    assert not marker.exists()
