"""Megatron-LM: legacy `iter_NNNNNNN/mp_rank_*` shards merged into the global
model, and `torch_dist` stacked layers shown per layer."""

import io
from collections import OrderedDict

import pytest
import torch
from factories import random_weights
from format_writers import megatron_args, write_megatron_legacy, write_megatron_torch_dist

from ckptscan.errors import CkptScanError
from ckptscan.readers import open_checkpoint

D, H, G, KV_CHANNELS, E, V = 32, 4, 2, 8, 4, 16
QKV = "self_attention.linear_qkv.weight"

COLUMN_PARALLEL = ("linear_qkv.weight", "linear_fc1.weight", "word_embeddings.weight", "output_layer.weight")
ROW_PARALLEL = ("linear_proj.weight", "linear_fc2.weight")


def global_model(layers: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """The unsharded Megatron-Core GPT (TE spec) state dict, bf16."""
    tensors = {"embedding.word_embeddings.weight": random_weights((V, D), seed)}
    for i in range(layers):
        p, s = f"decoder.layers.{i}.", seed * 100 + i * 10
        tensors[p + "self_attention.linear_qkv.layer_norm_weight"] = random_weights((D,), s + 1) + 1
        tensors[p + QKV] = random_weights(((H + 2 * G) * KV_CHANNELS, D), s + 2)
        tensors[p + "self_attention.linear_proj.weight"] = random_weights((D, H * KV_CHANNELS), s + 3)
        tensors[p + "pre_mlp_layernorm.weight"] = random_weights((D,), s + 4) + 1
        tensors[p + "mlp.router.weight"] = random_weights((E, D), s + 5)
        tensors[p + "mlp.router.expert_bias"] = random_weights((E,), s + 6)
        tensors[p + "mlp.experts.local_experts.0.linear_fc1.weight"] = random_weights((4 * D, D), s + 7)
    tensors["decoder.final_layernorm.weight"] = random_weights((D,), seed + 7) + 1
    tensors["output_layer.weight"] = random_weights((V, D), seed + 8)
    return {k: v.to(torch.bfloat16) for k, v in tensors.items()}


def rank_state(model: dict[str, torch.Tensor], layers: list[int], tp: int, rank: int, first: bool,
               last: bool) -> OrderedDict:
    """One (tensor rank, pipeline chunk) state dict as Megatron saves it: local
    layer numbers, TP shards, TE `_extra_state` entries."""
    state = OrderedDict()
    for name, value in model.items():
        if name.startswith("decoder.layers."):
            layer = int(name.split(".")[2])
            if layer not in layers:
                continue
            name = name.replace(f"decoder.layers.{layer}.", f"decoder.layers.{layers.index(layer)}.", 1)
        elif name.startswith("embedding."):
            if not first:
                continue
        elif not last:  # final_layernorm, output_layer
            continue
        if name.endswith(COLUMN_PARALLEL):
            value = value.chunk(tp, dim=0)[rank]
        elif name.endswith(ROW_PARALLEL):
            value = value.chunk(tp, dim=1)[rank]
        state[name] = value.clone()
        if name.endswith("linear_qkv.weight"):
            state[name.replace(".weight", "._extra_state")] = io.BytesIO(b"te fp8 meta")
    return state


def write_run(save_dir, model, tp=1, stages=None, iteration=1000):
    """`stages[p][v]` = global layers of pipeline rank p, virtual chunk v."""
    layers = sorted({int(k.split(".")[2]) for k in model if k.startswith("decoder.layers.")})
    stages = stages or [[layers]]
    pp, vpp = len(stages), len(stages[0])
    shards = {}
    for p, chunks in enumerate(stages):
        for t in range(tp):
            models = {}
            for v, chunk_layers in enumerate(chunks):
                key = "model" if vpp == 1 else f"model{v}"
                models[key] = rank_state(model, chunk_layers, tp, t, first=p == 0 and v == 0,
                                         last=p == pp - 1 and v == vpp - 1)
            shards[(t, p)] = models
    args = megatron_args(len(layers), D, H, G, E, tp=tp, pp=pp, vpp=vpp if vpp > 1 else None)
    return write_megatron_legacy(save_dir, iteration, shards, args)


def assert_reads(checkpoint, model, names):
    for name in names:
        assert checkpoint.tensors.shape(name) == tuple(model[name].shape), name
        assert torch.equal(checkpoint.tensors.get(name).double(), model[name].double()), name


def test_legacy_single_rank(tmp_path):
    model = global_model(2)
    directory = write_run(tmp_path / "save", model)
    checkpoint = open_checkpoint(directory)
    assert (checkpoint.format, checkpoint.step) == ("megatron", 1000)
    assert sorted(checkpoint.tensors.keys()) == sorted(model)  # `_extra_state` left out
    assert_reads(checkpoint, model, model)
    args = checkpoint.meta["args"]
    assert (args["num_attention_heads"], args["num_query_groups"], args["kv_channels"]) == (H, G, KV_CHANNELS)
    assert args["params_dtype"] == "torch.bfloat16" and "AttnBackend" in args["attention_backend"]
    assert (checkpoint.meta["iteration"], checkpoint.meta["checkpoint_version"]) == (1000, 3.0)
    assert checkpoint.tensors.dtype(f"decoder.layers.1.{QKV}") == "BF16"


def test_legacy_tensor_parallel_merges_qkv_and_keeps_replicated(tmp_path):
    model = global_model(2, seed=1)
    checkpoint = open_checkpoint(write_run(tmp_path / "save", model, tp=2))
    qkv = f"decoder.layers.1.{QKV}"
    kept = [k for k in model if k.endswith(("linear_qkv.weight", "layer_norm_weight", "layernorm.weight",
                                            "router.weight", "router.expert_bias"))]
    assert sorted(checkpoint.tensors.keys()) == sorted(kept)
    assert_reads(checkpoint, model, kept)
    rows = (KV_CHANNELS * 3, KV_CHANNELS * 6)  # crosses the rank boundary at (H + 2G) * d / 2 = 32
    assert torch.equal(checkpoint.tensors.get(qkv, rows=rows), model[qkv][rows[0]:rows[1]])
    omitted = checkpoint.meta["omitted"]
    assert "tensor-parallel" in omitted["decoder.layers.0.self_attention.linear_proj.weight"]
    assert "embedding.word_embeddings.weight" in omitted
    assert checkpoint.meta["tensor_parallel"] == 2


def test_legacy_pipeline_stages_are_renumbered(tmp_path):
    model = global_model(3, seed=2)
    # Uneven split: 2 layers on the first stage, 1 on the last.
    checkpoint = open_checkpoint(write_run(tmp_path / "save", model, tp=2, stages=[[[0, 1]], [[2]]]))
    names = [f"decoder.layers.{i}.{QKV}" for i in range(3)] + ["decoder.layers.2.mlp.router.weight",
                                                               "decoder.final_layernorm.weight"]
    assert_reads(checkpoint, model, names)
    assert checkpoint.meta["pipeline_parallel"] == 2


def test_legacy_virtual_pipeline_chunks_interleave(tmp_path):
    model = global_model(4, seed=3)
    # Megatron's interleaved schedule: chunk v of rank p holds layer v * pp + p.
    stages = [[[0], [2]], [[1], [3]]]
    checkpoint = open_checkpoint(write_run(tmp_path / "save", model, stages=stages))
    assert_reads(checkpoint, model, [f"decoder.layers.{i}.{QKV}" for i in range(4)])
    assert_reads(checkpoint, model, ["embedding.word_embeddings.weight", "output_layer.weight"])


def test_a_rank_file_opens_its_whole_iteration(tmp_path):
    model = global_model(2, seed=4)
    directory = write_run(tmp_path / "save", model, tp=2)
    checkpoint = open_checkpoint(directory / "mp_rank_01" / "model_optim_rng.pt")
    assert checkpoint.path == directory
    assert_reads(checkpoint, model, [f"decoder.layers.0.{QKV}"])


def test_legacy_missing_shard_is_refused(tmp_path):
    directory = write_run(tmp_path / "save", global_model(2), tp=2)
    (directory / "mp_rank_01" / "model_optim_rng.pt").unlink()
    with pytest.raises(CkptScanError, match="missing shard mp_rank_01/model_optim_rng.pt"):
        open_checkpoint(directory)


def stacked(model: dict[str, torch.Tensor], layers: int) -> dict[str, torch.Tensor]:
    """torch_dist keys: homogeneous layers stacked on a leading [L] axis."""
    out = {k: v for k, v in model.items() if not k.startswith("decoder.layers.")}
    for name in {k.split(".", 3)[3] for k in model if k.startswith("decoder.layers.")}:
        out[f"decoder.layers.{name}"] = torch.stack([model[f"decoder.layers.{i}.{name}"] for i in range(layers)])
    return out


def test_torch_dist_stacked_layers_read_per_layer(tmp_path):
    model = global_model(3, seed=5)
    tensors = stacked(model, 3)
    tensors["optimizer.state.exp_avg.decoder.layers.self_attention.linear_qkv.weight"] = torch.zeros(3, 64, D)
    # Chunks as written by PP=3 x TP=2 ranks: one per layer, qkv rows split in two.
    chunks = {name: [(0, 3)] for name in tensors if name.startswith("decoder.layers.")}
    chunks[f"decoder.layers.{QKV}"] = [(0, 3), (1, 2)]
    args = megatron_args(3, D, H, G, E)
    directory = write_megatron_torch_dist(tmp_path / "save", 2000, tensors, args, chunks)
    checkpoint = open_checkpoint(directory)
    assert (checkpoint.format, checkpoint.step) == ("megatron-torch_dist", 2000)
    assert sorted(checkpoint.tensors.keys()) == sorted(model)  # per-layer names, no optimizer state
    assert_reads(checkpoint, model, model)
    qkv = f"decoder.layers.2.{QKV}"
    assert torch.equal(checkpoint.tensors.get(qkv, rows=(20, 45)), model[qkv][20:45])
    assert checkpoint.meta["args"]["num_query_groups"] == G and checkpoint.meta["iteration"] == 2000
    assert checkpoint.meta["stacked_layers"] == 3 and checkpoint.meta["sharded_backend"] == "torch_dist"
