"""Two checkpoints that are not the same model cannot be compared: the error
names what differs (the tensor and both shapes, or the setting and both
values), from the library and on the command line."""

from __future__ import annotations

from pathlib import Path

import pytest
from factories import llama_config, llama_tensors, write_hf_checkpoint
from hostile.helpers import assert_one_line_error, run_cli

from ckptscan import scan_pair
from ckptscan.errors import CkptScanError


def _pair(root: Path, config_a: dict, config_b: dict, tensors_b: dict | None = None) -> tuple[Path, Path]:
    a = write_hf_checkpoint(root / "checkpoint-100", llama_tensors(config_a, seed=1), config_a)
    b = write_hf_checkpoint(root / "checkpoint-200", tensors_b or llama_tensors(config_b, seed=2), config_b)
    return a, b


def _error(a: Path, b: Path) -> str:
    with pytest.raises(CkptScanError) as e:
        scan_pair(a, b)
    return str(e.value)


def test_different_families(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a, b = _pair(tmp_path, llama_config(), llama_config(model_type="mistral"))
    message = _error(a, b)
    assert "llama" in message and "mistral" in message
    assert_one_line_error(run_cli(capsys, "diff", a, b), "llama", "mistral")


def test_different_hidden_sizes_name_the_tensor_and_both_shapes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a, b = _pair(tmp_path, llama_config(hidden=64), llama_config(hidden=128))
    message = _error(a, b)
    assert "q_proj.weight" in message
    assert "[64, 64]" in message and "[128, 128]" in message
    assert_one_line_error(run_cli(capsys, "diff", a, b), "q_proj.weight", "[64, 64]", "[128, 128]")


def test_different_kv_head_counts_name_the_tensor_and_both_shapes(tmp_path: Path) -> None:
    a, b = _pair(tmp_path, llama_config(kv_heads=2), llama_config(kv_heads=4))
    message = _error(a, b)
    assert "k_proj.weight" in message and "[32, 64]" in message and "[64, 64]" in message


def test_same_shapes_different_head_counts(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """4 heads of 16 vs 8 heads of 8: every tensor has the same shape, but a
    head-by-head comparison would pair unrelated rows."""
    config_b = llama_config(heads=8, kv_heads=4)
    a, b = _pair(tmp_path, llama_config(heads=4, kv_heads=2), config_b)
    message = _error(a, b)
    assert "4" in message and "8" in message and "heads" in message
    assert_one_line_error(run_cli(capsys, "diff", a, b), "heads")


def test_different_expert_counts(tmp_path: Path) -> None:
    a, b = _pair(tmp_path, llama_config(experts=4), llama_config(experts=8))
    message = _error(a, b)
    assert "gate.weight" in message or "experts" in message
    assert "4" in message and "8" in message


def test_different_layer_counts(tmp_path: Path) -> None:
    a, b = _pair(tmp_path, llama_config(layers=2), llama_config(layers=3))
    message = _error(a, b)
    assert "2" in message and "3" in message and "layers" in message


def test_one_layer_with_a_stray_shape(tmp_path: Path) -> None:
    """Layer 1's q_proj is wider than layer 0's in the newer checkpoint."""
    config = llama_config()
    tensors_b = llama_tensors(config, seed=2)
    wider = llama_tensors(llama_config(heads=8, kv_heads=2, head_dim=16), seed=3)
    tensors_b["model.layers.1.self_attn.q_proj.weight"] = wider["model.layers.1.self_attn.q_proj.weight"]
    a, b = _pair(tmp_path, config, config, tensors_b)
    message = _error(a, b)
    assert "model.layers.1.self_attn.q_proj.weight" in message
    assert "[64, 64]" in message and "[128, 64]" in message


def test_head_flags_that_do_not_fit(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = llama_config()
    a, b = _pair(tmp_path, config, config)
    for path in (a, b):
        (path / "config.json").unlink()
    assert_one_line_error(run_cli(capsys, "diff", a, b, "--num-heads", "5", "--num-kv-heads", "1"), "q_proj")
