"""torch.distributed.checkpoint directories (torchtitan, OLMo-core, HF FSDP),
read in one process, chunk by chunk; the `.metadata` pickle is unpickled safely."""

import io
import json
import os
import pickle

import pytest
import torch
from factories import random_weights
from format_writers import write_dcp

from ckptscan.errors import CkptScanError
from ckptscan.readers import open_checkpoint
from ckptscan.readers.dcp import _MetadataUnpickler

D, H, G, HEAD_DIM, E = 32, 4, 2, 8, 4


def torchtitan_model(layers=2, seed=0):
    tensors = {"tok_embeddings.weight": random_weights((16, D), seed)}
    for i in range(layers):
        p, s = f"layers.{i}.", seed * 100 + i * 10
        tensors[p + "attention.wq.weight"] = random_weights((H * HEAD_DIM, D), s + 1)
        tensors[p + "attention.wk.weight"] = random_weights((G * HEAD_DIM, D), s + 2)
        tensors[p + "attention_norm.weight"] = random_weights((D,), s + 3) + 1
        tensors[p + "moe.router.gate.weight"] = random_weights((E, D), s + 4)
        tensors[p + "moe.experts.w1"] = random_weights((E, 2 * D, D), s + 5)
    return {k: v.to(torch.bfloat16) for k, v in tensors.items()}


def write_torchtitan(step_dir, model):
    """torchtitan checkpointer: flat model FQNs plus optimizer, lr_scheduler,
    dataloader and train_state entries; FSDP over 2 ranks splits dim 0."""
    state = dict(model)
    state["optimizer.state.layers.0.attention.wq.weight.exp_avg"] = torch.zeros(H * HEAD_DIM, D)
    state["optimizer.param_groups.layers.0.attention.wq.weight.lr"] = 3e-4
    state["lr_scheduler.last_epoch"] = 10
    state["train_state.step"] = torch.tensor(10, dtype=torch.int32)
    state["dataloader.dp_rank_0"] = io.BytesIO(b"opaque dataloader state")
    chunks = {name: [(0, 2)] for name in model}
    return write_dcp(step_dir, state, chunks)


def test_torchtitan_step(tmp_path):
    model = torchtitan_model()
    write_torchtitan(tmp_path / "checkpoint" / "step-10", model)
    checkpoint = open_checkpoint(tmp_path / "checkpoint" / "step-10")
    assert (checkpoint.format, checkpoint.step) == ("dcp", 10)
    assert checkpoint.meta == {"train_state.step": 10, "step_source": "train_state.step"}  # the step recorded inside
    assert sorted(checkpoint.tensors.keys()) == sorted(model)
    for name, value in model.items():
        got = checkpoint.tensors.get(name)
        assert got.dtype == torch.bfloat16 and torch.equal(got.double(), value.double()), name
        assert checkpoint.tensors.dtype(name) == "BF16"
    wq = "layers.1.attention.wq.weight"
    assert torch.equal(checkpoint.tensors.get(wq, rows=(10, 22)), model[wq][10:22])  # across the 2 chunks
    assert checkpoint.tensors.get(wq, rows=(5, 5)).shape == (0, D)


def test_olmo_core_model_and_optim(tmp_path):
    """OLMo-core (`train/checkpoint.py`): stepN/model_and_optim/ with `model.` and `optim.`
    namespaces (flat router [E*D]), train/rank0.pt, config.json (ConfigSaverCallback) and
    .metadata.json, written last."""
    model = {
        "blocks.0.attention.w_q.weight": random_weights((H * HEAD_DIM, D), 1).float(),
        "blocks.0.attention.w_k.weight": random_weights((G * HEAD_DIM, D), 2).float(),
        "blocks.0.attention.q_norm.weight": random_weights((H * HEAD_DIM,), 3).float() + 1,
        "blocks.0.feed_forward_moe.router.weight": random_weights((E * D,), 4).float(),
    }
    state = {f"model.{k}": v for k, v in model.items()}
    state["optim.state.blocks.0.attention.w_q.weight.exp_avg"] = torch.zeros(H * HEAD_DIM, D)
    step_dir = tmp_path / "step200"
    write_dcp(step_dir / "model_and_optim", state)
    (step_dir / "train").mkdir()
    torch.save({"global_step": 200}, step_dir / "train" / "rank0.pt")
    (step_dir / "config.json").write_text(json.dumps({"model": {"block": {"sequence_mixer": {"n_heads": H}}}}))
    with pytest.raises(CkptScanError, match=r"without \.metadata\.json, which is written last"):
        open_checkpoint(step_dir)
    (step_dir / ".metadata.json").write_text(json.dumps({"version": "2.1.0"}))
    checkpoint = open_checkpoint(step_dir)
    assert (checkpoint.format, checkpoint.step, checkpoint.path.name) == ("dcp", 200, "step200")
    assert checkpoint.meta["key_prefix"] == "model."
    assert checkpoint.config["model"]["block"]["sequence_mixer"]["n_heads"] == H
    assert sorted(checkpoint.tensors.keys()) == sorted(model)
    for name, value in model.items():
        assert torch.equal(checkpoint.tensors.get(name).double(), value.double()), name


