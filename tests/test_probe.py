"""Probe files: loading, validation errors, the capture helper, and scans with --probe."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from factories import llama_config, llama_tensors, random_weights, write_hf_checkpoint
from safetensors.torch import load_file, save_file
from torch import nn
from typer.testing import CliRunner

import ckptscan
from ckptscan.cli import app
from ckptscan.errors import CkptScanError
from ckptscan.inputs.probe import capture_probe, load_probe
from ckptscan.readers import open_checkpoint

runner = CliRunner()


def write_probe(path, inputs: dict[int, torch.Tensor], **extra: torch.Tensor):
    tensors = {f"layers.{i}.router_input": x.contiguous() for i, x in inputs.items()}
    save_file({**tensors, **extra}, path)
    return path


def random_inputs(layers, tokens=64, dim=32, seed=0):
    return {i: random_weights((tokens, dim), seed + i, 1.0).float() for i in layers}


def numpy_routing(logits: np.ndarray, top_k: int) -> dict[str, float]:
    """Direct computation from router logits [T, E] (the definitions of monitors.md)."""
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    h = -(p * np.log(p)).sum(axis=1)
    counts = np.bincount(np.argsort(-logits, axis=1)[:, :top_k].reshape(-1), minlength=logits.shape[1])
    load = counts / counts.sum()
    return {"entropy": h.mean(), "p05": np.percentile(h, 5), "load": load, "load_cv": load.std() / load.mean(),
            "dead": int((counts == 0).sum())}


# --- loading and validation ------------------------------------------------------------------

def test_load_probe_reads_layers_lazily_and_exactly(tmp_path):
    inputs = random_inputs([0, 1, 3])
    probe = load_probe(write_probe(tmp_path / "probe.safetensors", inputs, tokens=torch.arange(64)))
    assert probe.layers == [0, 1, 3]
    for i, x in inputs.items():
        assert torch.equal(probe.router_input(i), x)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_any_float_dtype_is_accepted(tmp_path, dtype):
    x = random_inputs([0])[0].to(dtype)
    probe = load_probe(write_probe(tmp_path / "p.safetensors", {0: x}))
    assert torch.equal(probe.router_input(0), x)


def test_non_finite_values_are_refused_naming_the_key(tmp_path):
    inputs = random_inputs([0, 1])
    inputs[1][5, 3] = float("nan")
    inputs[1][9, 0] = float("inf")
    with pytest.raises(CkptScanError, match=r"tensor 'layers\.1\.router_input': 2 non-finite .* first at token 5"):
        load_probe(write_probe(tmp_path / "p.safetensors", inputs))


@pytest.mark.parametrize(
    "tensors, message",
    [
        ({"layers.0.router_input": torch.ones(4, 8), "model.layers.0.mlp.gate.weight": torch.ones(4, 8)},
         r"unexpected tensor\(s\) \['model\.layers\.0\.mlp\.gate\.weight'\]"),
        ({"tokens": torch.arange(4)}, "no 'layers.{i}.router_input' tensors"),
        ({"layers.0.router_input": torch.ones(2, 4, 8)}, r"'layers\.0\.router_input': shape \[2, 4, 8\]"),
        ({"layers.0.router_input": torch.ones(0, 8)}, r"shape \[0, 8\]"),
        ({"layers.0.router_input": torch.ones(4, 8, dtype=torch.int32)}, "dtype I32"),
    ],
)
def test_malformed_probes_are_refused(tmp_path, tensors, message):
    path = tmp_path / "p.safetensors"
    save_file(tensors, path)
    with pytest.raises(CkptScanError, match=message):
        load_probe(path)


def test_file_problems_name_the_file(tmp_path):
    with pytest.raises(CkptScanError, match="missing.safetensors: cannot read"):
        load_probe(tmp_path / "missing.safetensors")
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x05\x00\x00")
    with pytest.raises(CkptScanError, match="garbage.safetensors: not a safetensors file"):
        load_probe(garbage)
    with pytest.raises(CkptScanError, match="is a directory"):
        load_probe(tmp_path)


def test_check_routers_names_missing_layers_and_mismatched_shapes(tmp_path):
    probe = load_probe(write_probe(tmp_path / "p.safetensors", random_inputs([0, 1], dim=32)))
    probe.check_routers({0: ("r0", (4, 32)), 1: ("r1", (4, 32))}, 32)
    with pytest.raises(CkptScanError, match=r"no router input for MoE layer\(s\) \[2, 5\].*has layers \[0, 1\]"):
        probe.check_routers({0: ("r0", (4, 32)), 2: ("r2", (4, 32)), 5: ("r5", (4, 32))}, 32)
    with pytest.raises(CkptScanError, match=r"layer 0: probe router input is \[64, 32\].*'r0' \[4, 48\].* d = 48"):
        probe.check_routers({0: ("r0", (4, 48)), 1: ("r1", (4, 48))}, 48)


# --- the capture helper on a small MoE model -------------------------------------------------

class TinyMoeBlock(nn.Module):
    def __init__(self, dim, experts):
        super().__init__()
        self.dropout = nn.Dropout(0.5)  # changes the router input in train mode: capture must run in eval
        self.gate = nn.Linear(dim, experts, bias=False)
        self.shared_expert_gate = nn.Linear(dim, 1, bias=False)  # not a router (Qwen-MoE)
        self.experts = nn.ModuleList(nn.Linear(dim, dim, bias=False) for _ in range(experts))

    def forward(self, x):
        x = self.dropout(x)
        weights, chosen = self.gate(x).softmax(-1).topk(2, dim=-1)
        out = torch.stack([e(x) for e in self.experts], dim=-2)  # [..., E, d]
        picked = out.gather(-2, chosen[..., None].expand(*chosen.shape, x.shape[-1]))
        return (weights[..., None] * picked).sum(-2) + torch.sigmoid(self.shared_expert_gate(x)) * x


class TinyLayer(nn.Module):
    def __init__(self, dim, experts):
        super().__init__()
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(dim, dim, bias=False)
        self.self_attn.k_proj = nn.Linear(dim, dim, bias=False)
        self.block_sparse_moe = TinyMoeBlock(dim, experts)

    def forward(self, x):
        h = x + torch.tanh(self.self_attn.q_proj(x)) * self.self_attn.k_proj(x)
        return h + self.block_sparse_moe(nn.functional.layer_norm(h, h.shape[-1:]))


class TinyMoe(nn.Module):
    """Hugging Face Mixtral-style names: model.layers.{i}.block_sparse_moe.gate."""

    def __init__(self, layers=3, dim=32, experts=6, vocab=50):
        super().__init__()
        torch.manual_seed(0)
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(vocab, dim)
        self.model.layers = nn.ModuleList(TinyLayer(dim, experts) for _ in range(layers))

    def forward(self, input_ids, attention_mask=None):
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            x = layer(x)
        return x


def gate_io(model: TinyMoe, input_ids) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Each router's (input, logits) in eval mode, recorded by forward hooks (not the code under test)."""
    seen = {}
    handles = [
        layer.block_sparse_moe.gate.register_forward_hook(
            lambda m, args, out, i=i: seen.__setitem__(i, (args[0].detach(), out.detach())))
        for i, layer in enumerate(model.model.layers)
    ]
    model.eval()
    with torch.no_grad():
        model(input_ids)
    for h in handles:
        h.remove()
    return seen


