"""Training-framework checkpoints end to end: Megatron-Core (tensor-parallel
saves real megatron-core writes, held to Megatron's own q/k split), legacy
Megatron GPT (three checkpoint_versions), nanoGPT, torchtitan (2025 and 2026
names, MLA) and OLMo-core. Each of the others writes the framework's own file
layout (tests/format_writers.py) with QKV rows fused from per-head blocks it
drew first, and compares the scan per head with the dense reference of those
blocks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from format_writers import GOLDEN_MEGATRON, megatron_saves, write_dcp, write_nanogpt
from layout_factories import (
    assert_heads_match,
    assert_router_matches,
    exact,
    head_pair,
    nudged,
    reference,
    router_pair,
    scan,
)

from ckptscan.errors import CkptScanError
from ckptscan.layouts import HeadOverrides, resolve_layout
from ckptscan.readers.base import Checkpoint, dtype_name

D, E = 32, 4
BF16 = torch.bfloat16


@pytest.fixture(scope="session")
def megatron(tmp_path_factory) -> Path:
    return megatron_saves(tmp_path_factory)


def megatron_split(iteration: int) -> dict[str, torch.Tensor]:
    """Megatron's own q/k split of the dense run's iteration (make_megatron.py `megatron_split`)."""
    return torch.load(GOLDEN_MEGATRON / "megatron_split" / "dense" / f"iter_{iteration:07d}.pt", weights_only=True)


@pytest.mark.parametrize("run", ["tp2", "legacy_tp2"])
def test_megatron_core_tensor_parallel_saves_with_gqa(megatron, run):
    """The dense GQA run resharded to TP 2 by megatron-core, each rank one
    query group of linear_qkv: as torch_dist chunks and as rank files."""
    report = scan(megatron / run / "iter_0000010", megatron / run / "iter_0000020")
    model = report.model
    assert (model.family, model.num_heads, model.num_kv_heads, model.head_dim) == ("megatron", 4, 2, 8)
    a, b = megatron_split(10), megatron_split(20)
    for layer in report.pairs[0].layers:
        i = layer.layer
        assert_heads_match(layer, reference(a[f"{i}.query"], a[f"{i}.key"], b[f"{i}.query"], b[f"{i}.key"]))


def folded_split(run: str, iteration: int) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, Megatron's q/k blocks before its QK norms, each scaled by its
    norm's gain (diag(γ) W_h, in float64): the weights the logits see."""
    split = torch.load(GOLDEN_MEGATRON / "megatron_split" / run / f"iter_{iteration:07d}.pt", weights_only=True)
    f64 = torch.float64
    return {i: (split[f"{i}.query"].to(f64) * split[f"{i}.q_norm"].to(f64)[None, :, None],
                split[f"{i}.key"].to(f64) * split[f"{i}.k_norm"].to(f64)[None, :, None]) for i in range(2)}


def test_megatron_torch_dist_stacked_with_output_gate_and_qk_norm():
    """--attention-output-gate puts each query head's gate rows after it in
    linear_qkv ([q, gate, k, v] per group); --qk-layernorm's gains fold into
    the heads. (Zero-centred gains, --apply-layernorm-1p, need Transformer
    Engine or Apex norms: megatron-core's torch norms refuse them, so no save
    here has them.)"""
    run = GOLDEN_MEGATRON / "gated"
    report = scan(run / "iter_0000010", run / "iter_0000020")
    assert (report.model.num_layers, report.model.num_kv_heads, report.model.head_dim) == (2, 2, 8)
    a, b = folded_split("gated", 10), folded_split("gated", 20)
    for layer in report.pairs[0].layers:
        assert_heads_match(layer, reference(*a[layer.layer], *b[layer.layer]))


class Tensors(dict):
    """Named tensors in memory, read as a checkpoint's (`readers.base.TensorSource`)."""

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self[name].shape)

    def dtype(self, name: str) -> str:
        return dtype_name(self[name].dtype)

    def get(self, name: str, rows: tuple[int, int] | None = None) -> torch.Tensor:
        return self[name] if rows is None else self[name][rows[0]:rows[1]]


