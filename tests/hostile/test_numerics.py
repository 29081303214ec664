"""Numerics: non-finite weights are a "numeric" alert for their layer while
the scan goes on; identical checkpoints are "unchanged", never NaN; updates
below the stored dtype's resolution are called out; the JSON report never
holds NaN or Infinity, whatever the weights."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from factories import llama_config, llama_tensors, next_checkpoint, write_hf_checkpoint
from hostile.helpers import run_cli

from ckptscan import ScanOptions, scan_pair
from ckptscan.detection.numerics import MIN_CHANGED_FRACTION
from ckptscan.document.writing import report_json
from ckptscan.schema.results import Finding, LayerResult

Q = "model.layers.{}.self_attn.q_proj.weight"
ROUTER = "model.layers.{}.block_sparse_moe.gate.weight"


def strict_json(text: str):
    """json.loads that refuses NaN/Infinity literals (Python accepts them)."""
    def refuse(literal: str):
        raise ValueError(f"non-standard JSON literal {literal}")
    return json.loads(text, parse_constant=refuse)


def _no_nan_anywhere(value) -> None:
    if isinstance(value, float):
        assert math.isfinite(value)
    elif isinstance(value, dict):
        for v in value.values():
            _no_nan_anywhere(v)
    elif isinstance(value, list):
        for v in value:
            _no_nan_anywhere(v)


def _pair(root: Path, edit_b=None, dtype=torch.float32, same: bool = False, layers: int = 4) -> tuple[Path, Path]:
    config = llama_config(layers=layers, experts=4)
    tensors_a = llama_tensors(config, seed=1)
    tensors_b = dict(tensors_a) if same else next_checkpoint(tensors_a, seed=2)
    if edit_b is not None:
        edit_b(tensors_b)
    a = write_hf_checkpoint(root / "checkpoint-100", tensors_a, config, dtype=dtype)
    b = write_hf_checkpoint(root / "checkpoint-200", tensors_b, config, dtype=dtype)
    return a, b


def _plant_nonfinite(tensors: dict) -> None:
    q = tensors[Q.format(1)].clone()
    q[0, :3] = float("nan")
    tensors[Q.format(1)] = q
    router = tensors[ROUTER.format(2)].clone()
    router[1, 0], router[2, 5] = float("inf"), float("-inf")
    tensors[ROUTER.format(2)] = router


def _numeric(layer: LayerResult, severity: str | None = None) -> list[Finding]:
    return [f for f in layer.findings if f.family == "numeric" and severity in (None, f.severity)]


def test_nonfinite_values_alert_their_layer_and_the_scan_goes_on(tmp_path: Path) -> None:
    report = scan_pair(*_pair(tmp_path, _plant_nonfinite))
    layers = {layer.layer: layer for layer in report.pairs[0].layers}
    assert sorted(layers) == [0, 1, 2, 3]
    q_alert = [f for f in _numeric(layers[1], "alert") if "W_q" in f.message]
    assert len(q_alert) == 1 and q_alert[0].value == 3.0 and layers[1].status == "alert"
    router_alert = [f for f in _numeric(layers[2], "alert") if "router" in f.message]
    assert len(router_alert) == 1 and router_alert[0].value == 2.0 and layers[2].status == "alert"
    # The other monitors of those layers, and the other layers, are still computed.
    assert layers[1].router is not None and layers[1].router.epsilon is not None
    assert layers[2].attention is not None and layers[2].attention.delta2_entropy is not None
    for i in (0, 3):
        assert not _numeric(layers[i], "alert")
        assert layers[i].attention.delta2_entropy is not None and layers[i].router.epsilon is not None
    assert report.summary.status == "alert"
    assert report.summary.first_alert_step["numeric"] == 200
    _no_nan_anywhere(strict_json(report_json(report)))


def test_cli_json_with_nonfinite_weights_is_strict_json(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a, b = _pair(tmp_path, _plant_nonfinite)
    out = tmp_path / "report.json"
    result = run_cli(capsys, "diff", a, b, "--json", out)
    assert result.code == 1, result.stderr  # the default gate fails on the alert
    assert "Traceback" not in result.stderr
    report = strict_json(out.read_text())
    _no_nan_anywhere(report)
    families = {f["family"] for p in report["pairs"] for layer in p["layers"] for f in layer["findings"]}
    assert "numeric" in families


def test_identical_checkpoints_are_unchanged_not_nan(tmp_path: Path) -> None:
    report = scan_pair(*_pair(tmp_path, same=True))
    assert report.summary.status == "alert"  # a diff with no update to judge (detection/provenance.py)
    for layer in report.pairs[0].layers:
        assert [f.rule for f in layer.findings] == ["unchanged", "identical"]
        assert layer.attention.unchanged and layer.router.unchanged
        assert layer.attention.delta2_entropy is None  # no entropy of a zero update, not 0 or NaN
        assert layer.changed_fraction == {"W_q": 0.0, "W_k": 0.0, "router": 0.0}
        assert not _precision(layer)  # float32 storage: nothing to say about precision
    _no_nan_anywhere(strict_json(report_json(report)))


def test_huge_finite_weights_do_not_crash_the_scan(tmp_path: Path) -> None:
    """|w| ~ 2e19 is finite in float32 but its Gram overflows float32: the
    layer falls back to float64 and gives the float64 path's numbers."""
    def blow_up(tensors: dict) -> None:
        tensors[Q.format(0)] = tensors[Q.format(0)] * 1e21
        tensors[ROUTER.format(1)] = tensors[ROUTER.format(1)] * 1e30
    a, b = _pair(tmp_path, blow_up)
    fast = scan_pair(a, b)
    exact = scan_pair(a, b, ScanOptions(compute_dtype=torch.float64))
    for got, want in zip(fast.pairs[0].layers, exact.pairs[0].layers):
        assert got.attention.delta2_entropy == pytest.approx(want.attention.delta2_entropy, rel=1e-6)
        assert got.router.epsilon == pytest.approx(want.router.epsilon, rel=1e-9)
    assert fast.pairs[0].layers[0].attention.q_spectral_norm_max > 1e18
    _no_nan_anywhere(strict_json(report_json(fast)))


