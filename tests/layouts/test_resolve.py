"""Choosing a resolver, and refusing to guess: every ambiguity is an error
that says what is missing and which flag (or tensor map) supplies it."""

from __future__ import annotations

import pytest
import torch
from factories import llama_config, llama_tensors, random_weights, write_hf_checkpoint
from format_writers import GOLDEN_MEGATRON
from layout_factories import assert_heads_match, head_pair, reference, scan

from ckptscan.errors import CkptScanError
from ckptscan.layouts import HeadOverrides, resolve_layout
from ckptscan.readers import open_checkpoint

D = 32


def _resolve(path, **overrides):
    return resolve_layout(open_checkpoint(path), HeadOverrides(**overrides))


def test_unknown_names_point_to_inspect_and_the_tensor_map(tmp_path):
    path = write_hf_checkpoint(tmp_path / "c", {"blk.0.attn_q.weight": random_weights((8, 8), 1)}, None)
    with pytest.raises(CkptScanError, match="--tensor-map"):
        _resolve(path)


def test_a_config_that_contradicts_the_shapes_is_refused(tmp_path):
    config = llama_config(layers=1, hidden=32, heads=4, kv_heads=2)
    tensors = llama_tensors(config, 1)
    config["num_key_value_heads"] = 4
    path = write_hf_checkpoint(tmp_path / "c", tensors, config)
    with pytest.raises(CkptScanError, match="num_key_value_heads' says 4 KV heads"):
        _resolve(path)


def test_unknown_model_type_reads_q_k_but_refuses_norms_and_unconfirmed_routers(tmp_path):
    config = llama_config(layers=2, hidden=32, heads=4, kv_heads=2, model_type="starcoder9")
    tensors = llama_tensors(config, 1)
    tensors["model.layers.1.mlp.gate.weight"] = random_weights((64, 32), 3)  # a gate projection, not a router
    layout = _resolve(write_hf_checkpoint(tmp_path / "plain", tensors, config))
    assert layout.info.family == "starcoder9" and layout.info.num_experts is None
    assert any("ignored model.layers.1.mlp.gate.weight" in note for note in layout.notes)

    tensors["model.layers.0.self_attn.q_norm.weight"] = torch.ones(8)
    tensors["model.layers.1.self_attn.q_norm.weight"] = torch.ones(8)
    with pytest.raises(CkptScanError, match="convention unknown"):
        _resolve(write_hf_checkpoint(tmp_path / "normed", tensors, config))


def test_multi_head_families_refuse_a_contradicting_kv_flag(tmp_path):
    tensors = {"gpt_neox.layers.0.attention.query_key_value.weight": random_weights((3 * D, D), 1)}
    path = write_hf_checkpoint(tmp_path / "c", tensors, {"model_type": "gpt_neox", "hidden_size": D,
                                                         "num_attention_heads": 4})
    assert _resolve(path).info.num_kv_heads == 4
    with pytest.raises(CkptScanError, match="multi-head: --num-kv-heads 2 contradicts 4 heads"):
        _resolve(path, num_kv_heads=2)


def test_attention_under_two_non_language_prefixes_is_ambiguous(tmp_path):
    config = llama_config(layers=1, hidden=32, heads=4, kv_heads=2)
    tensors = llama_tensors(config, 1)
    tensors.update({k.replace("model.", "draft.model.", 1): v for k, v in tensors.items()})
    with pytest.raises(CkptScanError, match="several prefixes"):
        _resolve(write_hf_checkpoint(tmp_path / "c", tensors, config))


def _megatron_without_args(tmp_path, heads: int, groups: int, d: int, gated: bool = False):
    """Megatron-Core names in a safetensors file (no args): only flags can give the geometry."""
    rows = ((2 if gated else 1) * heads + 2 * groups) * d
    tensors = {"decoder.layers.0.self_attention.linear_qkv.weight": random_weights((rows, D), 1)}
    return write_hf_checkpoint(tmp_path / "c", tensors, None)