@pytest.mark.parametrize("version", [3.0, 1.0, 0])
def test_legacy_megatron_gpt_rows_follow_the_checkpoint_version(version):
    """Megatron-LM's legacy GPT (before Megatron-Core) is no longer written by
    any megatron-core release, so its model_optim_rng.pt files cannot be made
    for real: the layout is given the tensors and metadata the legacy reader
    returns for one, and its q/k blocks are those the rows were fused from."""
    heads, d = 4, 8
    blocks = [(exact((heads, d, D), 10 * i + 1, BF16), exact((heads, d, D), 10 * i + 2, BF16)) for i in range(2)]

    def fuse(q, k, v):
        if version >= 2:  # [np, 3, hn]
            return torch.stack([q, k, v], dim=1).reshape(-1, D)
        if version == 1:  # [np, hn, 3]: rows interleave q, k, v
            return torch.stack([q, k, v], dim=2).reshape(-1, D)
        return torch.cat([q, k, v]).reshape(-1, D)  # [3, np, hn]

    tensors = Tensors({f"language_model.encoder.layers.{i}.self_attention.query_key_value.weight":
                       fuse(q, k, exact((heads, d, D), 3, BF16)).to(BF16) for i, (q, k) in enumerate(blocks)})
    args = {"num_layers": 2, "hidden_size": D, "num_attention_heads": heads, "kv_channels": d}
    checkpoint = Checkpoint(path=Path("iter_0000100"), format="megatron", step=100, tensors=tensors,
                            meta={"args": args, "checkpoint_version": version, "iteration": 100})
    layout = resolve_layout(checkpoint, HeadOverrides())
    assert layout.info.family == "megatron-legacy"
    for plan, (q, k) in zip(layout.layers, blocks, strict=True):
        weights = plan.build({name: tensors[name] for name in plan.tensors}, torch.float64)
        assert torch.equal(weights.q, q.double()) and torch.equal(weights.k, k.double()), plan.layer


def test_nanogpt_compiled_ckpt_with_model_args(tmp_path):
    heads, d = 4, 8
    pairs = [head_pair(heads, heads, d, D, seed=10 * i, dtype=torch.float32) for i in range(2)]
    paths = []
    for side in range(2):
        tensors = {"transformer.wte.weight": exact((16, D), 1, torch.float32).float()}
        for i, pair in enumerate(pairs):
            q, k = (pair.q_a, pair.k_a) if side == 0 else (pair.q_b, pair.k_b)
            # nn.Linear(n_embd, 3·n_embd): rows [Q | K | V], no transpose.
            tensors[f"transformer.h.{i}.attn.c_attn.weight"] = torch.cat(
                [q.reshape(-1, D), k.reshape(-1, D), exact((D, D), 2, torch.float32)]).float()
        model_args = {"n_layer": 2, "n_head": heads, "n_embd": D, "block_size": 64, "bias": False, "vocab_size": 16}
        paths.append(write_nanogpt(tmp_path / f"out{side}", tensors, model_args, iter_num=100 * (side + 1)))
    report = scan(*paths)
    assert (report.model.family, report.model.num_heads) == ("nanogpt", heads)
    for layer, pair in zip(report.pairs[0].layers, pairs, strict=True):
        assert_heads_match(layer, reference(pair.q_a, pair.k_a, pair.q_b, pair.k_b))


@pytest.mark.parametrize("names", ["2025", "2026"])
def test_torchtitan_dcp_needs_num_heads_and_reads_routers(names, tmp_path):
    heads, kv_heads, d = 8, 2, 4
    pairs = [head_pair(heads, kv_heads, d, D, seed=10 * i, dtype=BF16) for i in range(2)]
    routers = [router_pair(E, D, 40 + i, torch.float32) for i in range(2)]
    biases = [(exact((E,), 60 + i, torch.float32), exact((E,), 70 + i, torch.float32)) for i in range(2)]
    attention = "attention.qkv_linear." if names == "2026" else "attention."
    bias = "moe.expert_bias_E" if names == "2026" else "moe.expert_bias"
    paths = []
    for side in range(2):
        state = {"tok_embeddings.weight": exact((16, D), 1, BF16).to(BF16)}
        for i, pair in enumerate(pairs):
            q, k = (pair.q_a, pair.k_a) if side == 0 else (pair.q_b, pair.k_b)
            state[f"layers.{i}.{attention}wq.weight"] = q.reshape(-1, D).to(BF16)
            state[f"layers.{i}.{attention}wk.weight"] = k.reshape(-1, D).to(BF16)
            state[f"layers.{i}.moe.router.gate.weight"] = routers[i][side].float()
            state[f"layers.{i}.{bias}"] = biases[i][side].float()
        state["optimizer"] = {"state": {"layers.0.attention.wq.weight": {"exp_avg": torch.zeros(2)}}}
        paths.append(write_dcp(tmp_path / f"step-{side + 1}", state))
    with pytest.raises(CkptScanError, match="--num-heads"):
        scan(*paths)
    report = scan(*paths, overrides=HeadOverrides(num_heads=heads))
    assert (report.model.num_heads, report.model.num_kv_heads, report.model.head_dim) == (heads, kv_heads, d)
    assert report.model.router_scoring is None  # a training setting the checkpoint does not record
    for layer, pair in zip(report.pairs[0].layers, pairs, strict=True):
        assert_heads_match(layer, reference(pair.q_a, pair.k_a, pair.q_b, pair.k_b))
        assert_router_matches(layer, *routers[layer.layer], bias_b=biases[layer.layer][1])