def test_hf_fsdp_sharded_state_dict(tmp_path):
    """Accelerate FSDP SHARDED_STATE_DICT: checkpoint-N/pytorch_model_fsdp_0/ holds
    {"model": model.state_dict()} (keys model.model.layers...), next to optimizer_0/."""
    model = {"model.layers.0.self_attn.q_proj.weight": random_weights((H * HEAD_DIM, D), 5).float(),
             "lm_head.weight": random_weights((16, D), 6).float()}
    write_dcp(tmp_path / "checkpoint-7" / "pytorch_model_fsdp_0", {"model": model})
    write_dcp(tmp_path / "checkpoint-7" / "optimizer_0", {"optimizer": {"state": {"0": {"exp_avg": torch.ones(3)}}}})
    checkpoint = open_checkpoint(tmp_path / "checkpoint-7")
    assert checkpoint.step == 7 and sorted(checkpoint.tensors.keys()) == sorted(model)
    for name, value in model.items():
        assert torch.equal(checkpoint.tensors.get(name), value), name


def test_hf_names_saved_directly_keep_their_model_prefix(tmp_path):
    model = {"model.layers.0.self_attn.q_proj.weight": random_weights((8, 8), 7).float(),
             "model.embed_tokens.weight": random_weights((4, 8), 8).float()}
    write_dcp(tmp_path / "ckpt", model)
    assert sorted(open_checkpoint(tmp_path / "ckpt").tensors.keys()) == sorted(model)


class RunsCommand:
    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def test_malicious_metadata_is_refused_and_never_runs(tmp_path):
    write_torchtitan(tmp_path / "step-1", torchtitan_model(1))
    marker = tmp_path / "pwned"
    (tmp_path / "step-1" / ".metadata").write_bytes(pickle.dumps(RunsCommand(f"touch {marker}")))
    with pytest.raises(CkptScanError, match=r"step-1/\.metadata: refusing to unpickle DCP metadata.*system"):
        open_checkpoint(tmp_path / "step-1")
    assert not marker.exists()


def test_missing_or_truncated_distcp_file_is_refused(tmp_path):
    write_torchtitan(tmp_path / "step-1", torchtitan_model(1))
    data_file = tmp_path / "step-1" / "__0_0.distcp"
    data = data_file.read_bytes()
    data_file.write_bytes(data[:100])
    with pytest.raises(CkptScanError, match="__0_0.distcp' is 100 bytes"):
        open_checkpoint(tmp_path / "step-1")
    data_file.unlink()
    with pytest.raises(CkptScanError, match="names '__0_0.distcp', which does not exist"):
        open_checkpoint(tmp_path / "step-1")


def test_chunks_that_do_not_cover_a_tensor_are_refused(tmp_path):
    model = torchtitan_model(1)
    write_torchtitan(tmp_path / "step-1", model)
    path = tmp_path / "step-1" / ".metadata"
    with open(path, "rb") as f:
        metadata = _MetadataUnpickler(f).load()
    metadata.state_dict_metadata["layers.0.attention.wq.weight"].chunks.pop()  # a rank's chunk lost
    path.write_bytes(pickle.dumps(metadata))
    tensors = open_checkpoint(tmp_path / "step-1").tensors
    with pytest.raises(CkptScanError, match="cover only 512 of the 1024 values"):
        tensors.get("layers.0.attention.wq.weight")
    assert torch.equal(tensors.get("layers.0.attention.wq.weight", rows=(0, 16)),
                       model["layers.0.attention.wq.weight"][:16])


def test_optimizer_only_dcp_is_not_a_model(tmp_path):
    write_dcp(tmp_path / "ckpt", {"optimizer": {"state": {"0": {"exp_avg": torch.ones(3)}}}})
    with pytest.raises(CkptScanError, match="no model tensors"):
        open_checkpoint(tmp_path / "ckpt")


def test_metadata_pointing_outside_the_checkpoint_is_refused(tmp_path):
    write_torchtitan(tmp_path / "step-1", torchtitan_model(1))
    path = tmp_path / "step-1" / ".metadata"
    with open(path, "rb") as f:
        metadata = _MetadataUnpickler(f).load()
    for info in metadata.storage_data.values():
        info.relative_path = "../../etc/passwd"
    path.write_bytes(pickle.dumps(metadata))
    with pytest.raises(CkptScanError, match="points outside the checkpoint"):
        open_checkpoint(tmp_path / "step-1")


def test_the_planner_classes_allowed_in_metadata_are_plain_data():
    """Megatron-Core's `all_local_plans` bring the planner's classes into
    `.metadata`: each is a dataclass (unpickled by filling its fields) or an
    Enum (looked up by value), with no unpickling hook of its own."""
    import dataclasses
    import enum
    import importlib

    from ckptscan.readers.dcp import _METADATA_CLASSES

    planner = [(m, n) for m, n in _METADATA_CLASSES if m == "torch.distributed.checkpoint.planner"
               or n == "_StoragePrefix"]
    assert len(planner) == 6
    for module, name in planner:
        cls = getattr(importlib.import_module(module), name)
        assert dataclasses.is_dataclass(cls) or issubclass(cls, enum.Enum), name
        base = enum.Enum if issubclass(cls, enum.Enum) else object
        for hook in ("__new__", "__reduce__", "__reduce_ex__", "__setstate__"):
            assert getattr(cls, hook, None) == getattr(base, hook, None), (name, hook)
