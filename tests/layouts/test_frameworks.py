"""Training-framework checkpoints end to end: Megatron-Core (legacy shards and
torch_dist), legacy Megatron GPT (three checkpoint_versions), nanoGPT,
torchtitan (2025 and 2026 names, MLA) and OLMo-core. Each test writes the
framework's own file layout (tests/format_writers.py) with QKV rows fused
from per-head blocks it drew first, and compares the scan per head with the
dense reference of those blocks."""

from __future__ import annotations

import json

import pytest
import torch
from format_writers import megatron_args, write_dcp, write_megatron_legacy, write_megatron_torch_dist, write_nanogpt
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
from ckptscan.layouts import HeadOverrides

D, E = 32, 4
BF16 = torch.bfloat16


def megatron_grouped(q, k, v, gate=None):
    """linear_qkv rows: G × [q·(H/G) | (gate·(H/G)) | k | v] ("q1 q2 k1 v1 | q3 q4 k2 v2")."""
    heads, kv_heads = q.shape[0], k.shape[0]
    per = heads // kv_heads
    groups = []
    for g in range(kv_heads):
        parts = [q[g * per:(g + 1) * per]] + ([gate[g * per:(g + 1) * per]] if gate is not None else [])
        groups.append(torch.cat(parts + [k[g:g + 1], v[g:g + 1]]))
    return torch.cat(groups).reshape(-1, q.shape[-1])


def test_megatron_core_tensor_parallel_shards_with_gqa_and_expert_bias_routers(tmp_path):
    heads, groups, d, layers, tp = 4, 2, 8, 2, 2
    pairs = [head_pair(heads, groups, d, D, seed=10 * i, dtype=BF16) for i in range(layers)]
    routers = [router_pair(E, D, 50 + i, torch.float32) for i in range(layers)]
    biases = [(exact((E,), 60 + i, torch.float32), exact((E,), 70 + i, torch.float32)) for i in range(layers)]
    paths = []
    for side, step in enumerate((100, 200)):
        shards = {}
        for rank in range(tp):
            state = {}
            for i, pair in enumerate(pairs):
                q, k = (pair.q_a, pair.k_a) if side == 0 else (pair.q_b, pair.k_b)
                qkv = megatron_grouped(q, k, exact((groups, d, D), 5, BF16)).to(BF16)
                p = f"decoder.layers.{i}."
                # Column parallel: each rank holds whole query groups, in rank order.
                state[p + "self_attention.linear_qkv.weight"] = qkv.chunk(tp, dim=0)[rank].clone()
                state[p + "self_attention.linear_qkv.layer_norm_weight"] = torch.ones(D, dtype=BF16)
                state[p + "mlp.router.weight"] = routers[i][side].float()
                state[p + "mlp.router.expert_bias"] = biases[i][side].float()
            shards[(rank, 0)] = {"model": state}
        args = megatron_args(layers, D, heads, groups, E, tp=tp)
        args.moe_router_score_function, args.moe_router_enable_expert_bias = "sigmoid", True
        paths.append(write_megatron_legacy(tmp_path / "run", step, shards, args))
    report = scan(*paths)
    model = report.model
    assert (model.family, model.num_heads, model.num_kv_heads, model.head_dim) == ("megatron", heads, groups, d)
    assert (model.num_experts, model.top_k, model.router_scoring) == (E, 2, "sigmoid")
    for layer, pair in zip(report.pairs[0].layers, pairs, strict=True):
        assert_heads_match(layer, reference(pair.q_a, pair.k_a, pair.q_b, pair.k_b))
        assert_router_matches(layer, *routers[layer.layer], bias_b=biases[layer.layer][1])