def test_capture_records_each_router_input_and_restores_the_model(tmp_path):
    model = TinyMoe()
    model.train()
    model.model.layers[1].eval()  # a mixed-mode model is restored module by module
    ids = torch.randint(0, 50, (2, 10), generator=torch.Generator().manual_seed(1))
    probe = capture_probe(model, {"input_ids": ids}, tmp_path / "probe.safetensors")
    assert probe.layers == [0, 1, 2]
    assert model.training and not model.model.layers[1].training and model.model.layers[2].training
    assert all(not m._forward_pre_hooks for m in model.modules())
    expected = gate_io(model, ids)
    for i in range(3):
        assert torch.equal(probe.router_input(i), expected[i][0].reshape(20, 32))


def test_capture_drops_masked_tokens_and_accepts_positional_batches(tmp_path):
    model = TinyMoe()
    ids = torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(2))
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    probe = capture_probe(model, (ids,), tmp_path / "probe.safetensors", token_mask=mask)
    x = gate_io(model, ids)[0][0]
    assert torch.equal(probe.router_input(0), torch.cat([x[0, :4], x[1]]))


def test_capture_errors_are_clear(tmp_path):
    model = TinyMoe()
    ids = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(CkptScanError, match="no module name matches 'router_x'"):
        capture_probe(model, ids, tmp_path / "p.safetensors", pattern="router_x")
    with pytest.raises(CkptScanError, match=r"'model\.embed_tokens' .* has no layer number"):
        capture_probe(model, ids, tmp_path / "p.safetensors", pattern=r"embed_tokens$")
    with pytest.raises(CkptScanError, match="both match 'gate' in layer 0"):
        capture_probe(model, ids, tmp_path / "p.safetensors", pattern="gate")
    with pytest.raises(CkptScanError, match="token_mask has 3 entries but router"):
        capture_probe(model, ids, tmp_path / "p.safetensors", token_mask=torch.ones(3))
    assert not (tmp_path / "p.safetensors").exists()