@pytest.mark.parametrize("side", ["older", "newer"])
def test_huge_weights_on_one_side_give_the_float64_numbers(tmp_path: Path, side: str) -> None:
    """The older checkpoint's Grams are formed (and reused); the newer's are
    only bounded. Either side's overflow must send the layer to float64."""
    a, b = _pair(tmp_path)
    blown = a if side == "older" else b
    tensors = {k: v for k, v in load_file(blown / "model.safetensors").items()}
    tensors[Q.format(2)] = tensors[Q.format(2)] * 1e21
    save_file(tensors, blown / "model.safetensors", metadata={"format": "pt"})
    fast, exact = scan_pair(a, b), scan_pair(a, b, ScanOptions(compute_dtype=torch.float64))
    got, want = fast.pairs[0].layers[2].attention, exact.pairs[0].layers[2].attention
    assert got.delta2_entropy == pytest.approx(want.delta2_entropy, rel=1e-6)
    assert got.qk_logit_bound == pytest.approx(want.qk_logit_bound, rel=1e-6)
    assert got.q_spectral_norm_growth == pytest.approx(want.q_spectral_norm_growth, rel=1e-6)
    _no_nan_anywhere(strict_json(report_json(fast)))


@pytest.mark.parametrize("side", ["older", "newer"])
def test_weights_too_large_even_for_float64_are_one_clear_error(tmp_path: Path, side: str,
                                                              capsys: pytest.CaptureFixture) -> None:
    a, b = _pair(tmp_path, dtype=torch.float64)
    blown = a if side == "older" else b
    tensors = {k: v for k, v in load_file(blown / "model.safetensors").items()}
    tensors[Q.format(1)] = tensors[Q.format(1)] * 1e160
    save_file(tensors, blown / "model.safetensors", metadata={"format": "pt"})
    result = run_cli(capsys, "diff", a, b)
    assert result.code == 2 and "Traceback" not in result.stderr
    assert "too large for float64" in result.stderr and Q.format(1) in result.stderr
    assert str(blown) in result.stderr


def _bf16_pair(root: Path, update: float, dtype: torch.dtype = torch.bfloat16, seed: int = 7) -> tuple[Path, Path]:
    """Checkpoint b = a + an update of the given absolute size (random signs),
    both stored in `dtype`: round-to-nearest erases updates below half the
    dtype's spacing (|w| ~ 0.02: bf16 spacing ~ 1.2e-4)."""
    config = llama_config(layers=2, experts=4)
    base = {k: v.to(dtype).double() for k, v in llama_tensors(config, seed=1).items()}
    gen = torch.Generator().manual_seed(seed)
    moved = {k: v + update * torch.randn(v.shape, generator=gen, dtype=torch.float64).sign() for k, v in base.items()}
    a = write_hf_checkpoint(root / "checkpoint-100", base, config, dtype=dtype)
    b = write_hf_checkpoint(root / "checkpoint-200", moved, config, dtype=dtype)
    return a, b


