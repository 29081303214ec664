"""Megatron-LM saves as real megatron-core writes them (tests/golden/megatron/
and the two-rank saves `format_writers.megatron_saves` has
tests/golden/make_megatron.py write): legacy `iter_NNNNNNN/mp_rank_*` shards
merged into the global model, and `torch_dist` stacked layers shown per layer.

What the reader returns is held to the files as torch itself reads them: the
rank files by `torch.load`, torch_dist saves by torch's own
`dcp_to_torch_save`, whose layer numbers are Megatron's own sharded offsets."""

import shutil
from pathlib import Path

import pytest
import torch
from format_writers import GOLDEN_MEGATRON, megatron_saves
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from ckptscan.errors import CkptScanError
from ckptscan.readers import open_checkpoint

HEADS, GROUPS, HEAD_DIM, HIDDEN = 4, 2, 8, 32
QKV = "self_attention.linear_qkv.weight"
LEGACY = GOLDEN_MEGATRON / "legacy" / "iter_0000020"


@pytest.fixture(scope="session")
def saves(tmp_path_factory) -> Path:
    return megatron_saves(tmp_path_factory)


def rank_file(directory: Path, rank: str = "mp_rank_00") -> dict:
    """A rank's model_optim_rng.pt as torch reads it (files megatron-core wrote for these tests: trusted)."""
    return torch.load(directory / rank / "model_optim_rng.pt", weights_only=False)


def torch_dist_tensors(directory: Path, tmp_path: Path) -> dict[str, torch.Tensor]:
    """A torch_dist save gathered by torch's DCP tools, stacked layers [L, ...]
    given per layer: the names Megatron-LM's torch-format files use."""
    out = tmp_path / f"{directory.parent.name}.pt"
    dcp_to_torch_save(directory, out)
    tensors = {}
    for name, value in torch.load(out, weights_only=False).items():  # our own conversion of a file we wrote
        if not isinstance(value, torch.Tensor):
            continue  # the `_extra_state` entries (None without Transformer Engine)
        if name.startswith("decoder.layers."):
            for i, layer in enumerate(value):
                tensors[name.replace("decoder.layers.", f"decoder.layers.{i}.", 1)] = layer
        else:
            tensors[name] = value
    return tensors


def assert_reads(checkpoint, expected: dict[str, torch.Tensor], names) -> None:
    for name in names:
        assert checkpoint.tensors.shape(name) == tuple(expected[name].shape), name
        assert torch.equal(checkpoint.tensors.get(name), expected[name]), name


def test_legacy_single_rank():
    model = rank_file(LEGACY)["model"]
    weights = {k: v for k, v in model.items() if isinstance(v, torch.Tensor)}
    assert len(weights) < len(model)  # the `_extra_state` entries, left out
    checkpoint = open_checkpoint(LEGACY)
    assert (checkpoint.format, checkpoint.step) == ("megatron", 20)
    assert sorted(checkpoint.tensors.keys()) == sorted(weights)
    assert_reads(checkpoint, weights, weights)
    args = checkpoint.meta["args"]
    assert (args["num_attention_heads"], args["num_query_groups"], args["kv_channels"]) == (HEADS, GROUPS, HEAD_DIM)
    assert args["params_dtype"] == "torch.float32" and args["ckpt_format"] == "torch"
    assert (checkpoint.meta["iteration"], checkpoint.meta["checkpoint_version"]) == (20, 3.0)
    assert checkpoint.tensors.dtype(f"decoder.layers.1.{QKV}") == "F32"


