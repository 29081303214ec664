"""`heads` selection and the `full_spectrum` opt-in, checked against the full
scan and against dense float64 SVDs of the stored matrices."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptscan.errors import CkptScanError
from ckptscan.monitors.spectral import spectral_stats
from ckptscan.monitors.whole_matrix import whole_matrix_singular_values
from ckptscan.readers import open_checkpoint
from ckptscan import scan_pair
from ckptscan.scan import ScanOptions
from factories import llama_config, llama_tensors, updated, write_hf_checkpoint

CONFIG = llama_config(layers=2, hidden=48, heads=6, kv_heads=2)


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("pair")
    a = llama_tensors(CONFIG, seed=3)
    gen = torch.Generator().manual_seed(4)
    # A random update plus a rank-2 one in layer 1's queries: spectra with structure.
    b = updated(a, 2e-3, gen)
    q1 = "model.layers.1.self_attn.q_proj.weight"
    u, w = torch.randn(b[q1].shape[0], 2, generator=gen), torch.randn(2, b[q1].shape[1], generator=gen)
    b[q1] = b[q1] + 0.05 * (u.double() @ w.double())
    return (write_hf_checkpoint(root / "checkpoint-1", a, CONFIG, dtype=torch.bfloat16),
            write_hf_checkpoint(root / "checkpoint-2", b, CONFIG, dtype=torch.bfloat16))


def _close(x: float | None, y: float | None, rel: float) -> bool:
    return x is not None and y is not None and math.isclose(x, y, rel_tol=rel, abs_tol=rel)


@pytest.mark.parametrize("heads", [[0], [1, 4], [5, 2, 3]])
def test_selected_heads_match_the_full_scan(pair, heads):
    options = ScanOptions(compute_dtype=torch.float64)
    full = scan_pair(*pair, options)
    part = scan_pair(*pair, ScanOptions(compute_dtype=torch.float64, heads=heads))
    kv_of = {h: h // 3 for h in range(6)}
    for full_layer, part_layer in zip(full.pairs[0].layers, part.pairs[0].layers):
        by_head = {h.head: h for h in full_layer.attention.heads}
        rows = part_layer.attention.heads
        assert [h.head for h in rows] == sorted(heads)
        assert [h.kv_head for h in rows] == [kv_of[h] for h in sorted(heads)]
        for row in rows:
            ref = by_head[row.head]
            for name in ("delta1_entropy", "delta2_entropy", "delta3_entropy", "dwq_entropy", "dwk_entropy",
                         "q_spectral_norm", "qk_logit_bound"):
                assert _close(getattr(row, name), getattr(ref, name), 1e-9), (row.head, name)
        # Layer values are means over the selected heads (ΔW_k over their KV heads).
        mean_d2 = sum(by_head[h].delta2_entropy for h in heads) / len(heads)
        assert _close(part_layer.attention.delta2_entropy, mean_d2, 1e-9)
        kv_heads = sorted({kv_of[h] for h in heads})
        first_of_kv = {kv_of[h]: by_head[h] for h in sorted(heads)}
        mean_dwk = sum(first_of_kv[g].dwk_entropy for g in kv_heads) / len(kv_heads)
        assert _close(part_layer.attention.dwk_entropy, mean_dwk, 1e-9)
        worst = min(heads, key=lambda h: by_head[h].delta2_entropy)
        assert part_layer.attention.delta2_entropy_worst_head == worst


@pytest.mark.parametrize("heads", [[6], [-1], []])
def test_heads_out_of_range_are_refused(pair, heads):
    with pytest.raises(CkptScanError, match="head"):
        scan_pair(*pair, ScanOptions(heads=heads))


def _dense_entropy(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    delta = b.double() - a.double()
    sv = torch.linalg.svdvals(delta)
    stats = spectral_stats(sv)
    return float(stats.entropy), float(stats.normalized_entropy)


@pytest.mark.parametrize("heads", [None, [1, 4]])
def test_full_spectrum_matches_dense_svd_of_the_stored_update(pair, heads):
    report = scan_pair(*pair, ScanOptions(compute_dtype=torch.float64, full_spectrum=True, heads=heads))
    ckpt_a, ckpt_b = open_checkpoint(pair[0]), open_checkpoint(pair[1])
    r = CONFIG["hidden_size"] // CONFIG["num_attention_heads"]
    q_rows = [i for h in (heads or range(6)) for i in range(h * r, (h + 1) * r)]
    k_rows = [i for g in sorted({h // 3 for h in heads or range(6)}) for i in range(g * r, (g + 1) * r)]
    for layer in report.pairs[0].layers:
        for proj, rows, field in (("q_proj", q_rows, "dwq"), ("k_proj", k_rows, "dwk")):
            name = f"model.layers.{layer.layer}.self_attn.{proj}.weight"
            entropy, norm = _dense_entropy(ckpt_a.tensors.get(name)[rows], ckpt_b.tensors.get(name)[rows])
            assert _close(getattr(layer.attention, f"{field}_full_entropy"), entropy, 1e-9)
            assert _close(getattr(layer.attention, f"{field}_full_entropy_norm"), norm, 1e-9)


def test_full_spectrum_is_off_by_default(pair):
    layer = scan_pair(*pair).pairs[0].layers[0]
    assert layer.attention.dwq_full_entropy is None and layer.attention.dwk_full_entropy is None


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 40), cols=st.integers(1, 40), rank=st.integers(1, 40), seed=st.integers(0, 2**31))
def test_whole_matrix_singular_values_match_dense_svd(rows, cols, rank, seed):
    gen = torch.Generator().manual_seed(seed)
    rank = min(rank, rows, cols)
    m = torch.randn(rows, rank, generator=gen, dtype=torch.float64) @ torch.randn(rank, cols, generator=gen,
                                                                                  dtype=torch.float64)
    dense = torch.linalg.svdvals(m)
    for dtype, rel in ((torch.float64, 1e-9), (torch.float32, 1e-5)):
        sv = whole_matrix_singular_values(m, dtype)
        assert sv.shape == (min(rows, cols),) and sv.dtype == torch.float64
        top = float(dense[0])
        # Gram method: each σ within ~u·σ_max²/σ; σ²-weighted statistics to ~u.
        assert torch.allclose(sv.square(), dense.square(), rtol=0, atol=10 * rel * top**2)
        assert _close(float(spectral_stats(sv).entropy), float(spectral_stats(dense).entropy), 10 * rel)


def test_whole_matrix_of_zeros_is_unchanged_not_nan():
    stats = spectral_stats(whole_matrix_singular_values(torch.zeros(5, 7)))
    assert bool(stats.unchanged) and float(stats.entropy) == 0.0
