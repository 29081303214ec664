"""FP8 block-scaled weights (DeepSeek-V3 release layout) come back dequantised."""

import json
import math

import pytest
import torch
from factories import random_weights
from format_writers import write_torch_bin
from safetensors.torch import save_file

from ckptscan.errors import CkptScanError
from ckptscan.readers import open_checkpoint

Q_A = "model.layers.3.self_attn.q_a_proj.weight"
NORM = "model.layers.3.self_attn.q_a_layernorm.weight"


def quantise(weight: torch.Tensor, block: tuple[int, int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 codes and per-block scales, as DeepSeek's fp8 cast writes them:
    each block scaled into the e4m3 range by its own (random, non-trivial) scale."""
    br, bc = block
    rows, cols = math.ceil(weight.shape[0] / br), math.ceil(weight.shape[1] / bc)
    gen = torch.Generator().manual_seed(seed)
    scale = torch.empty((rows, cols), dtype=torch.float32)
    codes = torch.empty(weight.shape, dtype=torch.float8_e4m3fn)
    for i in range(rows):
        for j in range(cols):
            block_values = weight[i * br:(i + 1) * br, j * bc:(j + 1) * bc]
            # amax maps into [224, 448]: inside e4m3's range, a different scale per block.
            scale[i, j] = block_values.abs().max() / 448 * (1 + torch.rand((), generator=gen).item())
            codes[i * br:(i + 1) * br, j * bc:(j + 1) * bc] = (block_values / scale[i, j].double()).to(
                torch.float8_e4m3fn)
    return codes, scale


def dequantise_float64(codes: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """The reference: every element times its block's scale, in float64, block by block."""
    br, bc = block
    out = torch.empty(codes.shape, dtype=torch.float64)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            out[i * br:(i + 1) * br, j * bc:(j + 1) * bc] = (
                codes[i * br:(i + 1) * br, j * bc:(j + 1) * bc].to(torch.float64) * scale[i, j].item())
    return out


def write_deepseek_fp8(directory, shape=(300, 200), block=(128, 128), config_block=True):
    """A DeepSeek-V3-style shard: F8_E4M3 weight + F32 `weight_scale_inv`, BF16 norm,
    quantization_config in config.json; 300x200 leaves partial last blocks."""
    directory.mkdir(parents=True)
    codes, scale = quantise(random_weights(shape, 1), block, seed=2)
    norm = (random_weights((shape[1],), 3) + 1).to(torch.bfloat16)
    save_file({Q_A: codes, Q_A + "_scale_inv": scale, NORM: norm},
              directory / "model-00001-of-00001.safetensors", metadata={"format": "pt"})
    config = {"model_type": "deepseek_v3"}
    if config_block:
        config["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                          "weight_block_size": list(block)}
    (directory / "config.json").write_text(json.dumps(config))
    return codes, scale, norm


def test_fp8_weight_is_dequantised_block_by_block(tmp_path):
    codes, scale, norm = write_deepseek_fp8(tmp_path / "ckpt")
    expected = dequantise_float64(codes, scale, (128, 128))
    tensors = open_checkpoint(tmp_path / "ckpt").tensors
    got = tensors.get(Q_A)
    assert got.dtype == torch.float32 and tensors.dtype(Q_A) == "F8_E4M3"
    assert expected.isfinite().all() and expected.count_nonzero() > 0.9 * expected.numel()
    torch.testing.assert_close(got.double(), expected, rtol=2 ** -23, atol=0)
    # Rows that start and end inside blocks, spanning the partial last block.
    torch.testing.assert_close(tensors.get(Q_A, rows=(100, 300)).double(), expected[100:300], rtol=2 ** -23, atol=0)
    torch.testing.assert_close(tensors.get(Q_A, rows=(130, 131)).double(), expected[130:131], rtol=2 ** -23, atol=0)
    # Everything else passes through untouched; the scales stay listed.
    assert torch.equal(tensors.get(NORM), norm)
    assert Q_A + "_scale_inv" in tensors.keys()


def test_block_size_comes_from_quantization_config(tmp_path):
    codes, scale, _ = write_deepseek_fp8(tmp_path / "ckpt", shape=(100, 70), block=(64, 32))
    got = open_checkpoint(tmp_path / "ckpt").tensors.get(Q_A)
    torch.testing.assert_close(got.double(), dequantise_float64(codes, scale, (64, 32)), rtol=2 ** -23, atol=0)


def test_scale_shape_that_does_not_fit_the_blocks_is_refused(tmp_path):
    write_deepseek_fp8(tmp_path / "ckpt", shape=(100, 70), block=(64, 32), config_block=False)
    with pytest.raises(CkptScanError, match=r"needs block scales of shape \[1, 1\].*\[2, 3\]"):
        open_checkpoint(tmp_path / "ckpt").tensors.get(Q_A)


def test_fp8_without_scales_is_refused(tmp_path):
    (tmp_path / "ckpt").mkdir()
    codes = random_weights((16, 16), 4).to(torch.float8_e4m3fn)
    save_file({Q_A: codes, "other.weight_scale_inv": torch.ones(1, 1), "other.weight": codes.clone()},
              tmp_path / "ckpt" / "model.safetensors")
    with pytest.raises(CkptScanError, match="without a .*_scale_inv"):
        open_checkpoint(tmp_path / "ckpt").tensors.get(Q_A)


def test_fp8_in_a_torch_pickle_is_dequantised_too(tmp_path):
    codes, scale = quantise(random_weights((130, 260), 5), (128, 128), seed=6)
    write_torch_bin(tmp_path / "ckpt", {Q_A: codes, Q_A + "_scale_inv": scale}, {"model_type": "deepseek_v3"})
    got = open_checkpoint(tmp_path / "ckpt").tensors.get(Q_A)
    torch.testing.assert_close(got.double(), dequantise_float64(codes, scale, (128, 128)), rtol=2 ** -23, atol=0)