def test_legacy_tensor_parallel_merges_qkv_and_keeps_replicated(saves):
    """The dense weights resharded to TP 2: column-parallel linear_qkv holds one
    query group per rank and is merged; the other split tensors are left out, said why."""
    single = rank_file(LEGACY)["model"]
    checkpoint = open_checkpoint(saves / "legacy_tp2" / "iter_0000020")
    kept = [k for k in single if k.endswith(("linear_qkv.weight", "layernorm.weight"))]
    assert sorted(checkpoint.tensors.keys()) == sorted(kept)
    assert_reads(checkpoint, single, kept)
    qkv = f"decoder.layers.1.{QKV}"
    group_rows = (HEADS // GROUPS + 2) * HEAD_DIM
    rows = (group_rows - 8, group_rows + 8)  # across the rank boundary
    assert torch.equal(checkpoint.tensors.get(qkv, rows=rows), single[qkv][rows[0]:rows[1]])
    omitted = checkpoint.meta["omitted"]
    assert "tensor-parallel" in omitted["decoder.layers.0.self_attention.linear_proj.weight"]
    assert {"embedding.word_embeddings.weight", "output_layer.weight"} <= set(omitted)
    assert checkpoint.meta["tensor_parallel"] == 2


def test_legacy_pipeline_stages_are_renumbered(saves):
    """Each stage's file numbers its layers from 0 (one layer a stage here): merged, the single-rank model."""
    single = {k: v for k, v in rank_file(LEGACY)["model"].items() if isinstance(v, torch.Tensor)}
    assert [k for k in rank_file(saves / "legacy_pp2" / "iter_0000020", "mp_rank_00_001")["model"]
            if k.endswith(QKV)] == [f"decoder.layers.0.{QKV}"]
    checkpoint = open_checkpoint(saves / "legacy_pp2" / "iter_0000020")
    assert sorted(checkpoint.tensors.keys()) == sorted(single)
    assert_reads(checkpoint, single, single)
    assert checkpoint.meta["pipeline_parallel"] == 2


def test_legacy_uneven_pipeline_stages_are_renumbered(saves, tmp_path):
    """3 MoE layers split 2 + 1 (--decoder-first-pipeline-num-layers 2): the
    second stage's layer 0 is layer 2, router included, as in the torch_dist save."""
    reference = torch_dist_tensors(saves / "uneven" / "iter_0000010", tmp_path)
    stages = [rank_file(saves / "legacy_uneven" / "iter_0000010", f"mp_rank_00_00{p}")["model"] for p in (0, 1)]
    assert [sum(k.endswith(QKV) for k in stage) for stage in stages] == [2, 1]
    checkpoint = open_checkpoint(saves / "legacy_uneven" / "iter_0000010")
    names = [f"decoder.layers.{i}.{part}" for i in range(3) for part in (QKV, "mlp.router.weight")]
    assert_reads(checkpoint, reference, [*names, "embedding.word_embeddings.weight", "decoder.final_layernorm.weight",
                                         "output_layer.weight"])
    assert checkpoint.meta["pipeline_parallel"] == 2


def test_legacy_virtual_pipeline_chunks_interleave(saves, tmp_path):
    """--num-layers-per-virtual-pipeline-stage: each rank file holds `model0`
    and `model1`, chunk v of rank p layer 2v + p of four."""
    iteration = saves / "legacy_vpp" / "iter_0000010"
    assert {k for k in rank_file(iteration, "mp_rank_00_001") if k.startswith("model")} == {"model0", "model1"}
    reference = torch_dist_tensors(saves / "vpp" / "iter_0000010", tmp_path)
    checkpoint = open_checkpoint(iteration)
    assert_reads(checkpoint, reference, [f"decoder.layers.{i}.{QKV}" for i in range(4)])
    assert_reads(checkpoint, reference, ["embedding.word_embeddings.weight", "output_layer.weight"])


def test_a_rank_file_opens_its_whole_iteration(saves):
    directory = saves / "legacy_tp2" / "iter_0000010"
    checkpoint = open_checkpoint(directory / "mp_rank_01" / "model_optim_rng.pt")
    assert checkpoint.path == directory
    single = rank_file(GOLDEN_MEGATRON / "legacy" / "iter_0000010")["model"]
    assert_reads(checkpoint, single, [f"decoder.layers.0.{QKV}"])


def test_legacy_missing_shard_is_refused(saves, tmp_path):
    directory = tmp_path / "iter_0000010"
    shutil.copytree(saves / "legacy_tp2" / "iter_0000010", directory)
    (directory / "mp_rank_01" / "model_optim_rng.pt").unlink()
    with pytest.raises(CkptScanError, match="missing shard mp_rank_01/model_optim_rng.pt"):
        open_checkpoint(directory)


def test_torch_dist_stacked_layers_read_per_layer(tmp_path):
    directory = GOLDEN_MEGATRON / "dense" / "iter_0000020"
    reference = torch_dist_tensors(directory, tmp_path)
    checkpoint = open_checkpoint(directory)
    assert (checkpoint.format, checkpoint.step) == ("megatron-torch_dist", 20)
    assert sorted(checkpoint.tensors.keys()) == sorted(reference)  # per-layer names
    assert_reads(checkpoint, reference, reference)
    assert checkpoint.meta["args"]["num_query_groups"] == GROUPS and checkpoint.meta["iteration"] == 20
    assert checkpoint.meta["stacked_layers"] == 2 and checkpoint.meta["sharded_backend"] == "torch_dist"


def test_torch_dist_chunks_of_tensor_parallel_ranks_read_across_their_boundary(saves, tmp_path):
    """At TP 2 each layer's linear_qkv is two chunks, one query group each."""
    reference = torch_dist_tensors(GOLDEN_MEGATRON / "dense" / "iter_0000020", tmp_path)
    checkpoint = open_checkpoint(saves / "tp2" / "iter_0000020")
    assert sorted(checkpoint.tensors.keys()) == sorted(reference)
    assert_reads(checkpoint, reference, reference)
    qkv = f"decoder.layers.1.{QKV}"
    assert torch.equal(checkpoint.tensors.get(qkv, rows=(20, 45)), reference[qkv][20:45])
