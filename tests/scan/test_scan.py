"""scan_pair end to end on Hugging Face checkpoints: what a user gets back."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from factories import llama_config, llama_tensors, random_weights, write_hf_checkpoint

import ckptscan
from ckptscan.errors import CkptScanError


def _entropy(singular_values: np.ndarray) -> float:
    p = singular_values**2 / np.sum(singular_values**2)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def _updated(tensors: dict[str, torch.Tensor], seed: int, scale: float = 1e-2) -> dict[str, torch.Tensor]:
    return {k: v + scale * random_weights(v.shape, seed + i) for i, (k, v) in enumerate(sorted(tensors.items()))}


@pytest.fixture
def moe_pair(tmp_path):
    config = llama_config(layers=6, hidden=48, heads=6, kv_heads=2, experts=4)
    a = llama_tensors(config, seed=1)
    b = _updated(a, seed=50)
    # Plant a rank-1 update of W_q in layer 3, K unchanged: its Δ2 is rank 1.
    name = "model.layers.3.self_attn.q_proj.weight"
    b[name] = a[name] + 0.05 * random_weights((48, 1), 7, 1.0) @ random_weights((1, 48), 8, 1.0)
    b["model.layers.3.self_attn.k_proj.weight"] = a["model.layers.3.self_attn.k_proj.weight"]
    path_a = write_hf_checkpoint(tmp_path / "checkpoint-100", a, config)
    path_b = write_hf_checkpoint(tmp_path / "checkpoint-200", b, config, shards=3)
    return path_a, path_b, a, b, config


def test_diff_flags_the_planted_low_rank_layer_and_only_it(moe_pair):
    path_a, path_b, *_ = moe_pair
    report = ckptscan.scan_pair(path_a, path_b)
    statuses = {layer.layer: layer.status for layer in report.pairs[0].layers}
    assert statuses == {0: "ok", 1: "ok", 2: "ok", 3: "alert", 4: "ok", 5: "ok"}
    findings = report.pairs[0].layers[3].findings
    assert {f.family for f in findings if f.severity == "alert"} == {"attention"}
    assert report.summary.status == "alert"
    assert report.summary.flagged_layers == [3]
    assert report.summary.first_alert_step["attention"] == 200
    assert report.summary.first_alert_step["router"] is None


def test_steps_come_from_directory_names(moe_pair):
    path_a, path_b, *_ = moe_pair
    report = ckptscan.scan_pair(path_a, path_b)
    assert [c.step for c in report.checkpoints] == [100, 200]
    assert (report.pairs[0].from_step, report.pairs[0].to_step) == (100, 200)


def test_per_head_entropies_match_dense_float64_brute_force(moe_pair):
    path_a, path_b, a, b, config = moe_pair
    report = ckptscan.scan_pair(path_a, path_b, ckptscan.ScanOptions(compute_dtype=torch.float64))
    heads, kv_heads, d = 6, 2, 48
    r = d // heads
    layer = report.pairs[0].layers[1]
    qa = a["model.layers.1.self_attn.q_proj.weight"].to(torch.float32).double().numpy()
    qb = b["model.layers.1.self_attn.q_proj.weight"].to(torch.float32).double().numpy()
    ka = a["model.layers.1.self_attn.k_proj.weight"].to(torch.float32).double().numpy()
    kb = b["model.layers.1.self_attn.k_proj.weight"].to(torch.float32).double().numpy()
    for h in range(heads):
        g = h // (heads // kv_heads)
        q_a, q_b = qa[h * r:(h + 1) * r], qb[h * r:(h + 1) * r]
        k_a, k_b = ka[g * r:(g + 1) * r], kb[g * r:(g + 1) * r]
        delta2 = (q_b - q_a).T @ k_a + q_a.T @ (k_b - k_a)
        delta3 = (q_b - q_a).T @ (k_b - k_a)
        result = layer.attention.heads[h]
        assert result.kv_head == g
        assert result.delta2_entropy == pytest.approx(_entropy(np.linalg.svd(delta2, compute_uv=False)), rel=1e-6)
        assert result.delta3_entropy == pytest.approx(_entropy(np.linalg.svd(delta3, compute_uv=False)), rel=1e-6)
        assert result.dwq_entropy == pytest.approx(_entropy(np.linalg.svd(q_b - q_a, compute_uv=False)), rel=1e-6)
        assert result.dwk_entropy == pytest.approx(_entropy(np.linalg.svd(k_b - k_a, compute_uv=False)), rel=1e-6)


def test_router_epsilon_and_cosine_describe_the_newer_checkpoint(moe_pair):
    path_a, path_b, a, b, _ = moe_pair
    router = ckptscan.scan_pair(path_a, path_b).pairs[0].layers[2].router
    w = b["model.layers.2.block_sparse_moe.gate.weight"].to(torch.float32).double().numpy()
    mean = w.mean(0)
    epsilon = np.linalg.norm(w - mean, axis=1).max() / np.linalg.norm(mean)
    units = w / np.linalg.norm(w, axis=1, keepdims=True)
    cos = units @ units.T
    mean_cos = (cos.sum() - np.trace(cos)) / (len(w) * (len(w) - 1))
    assert router.epsilon == pytest.approx(epsilon, rel=1e-9)
    assert router.cosine_similarity == pytest.approx(mean_cos, rel=1e-9, abs=1e-12)


def test_sharded_and_single_file_checkpoints_give_identical_numbers(tmp_path, moe_pair):
    path_a, _, _, b, config = moe_pair
    single = write_hf_checkpoint(tmp_path / "single" / "checkpoint-200", b, config)
    sharded = ckptscan.scan_pair(path_a, moe_pair[1])
    one_file = ckptscan.scan_pair(path_a, single)
    for x, y in zip(sharded.pairs[0].layers, one_file.pairs[0].layers):
        assert x.attention.delta2_entropy == y.attention.delta2_entropy
        assert x.router.epsilon == y.router.epsilon


def test_bf16_checkpoints_are_differenced_in_float32_not_bf16(tmp_path):
    config = llama_config(layers=1, hidden=32, heads=4, kv_heads=4)
    a = llama_tensors(config, seed=3)
    b = _updated(a, seed=9, scale=1e-3)
    path_a = write_hf_checkpoint(tmp_path / "checkpoint-1", a, config, dtype=torch.bfloat16)
    path_b = write_hf_checkpoint(tmp_path / "checkpoint-2", b, config, dtype=torch.bfloat16)
    att = ckptscan.scan_pair(path_a, path_b, ckptscan.ScanOptions(compute_dtype=torch.float64)).pairs[0].layers[0]
    q_a = a["model.layers.0.self_attn.q_proj.weight"].to(torch.bfloat16).double().numpy()
    q_b = b["model.layers.0.self_attn.q_proj.weight"].to(torch.bfloat16).double().numpy()
    expected = np.linalg.norm(q_b - q_a) / np.linalg.norm(q_a)
    assert att.attention.dwq_rel_norm == pytest.approx(expected, rel=1e-9)


def test_identical_checkpoints_are_unchanged_not_nan(tmp_path):
    config = llama_config(layers=2, hidden=32, heads=4, kv_heads=2, experts=4)
    a = llama_tensors(config, seed=4)
    report = ckptscan.scan_pair(
        write_hf_checkpoint(tmp_path / "checkpoint-1", a, config),
        write_hf_checkpoint(tmp_path / "checkpoint-2", a, config),
    )
    for layer in report.pairs[0].layers:
        assert layer.status == "unchanged"
        assert layer.attention.delta2_entropy is None
        assert layer.router.dwr_entropy is None
    assert report.summary.status == "unchanged"


def test_checkpoints_of_different_shapes_are_refused_naming_the_tensor(tmp_path):
    small = llama_config(layers=1, hidden=32, heads=4, kv_heads=2)
    other = llama_config(layers=1, hidden=32, heads=4, kv_heads=4)
    path_a = write_hf_checkpoint(tmp_path / "a", llama_tensors(small, seed=1), small)
    path_b = write_hf_checkpoint(tmp_path / "b", llama_tensors(other, seed=1), other)
    with pytest.raises(CkptScanError, match="num_kv_heads: 2 vs 4"):
        ckptscan.scan_pair(path_a, path_b)


def test_missing_head_count_without_config_asks_for_the_flag(tmp_path):
    config = llama_config(layers=1, hidden=32, heads=4, kv_heads=2)
    tensors = llama_tensors(config, seed=1)
    path_a = write_hf_checkpoint(tmp_path / "a", tensors, None)
    path_b = write_hf_checkpoint(tmp_path / "b", _updated(tensors, 3), None)
    with pytest.raises(CkptScanError, match="--num-heads"):
        ckptscan.scan_pair(path_a, path_b)
    overrides = ckptscan.scan.HeadOverrides(num_heads=4, num_kv_heads=2)
    report = ckptscan.scan_pair(path_a, path_b, ckptscan.ScanOptions(overrides=overrides))
    assert report.model.num_kv_heads == 2