# --- scans with a probe ----------------------------------------------------------------------

def test_captured_probe_reproduces_the_models_own_routing_in_a_scan(tmp_path):
    """The user's workflow: capture from the live model, save checkpoints, scan.

    For the checkpoint saved from the model itself, ckptscan's routing must be
    exactly the routing the model computed (its gate logits, seen by a hook).
    """
    model = TinyMoe()
    ids = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(3))
    probe = capture_probe(model, {"input_ids": ids}, tmp_path / "probe.safetensors")
    config = {**llama_config(layers=3, hidden=32, heads=4, kv_heads=4, experts=6)}
    newer = {k: v.detach().double() for k, v in model.state_dict().items()}
    older = {k: v + 0.05 * random_weights(v.shape, 9) for k, v in newer.items()}
    a = write_hf_checkpoint(tmp_path / "checkpoint-1", older, config)
    b = write_hf_checkpoint(tmp_path / "checkpoint-2", newer, config)
    report = ckptscan.scan_pair(a, b, ckptscan.ScanOptions(compute_dtype=torch.float64), probe=probe)
    logits = gate_io(model, ids)
    assert report.probe == str(tmp_path / "probe.safetensors")
    for layer in report.pairs[0].layers:
        expected = numpy_routing(logits[layer.layer][1].reshape(32, 6).double().numpy(), top_k=2)
        router = layer.router
        assert router.routing_entropy == pytest.approx(expected["entropy"], rel=1e-6)
        assert router.routing_entropy_p05 == pytest.approx(expected["p05"], rel=1e-6)
        assert router.routing_entropy_norm == pytest.approx(expected["entropy"] / math.log(6), rel=1e-6)
        assert router.load_cv == pytest.approx(expected["load_cv"], rel=1e-9)
        assert router.dead_experts == expected["dead"]
        np.testing.assert_allclose(router.expert_load, expected["load"], atol=1e-12)
        assert router.routing_top_k == 2
        assert router.routing_entropy_change is not None and router.routing_entropy_change != 0


@pytest.fixture
def moe_run(tmp_path):
    config = llama_config(layers=3, hidden=32, heads=4, kv_heads=2, experts=4)
    a = llama_tensors(config, seed=1)
    # The router of layer 1 collapses towards one expert between the checkpoints.
    b = {k: v + 1e-3 * random_weights(v.shape, 30 + i) for i, (k, v) in enumerate(sorted(a.items()))}
    router = "model.layers.1.block_sparse_moe.gate.weight"
    b[router] = a[router] * 5.0
    b[router][0] += 2.0 * random_weights((32,), 99, 1.0)
    pa = write_hf_checkpoint(tmp_path / "checkpoint-100", a, config)
    pb = write_hf_checkpoint(tmp_path / "checkpoint-200", b, config)
    probe = write_probe(tmp_path / "probe.safetensors", random_inputs([0, 1, 2]))
    return pa, pb, probe, a, b, config


def test_scan_change_fields_are_b_minus_a_of_direct_computations(moe_run):
    pa, pb, probe_path, a, b, _ = moe_run
    report = ckptscan.scan_pair(pa, pb, probe=probe_path)
    x = random_inputs([1])[1].double().numpy()
    router = "model.layers.1.block_sparse_moe.gate.weight"
    before = numpy_routing(x @ a[router].numpy().T, 2)
    after = numpy_routing(x @ b[router].numpy().T, 2)
    result = report.pairs[0].layers[1].router
    assert result.routing_entropy == pytest.approx(after["entropy"], rel=1e-5)
    assert result.routing_entropy_change == pytest.approx(after["entropy"] - before["entropy"], rel=1e-4)
    assert result.load_cv_change == pytest.approx(after["load_cv"] - before["load_cv"], rel=1e-6)
    assert result.routing_entropy_change < -0.1  # the planted collapse lowers entropy