def test_megatron_torch_dist_stacked_with_output_gate_and_zero_centred_qk_norm(tmp_path):
    heads, groups, d, layers = 4, 2, 8, 3
    pairs = [head_pair(heads, groups, d, D, seed=10 * i, dtype=BF16) for i in range(layers)]
    # --apply-layernorm-1p stores w and scales by 1 + w.
    gains = [[exact((d,), 90 + 2 * i + j, BF16, 0.3) for j in range(2)] for i in range(layers)]
    gains_b = [[nudged(g, 120 + 2 * i + j, BF16) for j, g in enumerate(pair)] for i, pair in enumerate(gains)]
    paths, folded = [], []
    for side, step in enumerate((10, 20)):
        qkv, q_norm, k_norm, truth = [], [], [], []
        for i, pair in enumerate(pairs):
            q, k = (pair.q_a, pair.k_a) if side == 0 else (pair.q_b, pair.k_b)
            gate = exact((heads, d, D), 7 + i, BF16)
            qkv.append(megatron_grouped(q, k, exact((groups, d, D), 5, BF16), gate=gate))
            g_q, g_k = (gains if side == 0 else gains_b)[i]
            q_norm.append(g_q)
            k_norm.append(g_k)
            truth.append((q * (1 + g_q)[None, :, None], k * (1 + g_k)[None, :, None]))
        folded.append(truth)
        tensors = {
            "decoder.layers.self_attention.linear_qkv.weight": torch.stack(qkv).to(BF16),
            "decoder.layers.self_attention.q_layernorm.weight": torch.stack(q_norm).to(BF16),
            "decoder.layers.self_attention.k_layernorm.weight": torch.stack(k_norm).to(BF16),
            "decoder.final_layernorm.weight": torch.ones(D, dtype=BF16),
        }
        args = megatron_args(layers, D, heads, groups, None)
        args.qk_layernorm, args.attention_output_gate, args.apply_layernorm_1p = True, True, True
        chunks = {name: [(0, layers)] for name in tensors if name.startswith("decoder.layers.")}
        paths.append(write_megatron_torch_dist(tmp_path / "run", step, tensors, args, chunks))
    report = scan(*paths)
    assert report.model.num_layers == layers
    for layer in report.pairs[0].layers:
        (qa, ka), (qb, kb) = folded[0][layer.layer], folded[1][layer.layer]
        assert_heads_match(layer, reference(qa, ka, qb, kb))


@pytest.mark.parametrize("version", [3.0, 1.0, 0])
def test_legacy_megatron_gpt_rows_follow_the_checkpoint_version(version, tmp_path, monkeypatch):
    heads, d = 4, 8
    pairs = [head_pair(heads, heads, d, D, seed=10 * i, dtype=BF16) for i in range(2)]

    def fuse(q, k, v):
        if version >= 2:  # [np, 3, hn]
            return torch.stack([q, k, v], dim=1).reshape(-1, D)
        if version == 1:  # [np, hn, 3]: rows interleave q, k, v
            return torch.stack([q, k, v], dim=2).reshape(-1, D)
        return torch.cat([q, k, v]).reshape(-1, D)  # [3, np, hn]

    # The writer saves the current version (3.0); older files carry theirs.
    save = torch.save
    monkeypatch.setattr(torch, "save", lambda obj, f, **kw: save(
        {**obj, "checkpoint_version": version} if isinstance(obj, dict) and "checkpoint_version" in obj else obj,
        f, **kw))
    paths = []
    for side, step in enumerate((100, 200)):
        encoder = {}
        for i, pair in enumerate(pairs):
            q, k = (pair.q_a, pair.k_a) if side == 0 else (pair.q_b, pair.k_b)
            encoder[f"layers.{i}.self_attention.query_key_value.weight"] = fuse(q, k, exact((heads, d, D), 3,
                                                                                             BF16)).to(BF16)
            encoder[f"layers.{i}.input_norm.weight"] = torch.ones(D, dtype=BF16)
        model = {"language_model": {"embedding": {"word_embeddings": {"weight": exact((16, D), 1, BF16).to(BF16)}},
                                    "encoder": encoder}}
        args = megatron_args(2, D, heads, heads, None)
        paths.append(write_megatron_legacy(tmp_path / "run", step, {(0, 0): {"model": model}}, args))
    report = scan(*paths)
    assert report.model.family == "megatron-legacy"
    for layer, pair in zip(report.pairs[0].layers, pairs, strict=True):
        assert_heads_match(layer, reference(pair.q_a, pair.k_a, pair.q_b, pair.k_b))


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
