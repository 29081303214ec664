"""GPT-2, GPT-NeoX, Phi-3, Falcon (three layouts), GPT-J, BERT and Switch:
each test fuses (and transposes) per-head blocks into the family's on-disk
layout with code that follows the family's own modelling source, writes a
pair of HF checkpoints, scans them and compares every head with the dense
reference of the blocks it started from."""

from __future__ import annotations

import pytest
import torch
from factories import write_hf_checkpoint
from layout_factories import (
    HeadPair,
    assert_heads_match,
    assert_router_matches,
    exact,
    head_pair,
    reference,
    router_pair,
    scan,
)

from ckptscan.errors import CkptScanError
from ckptscan.layouts import HeadOverrides

D = 32


def _value_blocks(n: int, d: int, side: int) -> torch.Tensor:
    return exact((n, d, D), 900 + side, torch.float32)


def _write_pair(tmp_path, pairs: list[HeadPair], to_tensors, config: dict | None, dtype: torch.dtype):
    """Checkpoints a and b: `to_tensors(layer, q, k, side)` lays one layer out on disk."""
    for side, name in enumerate(("checkpoint-1", "checkpoint-2")):
        tensors = {}
        for layer, pair in enumerate(pairs):
            q, k = (pair.q_a, pair.k_a) if side == 0 else (pair.q_b, pair.k_b)
            tensors.update(to_tensors(layer, q, k, side))
        write_hf_checkpoint(tmp_path / name, tensors, config, dtype=dtype)
    return tmp_path / "checkpoint-1", tmp_path / "checkpoint-2"


def _check(report, pairs: list[HeadPair]) -> None:
    for layer, pair in zip(report.pairs[0].layers, pairs, strict=True):
        assert_heads_match(layer, reference(pair.q_a, pair.k_a, pair.q_b, pair.k_b))


def test_gpt2_conv1d_is_transposed_then_split_q_k_v(tmp_path):
    heads, d = 4, 8
    pairs = [head_pair(heads, heads, d, D, seed=10 * i, dtype=torch.float32) for i in range(2)]

    def layer(i, q, k, side):
        v = _value_blocks(heads, d, side)
        # Conv1D: y = x @ W with W [in, out]; out = [q | k | v], head h = columns h·d:(h+1)·d.
        w = torch.cat([x.reshape(heads * d, D).T for x in (q, k, v)], dim=1)
        return {f"h.{i}.attn.c_attn.weight": w, f"h.{i}.attn.c_attn.bias": torch.zeros(3 * D),
                f"h.{i}.attn.c_proj.weight": exact((D, D), 5, torch.float32)}

    config = {"model_type": "gpt2", "n_embd": D, "n_head": heads, "n_layer": 2}
    report = scan(*_write_pair(tmp_path, pairs, layer, config, torch.float32))
    assert (report.model.family, report.model.num_heads, report.model.head_dim) == ("gpt2", 4, 8)
    _check(report, pairs)


def test_gpt_neox_interleaves_q_k_v_per_head(tmp_path):
    heads, d = 4, 8
    pairs = [head_pair(heads, heads, d, D, seed=10 * i, dtype=torch.float16) for i in range(2)]

    def layer(i, q, k, side):
        # view(H, 3d): head h rows h·3d + [q | k | v].
        w = torch.stack([q, k, _value_blocks(heads, d, side)], dim=1).reshape(3 * heads * d, D)
        return {f"gpt_neox.layers.{i}.attention.query_key_value.weight": w}

    config = {"model_type": "gpt_neox", "hidden_size": D, "num_attention_heads": heads, "rotary_pct": 0.25}
    _check(scan(*_write_pair(tmp_path, pairs, layer, config, torch.float16)), pairs)


def test_phi3_qkv_proj_is_blocked(tmp_path):
    heads, kv_heads, d = 4, 2, 8
    pairs = [head_pair(heads, kv_heads, d, D, seed=10 * i, dtype=torch.bfloat16) for i in range(2)]

    def layer(i, q, k, side):
        w = torch.cat([q.reshape(-1, D), k.reshape(-1, D), _value_blocks(kv_heads, d, side).reshape(-1, D)])
        return {f"model.layers.{i}.self_attn.qkv_proj.weight": w}

    config = {"model_type": "phi3", "hidden_size": D, "num_attention_heads": heads, "num_key_value_heads": kv_heads}
    report = scan(*_write_pair(tmp_path, pairs, layer, config, torch.bfloat16))
    assert (report.model.num_heads, report.model.num_kv_heads) == (4, 2)
    _check(report, pairs)


def _falcon_grouped(q, k, v, heads, kv_heads):
    """new_decoder_architecture: view (G, H/G + 2, d): a group's query heads, then its k, then its v."""
    per = heads // kv_heads
    groups = [torch.cat([q[g * per:(g + 1) * per], k[g:g + 1], v[g:g + 1]]) for g in range(kv_heads)]
    return torch.cat(groups).reshape(-1, D)


FALCON = {
    "new_decoder_architecture": (8, 2, {"model_type": "falcon", "new_decoder_architecture": True, "num_kv_heads": 2},
                                 lambda q, k, v: _falcon_grouped(q, k, v, 8, 2)),
    "refinedweb_40b_config": (8, 2, {"model_type": "RefinedWeb", "n_head_kv": 2}, lambda q, k, v:
                              _falcon_grouped(q, k, v, 8, 2)),
    # multi_query: view (H + 2, d): every query head, then one key, then one value.
    "multi_query": (8, 1, {"model_type": "falcon", "multi_query": True, "new_decoder_architecture": False},
                    lambda q, k, v: torch.cat([q, k, v]).reshape(-1, D)),
    # falcon-rw: view (H, 3, d): per-head [q, k, v].
    "falcon_rw": (4, 4, {"model_type": "falcon", "multi_query": False, "new_decoder_architecture": False},
                  lambda q, k, v: torch.stack([q, k, v], dim=1).reshape(-1, D)),
}