def test_without_a_probe_routing_fields_are_null(moe_run):
    pa, pb, *_ = moe_run
    report = ckptscan.scan_pair(pa, pb, probe=None)  # the run's own probe.safetensors switched off
    assert report.probe is None
    for layer in report.pairs[0].layers:
        assert layer.router.routing_entropy is None and layer.router.dead_experts is None
        assert layer.router.expert_load is None


def test_diff_with_probe_shows_routing_columns_and_writes_json(moe_run, tmp_path):
    pa, pb, probe, *_ = moe_run
    out = tmp_path / "report.json"
    # The routing columns are among the table's value columns: --wide (the default table fits 80-120 columns).
    result = runner.invoke(app, ["diff", str(pa), str(pb), "--probe", str(probe), "--json", str(out), "--wide"])
    assert result.exit_code in (0, 1), result.output
    assert "route H" in result.output and "load CV" in result.output and f"probe: {probe}" in result.output
    assert "assumes" not in result.output  # the config gives top-k
    doc = json.loads(out.read_text())
    router = doc["pairs"][0]["layers"][1]["router"]
    for key in ("routing_entropy", "routing_entropy_p05", "load_cv", "dead_experts", "routing_entropy_change"):
        assert router[key] is not None, key
    assert doc["probe"] == str(probe)
    plain = runner.invoke(app, ["diff", str(pa), str(pb), "--no-probe", "--wide"])
    assert "route H" not in plain.output
    # Without --probe, diff of two checkpoints of the run uses the run's probe, as trend does.
    found = runner.invoke(app, ["diff", str(pa), str(pb), "--wide"])
    assert "route H" in found.output and "using the run's probe" in found.output


def test_unknown_top_k_defaults_to_2_and_says_so(tmp_path):
    config = llama_config(layers=1, hidden=32, heads=4, kv_heads=2, experts=4)
    del config["num_experts_per_tok"]
    a = llama_tensors(config, seed=1)
    b = {k: v * 1.01 for k, v in a.items()}
    pa = write_hf_checkpoint(tmp_path / "checkpoint-1", a, config)
    pb = write_hf_checkpoint(tmp_path / "checkpoint-2", b, config)
    probe = write_probe(tmp_path / "probe.safetensors", random_inputs([0]))
    result = runner.invoke(app, ["diff", str(pa), str(pb), "--probe", str(probe)])
    assert "the config gives no top-k: expert load assumes top-2" in result.output
    report = ckptscan.scan_pair(pa, pb, probe=probe)
    assert report.pairs[0].layers[0].router.routing_top_k == 2


@pytest.mark.parametrize(
    "layers, dim, message",
    [
        ([0, 2], 32, r"no router input for MoE layer\(s\) \[1\]"),
        ([0, 1, 2], 16, r"layer 0: probe router input is \[64, 16\].*\[4, 32\] .* takes d = 32"),
    ],
)
def test_cli_refuses_a_probe_that_does_not_fit_with_exit_2(moe_run, tmp_path, layers, dim, message):
    pa, pb, *_ = moe_run
    probe = write_probe(tmp_path / "bad.safetensors", random_inputs(layers, dim=dim))
    result = runner.invoke(app, ["diff", str(pa), str(pb), "--probe", str(probe)])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert len([line for line in result.output.splitlines() if line.strip()]) == 1
    assert re.search(message, " ".join(result.output.split())), result.output


def test_layers_flag_lets_a_partial_probe_through(moe_run, tmp_path):
    pa, pb, *_ = moe_run
    probe = write_probe(tmp_path / "partial.safetensors", random_inputs([0, 2]))
    result = runner.invoke(app, ["diff", str(pa), str(pb), "--probe", str(probe), "--layers", "0,2"])
    assert result.exit_code in (0, 1), result.output


