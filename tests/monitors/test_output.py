"""The output family's monitors against dense float64 numpy written from
their definitions (docs/monitors.md, "Output family"): the logits'
covariance W D_γ² Wᵀ over the whole vocabulary (V × V) for the logit
scales and the common shift, numpy's SVD of ΔW for the update spectrum.
Random heads of several shapes (V above and below d), stored in float32
and bfloat16, tied and untied, and row blocks smaller than the head."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from output_reference import brute_scales, brute_update

from ckptscan.layouts import LayerWeights
from ckptscan.monitors.output import head_stats, head_update, logit_rms, mean_row_share, shift_scale
from ckptscan.monitors.output_family import MONITORS, NAME, OUTPUT, output_values
from ckptscan.schema.results import LayerResult

SHAPES = [(40, 12), (7, 16), (129, 33)]
DTYPES = [torch.float32, torch.bfloat16]


def _head(shape, seed, dtype, mean=0.0):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(shape, generator=gen, dtype=torch.float64) * 0.3 + mean * torch.randn(shape[1], generator=gen,
                                                                                         dtype=torch.float64)
    return w.to(dtype)


def _gain(d, seed):
    return torch.rand(d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 1.5 + 0.25


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("with_gain", [True, False])
def test_logit_scales_are_the_logit_covariance_of_unit_rms_inputs(shape, dtype, with_gain):
    w = _head(shape, 1, dtype, mean=0.5)
    gain = _gain(shape[1], 2) if with_gain else None
    expected = brute_scales(w, gain)
    for block in (3, 8192):  # row blocks smaller than the head give the same sums
        stats = head_stats(w, gain, block=block)
        got = {"output_logit_rms": logit_rms(stats), "output_logit_max": stats.max_row,
               "output_shift": shift_scale(stats), "output_mean_row_share": mean_row_share(stats)}
        assert got == pytest.approx(expected, rel=1e-10)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_the_update_spectrum_and_coherence_are_those_of_dense_delta_w(shape, dtype):
    a = _head(shape, 3, dtype)
    b = (a.to(torch.float64) + _head(shape, 4, torch.float64) * 0.1 + 0.05 * _head((1, shape[1]), 5, torch.float64)
         ).to(dtype)
    expected = brute_update(a, b)
    for block in (5, 8192):
        update = head_update(a, b, block=block)
        got = {"dw_head_entropy_norm": update.entropy_norm, "dw_head_rel_norm": update.relative_norm,
               "dw_head_mean_coherence": update.mean_coherence}
        assert got == pytest.approx(expected, rel=1e-9)


def test_coherence_is_zero_for_a_cross_entropy_gradient_step_and_sqrt_v_for_a_common_step():
    """The derivation's premise: the cross-entropy gradient G = (p − y) hᵀ summed
    over a batch has rows that sum to 0 (Σ_v p_v = Σ_v y_v = 1), so an SGD step
    leaves the mean row where it was; a step shared by every row is fully coherent."""
    gen = np.random.default_rng(0)
    v, d, n = 50, 8, 30
    w = gen.normal(size=(v, d))
    h = gen.normal(size=(n, d))
    logits = h @ w.T
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    y = np.eye(v)[gen.integers(0, v, n)]
    grad = (p - y).T @ h  # [V, d]
    assert np.abs(grad.sum(0)).max() < 1e-12
    a = torch.from_numpy(w)
    assert head_update(a, a - 0.1 * torch.from_numpy(grad)).mean_coherence == pytest.approx(0.0, abs=1e-10)
    common = torch.from_numpy(np.tile(gen.normal(size=d), (v, 1)))
    assert head_update(a, a + common).mean_coherence == pytest.approx(math.sqrt(v), rel=1e-12)


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_family_values_of_a_pair_are_the_newer_heads_scales_and_the_update(tied, dtype):
    a, b = _head((33, 10), 6, dtype, mean=0.2), _head((33, 10), 7, dtype, mean=0.2)
    gain = _gain(10, 8)
    values = output_values(LayerWeights(head=a, head_tied=tied, final_gain=_gain(10, 9)),
                           LayerWeights(head=b, head_tied=tied, final_gain=gain))
    assert set(values) == set(MONITORS)
    assert values == pytest.approx({**brute_scales(b, gain), **brute_update(a, b)}, rel=1e-9)
    reads = {m.name: m.read for m in OUTPUT.monitors}
    layer = LayerResult(layer=3, families={NAME: values})
    assert all(reads[name](layer) == values[name] for name in MONITORS)


def test_a_layer_without_the_head_or_with_a_non_finite_one_has_no_values():
    w = _head((9, 4), 1, torch.float32)
    assert output_values(LayerWeights(), LayerWeights()) == {}
    bad = w.clone()
    bad[2, 1] = float("nan")
    assert output_values(LayerWeights(head=w), LayerWeights(head=bad)) == {}


def test_an_unchanged_head_has_no_update_entropy_and_a_zero_update():
    w = _head((9, 4), 1, torch.bfloat16)
    update = head_update(w, w.clone())
    assert update.entropy_norm is None and update.relative_norm == 0.0 and update.mean_coherence is None


def test_shapes_that_do_not_fit_are_refused():
    with pytest.raises(ValueError, match="gain of shape"):
        head_stats(torch.ones(3, 4), torch.ones(5))
    with pytest.raises(ValueError, match="do not match"):
        head_update(torch.ones(3, 4), torch.ones(4, 4))