def test_olmo_core_flat_router_flat_qk_norm_and_model_prefix(tmp_path):
    heads, kv_heads, d = 4, 4, 8
    pairs = [head_pair(heads, kv_heads, d, D, seed=10 * i, dtype=torch.float32) for i in range(2)]
    routers = [router_pair(E, D, 40 + i, torch.float32) for i in range(2)]
    gains = [[(exact((n * d,), 80 + 2 * i + j, torch.float32, 0.3) + 1) for j, n in enumerate((heads, kv_heads))]
             for i in range(2)]
    paths, folded = [], []
    for side in range(2):
        state, truth = {}, []
        for i, pair in enumerate(pairs):
            q, k = (pair.q_a, pair.k_a) if side == 0 else (pair.q_b, pair.k_b)
            g_q, g_k = gains[i] if side == 0 else [nudged(g, 90 + j, torch.float32) for j, g in enumerate(gains[i])]
            p = f"model.blocks.{i}."
            state[p + "attention.w_q.weight"] = q.reshape(-1, D).float()
            state[p + "attention.w_k.weight"] = k.reshape(-1, D).float()
            state[p + "attention.q_norm.weight"] = g_q.float()  # over the flat projection [H·d]
            state[p + "attention.k_norm.weight"] = g_k.float()
            state[p + "feed_forward_moe.router.weight"] = routers[i][side].reshape(-1).float()  # flat [E·D]
            state[p + "feed_forward_moe.router.score_bias"] = torch.zeros(E)
            truth.append((q * g_q.reshape(heads, d, 1), k * g_k.reshape(kv_heads, d, 1)))
        folded.append(truth)
        state["optim"] = {"state": {"x": torch.zeros(2)}}
        step = write_dcp(tmp_path / f"step{side + 1}" / "model_and_optim", state).parent
        # ConfigSaverCallback's experiment config; .metadata.json is written last.
        (step / "config.json").write_text(json.dumps({"model": {"d_model": D, "block": {
            "sequence_mixer": {"n_heads": heads}, "feed_forward_moe": {
                "num_experts": E, "router": {"top_k": 2, "gating_function": "softmax"}}}}}))
        (step / ".metadata.json").write_text("{}")
        paths.append(step)
    report = scan(*paths)
    assert (report.model.family, report.model.num_experts, report.model.top_k) == ("olmo-core", E, 2)
    assert report.model.router_scoring == "softmax"
    for layer in report.pairs[0].layers:
        (qa, ka), (qb, kb) = folded[0][layer.layer], folded[1][layer.layer]
        assert_heads_match(layer, reference(qa, ka, qb, kb))
        assert_router_matches(layer, *routers[layer.layer])


def test_torchtitan_deepseek_mla_names(tmp_path):
    """torchtitan's DeepSeek-V3 names the MLA factors wq_a/q_norm/wq_b and
    wkv_a/kv_norm/wkv_b (its state_dict_adapter maps them to HF's)."""
    from test_deepseek import mla_layer

    layers = [mla_layer(7), mla_layer(8)]
    paths = []
    rename = {"q_a_proj": "wq_a", "q_a_layernorm": "q_norm", "q_b_proj": "wq_b", "kv_a_proj_with_mqa": "wkv_a",
              "kv_a_layernorm": "kv_norm", "kv_b_proj": "wkv_b", "o_proj": "wo"}
    for side, layer in enumerate(layers):
        state = {}
        for name, value in layer.tensors("model.layers.0.").items():
            module = name.split(".")[-2]
            state[f"layers.0.attention.{rename[module]}.weight"] = value.to(BF16)
        paths.append(write_dcp(tmp_path / f"step-{side}", state))
    report = scan(*paths, overrides=HeadOverrides(num_heads=4))
    assert report.model.rope_head_dim == 4
    assert_heads_match(report.pairs[0].layers[0], reference(*layers[0].content(), *layers[1].content()))