def test_deepseek_v3_sigmoid_router_with_selection_bias_in_a_scan(tmp_path):
    """DeepSeek-V3: p = σ(Wx)/Σσ(Wx) for the entropy, top-k of σ(Wx) + bias for the load."""
    d, heads, experts, nope, rope, v, q_rank, kv_rank = 32, 2, 8, 8, 4, 8, 12, 10
    config = {"model_type": "deepseek_v3", "hidden_size": d, "num_attention_heads": heads, "num_key_value_heads": heads,
              "num_hidden_layers": 2, "first_k_dense_replace": 0, "n_routed_experts": experts,
              "num_experts_per_tok": 3, "q_lora_rank": q_rank, "kv_lora_rank": kv_rank, "qk_nope_head_dim": nope,
              "qk_rope_head_dim": rope, "v_head_dim": v, "num_nextn_predict_layers": 0}
    shapes = {
        "self_attn.q_a_proj.weight": (q_rank, d), "self_attn.q_b_proj.weight": (heads * (nope + rope), q_rank),
        "self_attn.kv_a_proj_with_mqa.weight": (kv_rank + rope, d),
        "self_attn.kv_b_proj.weight": (heads * (nope + v), kv_rank),
        "self_attn.o_proj.weight": (d, heads * v), "mlp.gate.weight": (experts, d),
        "mlp.gate.e_score_correction_bias": (experts,),
    }
    paths = []
    for side in range(2):
        tensors = {}
        for i in range(2):
            p = f"model.layers.{i}."
            tensors.update({p + name: random_weights(shape, 100 * side + 10 * i + j, 0.3)
                            for j, (name, shape) in enumerate(shapes.items())})
            tensors[p + "self_attn.q_a_layernorm.weight"] = torch.ones(q_rank, dtype=torch.float64)
            tensors[p + "self_attn.kv_a_layernorm.weight"] = torch.ones(kv_rank, dtype=torch.float64)
        paths.append(write_hf_checkpoint(tmp_path / f"checkpoint-{side + 1}", tensors, config))
    probe = load_probe(write_probe(tmp_path / "probe.safetensors", random_inputs([0, 1], dim=d)))
    report = ckptscan.scan_pair(*paths, ckptscan.ScanOptions(compute_dtype=torch.float64), probe=probe)
    stored = load_file(paths[1] / "model.safetensors")
    for layer in report.pairs[0].layers:
        x = probe.router_input(layer.layer).double().numpy()
        w = stored[f"model.layers.{layer.layer}.mlp.gate.weight"].double().numpy()
        bias = stored[f"model.layers.{layer.layer}.mlp.gate.e_score_correction_bias"].double().numpy()
        s = 1 / (1 + np.exp(-(x @ w.T)))
        p = s / s.sum(axis=1, keepdims=True)
        counts = np.bincount(np.argsort(-(s + bias), axis=1)[:, :3].reshape(-1), minlength=experts)
        router = layer.router
        assert router.routing_entropy == pytest.approx((-(p * np.log(p)).sum(axis=1)).mean(), rel=1e-12)
        np.testing.assert_allclose(router.expert_load, counts / counts.sum(), atol=1e-15)
        assert router.routing_top_k == 3


# --- the sample runs (experiments/), when they are present ---------------------------------

SAMPLES = Path(__file__).resolve().parent.parent / "sample_checkpoints"


@pytest.mark.skipif(not (SAMPLES / "router_fault" / "probe.safetensors").is_file(), reason="sample runs not generated")
def test_sample_router_fault_collapses_routing_and_healthy_does_not():
    """Router fault from step 1000: the probe's routing entropy collapses by the
    next checkpoint in both layers; the healthy run's barely moves. The scan's
    value at checkpoint 1100 is checked against numpy on the raw tensors."""
    changes = {}
    for run in ("healthy", "router_fault"):
        folder = SAMPLES / run
        probe = load_probe(folder / "probe.safetensors")
        report = ckptscan.scan_pair(folder / "checkpoint-1000", folder / "checkpoint-1100", probe=probe)
        layers = report.pairs[0].layers
        changes[run] = [layer.router.routing_entropy_change for layer in layers]
        weights = load_file(folder / "checkpoint-1100" / "model.safetensors")
        for layer in layers:
            x = probe.router_input(layer.layer).double().numpy()
            w = weights[f"model.layers.{layer.layer}.block_sparse_moe.gate.weight"].double().numpy()
            expected = numpy_routing(x @ w.T, top_k=2)
            assert layer.router.routing_entropy == pytest.approx(expected["entropy"], rel=1e-5)
            assert layer.router.load_cv == pytest.approx(expected["load_cv"], rel=1e-6)
    assert all(change < -0.5 for change in changes["router_fault"]), changes
    assert all(abs(change) < 0.05 for change in changes["healthy"]), changes