def test_megatron_without_args_needs_flags_that_rule_out_the_output_gate(tmp_path):
    path = _megatron_without_args(tmp_path, heads=4, groups=4, d=8)  # 96 rows
    with pytest.raises(CkptScanError, match="--num-heads"):
        _resolve(path)
    # 4 heads of 8 rows: 96 rows are 4 KV groups plain, or 2 KV groups gated.
    with pytest.raises(CkptScanError, match="fit both a plain and an output-gated"):
        _resolve(path, num_heads=4, head_dim=8)
    layout = _resolve(path, num_heads=4, head_dim=8, num_kv_heads=4)
    assert layout.layers[0].roles == {"decoder.layers.0.self_attention.linear_qkv.weight": "W_qkv"}


def test_megatron_qk_norm_without_args_is_refused(tmp_path):
    tensors = {"decoder.layers.0.self_attention.linear_qkv.weight": random_weights((64, D), 1),
               "decoder.layers.0.self_attention.q_layernorm.weight": torch.ones(8),
               "decoder.layers.0.self_attention.k_layernorm.weight": torch.ones(8)}
    path = write_hf_checkpoint(tmp_path / "c", tensors, None)
    with pytest.raises(CkptScanError, match="zero-centred"):
        _resolve(path, num_heads=4, num_kv_heads=2)


def test_legacy_megatron_names_without_a_checkpoint_version_are_refused(tmp_path):
    tensors = {"language_model.encoder.layers.0.self_attention.query_key_value.weight": random_weights((96, D), 1)}
    path = write_hf_checkpoint(tmp_path / "c", tensors, None)
    with pytest.raises(CkptScanError, match="checkpoint_version"):
        _resolve(path, num_heads=4)


def test_megatron_args_decide_over_ambiguous_shapes():
    """linear_qkv's 96 rows of the gated run megatron-core saved would read as
    4 ungated MHA groups of head_dim 8 too: its args decide (2 query groups,
    attention_output_gate), and the heads are Megatron's own."""
    run = GOLDEN_MEGATRON / "gated"
    checkpoint = open_checkpoint(run / "iter_0000020")
    assert checkpoint.tensors.shape("decoder.layers.0.self_attention.linear_qkv.weight") == (96, D)
    layout = resolve_layout(checkpoint, HeadOverrides())
    assert "fused layout: grouped_gated (args 'attention_output_gate')" in layout.notes
    report = scan(run / "iter_0000010", run / "iter_0000020")
    assert (report.model.num_kv_heads, report.model.head_dim) == (2, 8)
    f64 = torch.float64
    split = [torch.load(GOLDEN_MEGATRON / "megatron_split" / "gated" / f"iter_{i:07d}.pt", weights_only=True)
             for i in (10, 20)]
    q_a, k_a, q_b, k_b = (s[f"0.{part}"].to(f64) * s[f"0.{norm}"].to(f64)[None, :, None]
                          for s in split for part, norm in (("query", "q_norm"), ("key", "k_norm")))
    assert_heads_match(report.pairs[0].layers[0], reference(q_a, k_a, q_b, k_b))


def test_the_reference_catches_a_wrong_split(tmp_path):
    """Scanning per-head-interleaved (NeoX) rows as blocks [Q | K | V] gives
    other numbers: the per-head checks in these tests can fail."""
    heads, d = 4, 8
    pair = head_pair(heads, heads, d, D, seed=5, dtype=torch.float32)
    for side, name in enumerate(("a", "b")):
        q, k = (pair.q_a, pair.k_a) if side == 0 else (pair.q_b, pair.k_b)
        w = torch.stack([q, k, random_weights((heads, d, D), 2)], dim=1).reshape(-1, D)
        write_hf_checkpoint(tmp_path / name, {"model.layers.0.self_attn.qkv_proj.weight": w},
                            {"model_type": "phi3", "hidden_size": D, "num_attention_heads": heads,
                             "num_key_value_heads": heads})
    report = scan(tmp_path / "a", tmp_path / "b")
    with pytest.raises(AssertionError):
        assert_heads_match(report.pairs[0].layers[0], reference(pair.q_a, pair.k_a, pair.q_b, pair.k_b))