def _precision(layer: LayerResult) -> list[Finding]:
    return [f for f in layer.findings if f.rule == "precision"]


def test_updates_below_bf16_resolution_are_called_out(tmp_path: Path) -> None:
    report = scan_pair(*_bf16_pair(tmp_path, update=1e-5))
    for layer in report.pairs[0].layers:
        assert layer.stored_dtype["W_q"] == "BF16"
        assert 0 < layer.changed_fraction["W_q"] < MIN_CHANGED_FRACTION
        findings = _precision(layer)
        assert len(findings) == 1
        finding = findings[0]
        assert finding.family == "numeric" and finding.severity == "warn"
        assert "BF16" in finding.message and "fp32 master weights" in finding.message
        assert finding.value == pytest.approx(min(layer.changed_fraction.values()))
    assert report.summary.status == "warn"


def test_identical_bf16_checkpoints_say_why(tmp_path: Path) -> None:
    report = scan_pair(*_bf16_pair(tmp_path, update=0.0))
    assert "weights that did not train" in report.summary.message  # a diff with no update to judge
    for layer in report.pairs[0].layers:
        assert layer.attention.unchanged
        (finding,) = _precision(layer)
        assert finding.severity == "info" and "fp32 master weights" in finding.message


@pytest.mark.parametrize("update,dtype", [(1e-5, torch.float32), (1e-3, torch.bfloat16), (1e-4, torch.float16)],
                         ids=["fp32-storage", "bf16-large-update", "fp16-above-resolution"])
def test_no_precision_finding_when_the_update_registers(tmp_path: Path, update: float, dtype: torch.dtype) -> None:
    """Controls: the same tiny update stored in float32, and updates above
    bf16/fp16 resolution, change most elements and raise nothing."""
    report = scan_pair(*_bf16_pair(tmp_path, update=update, dtype=dtype))
    for layer in report.pairs[0].layers:
        assert min(layer.changed_fraction.values()) > MIN_CHANGED_FRACTION
        assert not _precision(layer)


def test_report_json_turns_any_non_finite_into_null(tmp_path: Path) -> None:
    """Whatever reaches the report (a float from any monitor, numpy scalars),
    the JSON has no NaN/Infinity and stays parseable."""
    import numpy as np
    report = scan_pair(*_pair(tmp_path, layers=2))
    attention = report.pairs[0].layers[0].attention
    attention.delta2_entropy, attention.delta3_entropy = float("nan"), float("inf")
    attention.dwq_rel_norm = np.float32("nan")
    attention.dwk_rel_norm = np.float64(0.5)
    report.pairs[0].layers[0].nonfinite["W_q"] = np.int64(2)
    data = strict_json(report_json(report))
    layer = data["pairs"][0]["layers"][0]["attention"]
    assert layer["delta2_entropy"] is None and layer["delta3_entropy"] is None and layer["dwq_rel_norm"] is None
    assert layer["dwk_rel_norm"] == 0.5
    assert data["pairs"][0]["layers"][0]["nonfinite"]["W_q"] == 2


@pytest.mark.parametrize("stored,expected", [
    ({"W_qkv": "BF16", "router": "F32"}, "warn"),  # fused QKV: its elements are W_q's and W_k's
    ({"W_q^T": "F16", "W_k^T": "F16"}, "warn"),  # transposed (GPT-2 Conv1D)
    ({"W_q_a": "BF16", "W_q_b": "BF16", "W_kv_a": "BF16", "W_kv_b": "BF16"}, None),  # MLA: Q is a product
    ({"W_q": "F32", "W_k": "F32"}, None),
])
def test_precision_rule_reads_the_stored_tensor_behind_each_role(stored: dict, expected: str | None) -> None:
    from ckptscan.detection.numerics import precision_findings
    layer = LayerResult(layer=0, stored_dtype=stored, changed_fraction={"W_q": 0.1, "W_k": 0.2, "router": 0.05})
    findings = precision_findings(layer)
    assert [f.severity for f in findings] == ([expected] if expected else [])
    if expected:
        assert findings[0].value == 0.1 and "W_q" in findings[0].message
