"""The update family's own values: the RMS element change of W_q and W_k,
and it per unit of the interval's summed learning rate — against a float64
numpy brute force."""

import json

import numpy as np
import pytest
import torch
from factories import llama_config, llama_tensors, write_hf_checkpoint

from ckptscan import scan_run
from ckptscan.layouts import LayerWeights
from ckptscan.monitors import registry
from ckptscan.monitors.update_family import fill_update_per_lr, update_values
from ckptscan.schema.results import LayerResult, PairResult
from ckptscan.scan import ScanOptions


def rms(a, b):
    return float(np.sqrt(np.mean((np.asarray(b, np.float64) - np.asarray(a, np.float64)) ** 2)))


def weights(rng, heads=4, kv=2, r=8, d=32, scale=1.0):
    return LayerWeights(q=torch.tensor(rng.standard_normal((heads, r, d)) * scale, dtype=torch.float32),
                        k=torch.tensor(rng.standard_normal((kv, r, d)) * scale, dtype=torch.float32))


def test_the_larger_rms_change_of_w_q_and_w_k():
    rng = np.random.default_rng(7)
    a = weights(rng)
    b = LayerWeights(q=a.q + torch.tensor(rng.standard_normal(a.q.shape) * 1e-2, dtype=torch.float32),
                     k=a.k + torch.tensor(rng.standard_normal(a.k.shape) * 3e-2, dtype=torch.float32))
    expected = max(rms(a.q.numpy(), b.q.numpy()), rms(a.k.numpy(), b.k.numpy()))
    assert update_values(a, b)["update_rms"] == pytest.approx(expected, rel=1e-6)  # float32 blocks (its docstring)


def test_no_value_without_both_sides_of_one_shape_or_with_a_non_finite_weight():
    rng = np.random.default_rng(1)
    a, b = weights(rng), weights(rng)
    assert update_values(LayerWeights(), LayerWeights())["update_rms"] is None
    wider = weights(rng, d=16)
    only_k = update_values(LayerWeights(q=a.q, k=a.k), LayerWeights(q=wider.q, k=b.k))["update_rms"]
    assert only_k == pytest.approx(rms(a.k.numpy(), b.k.numpy()), rel=1e-6)  # W_q's shapes differ: W_k's alone
    b.q[0, 0, 0] = float("inf")
    b.k[0, 0, 0] = float("nan")
    assert update_values(a, b)["update_rms"] is None


def test_per_unit_lr_is_rms_over_the_summed_rate_and_is_dropped_without_one():
    layer = LayerResult(0, families={"update": {"update_rms": 0.03}})
    pair = PairResult(100, 300, [layer], lr=2e-3)
    fill_update_per_lr(pair)
    assert registry.spec("update_per_lr").read(layer) == pytest.approx(0.03 / (2e-3 * 200), rel=1e-15)
    pair.lr = None  # computed again without the LR (a loss log removed)
    fill_update_per_lr(pair)
    assert registry.spec("update_per_lr").read(layer) is None


def test_a_scanned_run_reports_both_per_layer(tmp_path):
    config = llama_config(layers=2)
    tensors = {step: llama_tensors(config, seed) for step, seed in ((0, 1), (40, 2))}
    for name in tensors[0]:  # one run: the second checkpoint is the first plus a small update
        tensors[40][name] = tensors[0][name] + 1e-3 * tensors[40][name]
    for step, found in tensors.items():
        write_hf_checkpoint(tmp_path / f"checkpoint-{step}", found, config)
    rates = np.random.default_rng(3).uniform(1e-4, 1e-3, 40)
    (tmp_path / "train_log.jsonl").write_text("".join(
        json.dumps({"step": s, "loss": 2.0, "lr": float(rates[s])}) + "\n" for s in range(40)))
    report = scan_run(tmp_path, ScanOptions(), config=None, loss_log=tmp_path / "train_log.jsonl")
    (pair,) = report.pairs
    for layer in pair.layers:
        p = f"model.layers.{layer.layer}.self_attn."
        expected = max(rms(tensors[0][p + w].numpy(), tensors[40][p + w].numpy()) for w in ("q_proj.weight", "k_proj.weight"))
        assert layer.families["update"]["update_rms"] == pytest.approx(expected, rel=1e-6)
        assert layer.families["update"]["update_per_lr"] == pytest.approx(expected / rates.sum(), rel=1e-6)