@pytest.mark.parametrize("variant", FALCON)
def test_falcon_query_key_value_in_each_of_its_layouts(variant, tmp_path):
    heads, kv_heads, flags, fuse = FALCON[variant]
    d = D // heads
    pairs = [head_pair(heads, kv_heads, d, D, seed=10 * i, dtype=torch.bfloat16) for i in range(2)]

    def layer(i, q, k, side):
        return {f"transformer.h.{i}.self_attention.query_key_value.weight": fuse(q, k, _value_blocks(kv_heads, d,
                                                                                                    side))}

    config = {"hidden_size": D, "n_head": heads, **flags}
    report = scan(*_write_pair(tmp_path, pairs, layer, config, torch.bfloat16))
    assert (report.model.num_heads, report.model.num_kv_heads, report.model.head_dim) == (heads, kv_heads, d)
    _check(report, pairs)


def test_gptj_separate_projections(tmp_path):
    heads, d = 4, 8
    pairs = [head_pair(heads, heads, d, D, seed=10 * i, dtype=torch.float16) for i in range(2)]

    def layer(i, q, k, side):
        return {f"transformer.h.{i}.attn.q_proj.weight": q.reshape(-1, D),
                f"transformer.h.{i}.attn.k_proj.weight": k.reshape(-1, D)}

    config = {"model_type": "gptj", "n_embd": D, "n_head": heads, "rotary_dim": 4}
    _check(scan(*_write_pair(tmp_path, pairs, layer, config, torch.float16)), pairs)


def test_bert_query_key(tmp_path):
    heads, d = 4, 8
    pairs = [head_pair(heads, heads, d, D, seed=10 * i, dtype=torch.float32) for i in range(2)]

    def layer(i, q, k, side):
        p = f"bert.encoder.layer.{i}.attention.self."
        return {p + "query.weight": q.reshape(-1, D), p + "query.bias": torch.zeros(D),
                p + "key.weight": k.reshape(-1, D), p + "key.bias": torch.zeros(D)}

    config = {"model_type": "bert", "hidden_size": D, "num_attention_heads": heads}
    _check(scan(*_write_pair(tmp_path, pairs, layer, config, torch.float32)), pairs)


def test_switch_transformers_encoder_and_decoder_attention_and_top1_routers(tmp_path):
    heads, d_kv, experts = 4, 6, 4  # T5: inner_dim = H·d_kv need not equal d_model
    blocks = [("encoder", 0), ("encoder", 1), ("decoder", 0), ("decoder", 1)]
    pairs = [head_pair(heads, heads, d_kv, D, seed=10 * i, dtype=torch.float32) for i in range(len(blocks))]
    routers = {1: router_pair(experts, D, 70, torch.float32), 3: router_pair(experts, D, 80, torch.float32)}

    def layer(i, q, k, side):
        stack, block = blocks[i]
        p = f"{stack}.block.{block}.layer."
        tensors = {p + "0.SelfAttention.q.weight": q.reshape(-1, D), p + "0.SelfAttention.k.weight": k.reshape(-1, D)}
        if stack == "decoder":
            tensors[p + "1.EncDecAttention.q.weight"] = exact((heads * d_kv, D), 60 + i, torch.float32)
        if i in routers:  # sparse blocks: the feed-forward is the block's last layer
            ff = 1 if stack == "encoder" else 2
            tensors[p + f"{ff}.mlp.router.classifier.weight"] = routers[i][side]
        return tensors

    config = {"model_type": "switch_transformers", "d_model": D, "num_heads": heads, "d_kv": d_kv,
              "num_experts": experts}
    report = scan(*_write_pair(tmp_path, pairs, layer, config, torch.float32))
    assert (report.model.num_layers, report.model.head_dim, report.model.top_k) == (4, d_kv, 1)
    _check(report, pairs)
    for i, layer_result in enumerate(report.pairs[0].layers):
        if i in routers:
            assert_router_matches(layer_result, *routers[i])
        else:
            assert layer_result.router is None


def test_fused_layout_without_config_needs_heads_and_a_second_number(tmp_path):
    heads, kv_heads, d = 4, 2, 8
    pairs = [head_pair(heads, kv_heads, d, D, seed=1, dtype=torch.float32)]

    def layer(i, q, k, side):
        w = torch.cat([q.reshape(-1, D), k.reshape(-1, D), _value_blocks(kv_heads, d, side).reshape(-1, D)])
        return {f"model.layers.{i}.self_attn.qkv_proj.weight": w}

    path_a, path_b = _write_pair(tmp_path, pairs, layer, None, torch.float32)
    with pytest.raises(CkptScanError, match="--num-heads"):
        scan(path_a, path_b)
    with pytest.raises(CkptScanError, match="--head-dim or --num-kv-heads"):
        scan(path_a, path_b, overrides=HeadOverrides(num_heads=4))
    _check(scan(path_a, path_b, overrides=HeadOverrides(num_heads=4, num_kv_heads=2)), pairs)
