"""The output family's monitors against dense float64 numpy written from
their definitions (docs/monitors.md, "Output family"): the logits'
covariance W D_γ² Wᵀ over the whole vocabulary (V × V) for the logit
scales and the common shift, numpy's SVD of ΔW for the update spectrum.
Random heads of several shapes (V above and below d), stored in float32
and bfloat16, tied and untied, with and without the final norm's gain, and
row blocks smaller than the head: every block size gives the same numbers.
The one pass reads each head once, a block at a time, and reads no number
back before its end; the update spectrum (V·d²) only when asked for."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from output_reference import brute_scales, brute_update
from torch.utils._python_dispatch import TorchDispatchMode

from ckptscan.layouts import LayerWeights
from ckptscan.monitors.output import (
    CPU_BLOCK_ELEMENTS,
    ROW_BLOCK,
    block_rows,
    head_pair,
    head_stats,
    head_update,
    logit_rms,
    mean_row_share,
    shift_scale,
)
from ckptscan.monitors.output_family import NAME, OUTPUT, output_values
from ckptscan.schema.results import LayerResult

MONITORS = tuple(m.name for m in OUTPUT.monitors)  # the family's monitors, as it declares them
SHAPES = [(40, 12), (7, 16), (129, 33)]
DTYPES = [torch.float32, torch.bfloat16]
BLOCKS = [1, 3, 7, None]  # None: the default, one block at these shapes
UPDATE = ("dw_head_entropy_norm", "dw_head_rel_norm", "dw_head_mean_coherence")


def _head(shape, seed, dtype, mean=0.0):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(shape, generator=gen, dtype=torch.float64) * 0.3 + mean * torch.randn(shape[1], generator=gen,
                                                                                         dtype=torch.float64)
    return w.to(dtype)


def _moved(a, seed, dtype):
    """a plus a random update with a common part (so the coherence is not ≈ 1 by chance)."""
    shape = tuple(a.shape)
    step = _head(shape, seed, torch.float64) * 0.1 + 0.05 * _head((1, shape[1]), seed + 1, torch.float64)
    return (a.to(torch.float64) + step).to(dtype)


def _gain(d, seed):
    return torch.rand(d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 1.5 + 0.25


def _update(update, with_spectrum=True):
    got = {"dw_head_entropy_norm": update.entropy_norm, "dw_head_rel_norm": update.relative_norm,
           "dw_head_mean_coherence": update.mean_coherence}
    return got if with_spectrum else {k: v for k, v in got.items() if k != "dw_head_entropy_norm"}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("with_gain", [True, False])
def test_logit_scales_are_the_logit_covariance_of_unit_rms_inputs(shape, dtype, with_gain):
    w = _head(shape, 1, dtype, mean=0.5)
    gain = _gain(shape[1], 2) if with_gain else None
    expected = brute_scales(w, gain)
    for block in BLOCKS:  # row blocks smaller than the head give the same sums
        stats = head_stats(w, gain, block=block)
        got = {"output_logit_rms": logit_rms(stats), "output_logit_max": stats.max_row,
               "output_shift": shift_scale(stats), "output_mean_row_share": mean_row_share(stats)}
        assert got == pytest.approx(expected, rel=1e-10)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_the_update_is_that_of_dense_delta_w_and_its_spectrum_only_when_asked(shape, dtype):
    a = _head(shape, 3, dtype)
    b = _moved(a, 4, dtype)
    expected = brute_update(a, b)
    for block in BLOCKS:
        assert _update(head_update(a, b, block=block, spectrum=True)) == pytest.approx(expected, rel=1e-9)
        default = head_update(a, b, block=block)
        assert default.entropy_norm is None
        assert _update(default, with_spectrum=False) == pytest.approx(
            {k: v for k, v in expected.items() if k != "dw_head_entropy_norm"}, rel=1e-10)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_gain", [True, False])
def test_one_pass_gives_the_newer_heads_scales_and_the_update_alike_for_every_block_size(dtype, with_gain):
    a = _head((129, 33), 5, dtype, mean=0.3)
    b = _moved(a, 6, dtype)
    gain = _gain(33, 7) if with_gain else None
    expected = {**brute_scales(b, gain), **brute_update(a, b)}
    seen = []
    for block in BLOCKS:
        pair = head_pair(a, b, gain, block=block, spectrum=True)
        got = {"output_logit_rms": logit_rms(pair.stats), "output_logit_max": pair.stats.max_row,
               "output_shift": shift_scale(pair.stats), "output_mean_row_share": mean_row_share(pair.stats),
               **_update(pair.update)}
        assert pair.finite and got == pytest.approx(expected, rel=1e-9)
        seen.append(got)
    assert all(got == pytest.approx(seen[0], rel=1e-13) for got in seen)


def test_the_default_blocks_are_smaller_than_a_wide_head_on_the_cpu():
    """At width 1024 a CPU block is 128 rows: a 300-row head takes three, two whole and one part."""
    assert block_rows(1024) == CPU_BLOCK_ELEMENTS // 1024 == 128
    a = _head((300, 1024), 8, torch.bfloat16, mean=0.2)
    b = _moved(a, 9, torch.bfloat16)
    gain = _gain(1024, 10)
    values = output_values(LayerWeights(head=a), LayerWeights(head=b, final_gain=gain), spectrum=True)
    assert values == pytest.approx({**brute_scales(b, gain), **brute_update(a, b)}, rel=1e-9)


def test_block_rows_hold_a_cache_sized_block_on_a_cpu_and_a_large_one_elsewhere():
    assert block_rows(2048, "cpu") == 64 and block_rows(2048, torch.device("cuda")) == 8192
    assert block_rows(1 << 25, "cuda") == block_rows(1 << 25) == 1  # never no rows
    assert block_rows(8, "cuda") == ROW_BLOCK


class _Ops(TorchDispatchMode):
    """The ops a computation dispatches: names, and the largest result of any op that makes new memory."""

    def __init__(self):
        super().__init__()
        self.names, self.largest = [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.names.append(func.overloadpacket.__name__)
        if not func.is_view and isinstance(out, torch.Tensor) and not func.overloadpacket.__name__.endswith("_") \
                and "out" not in (kwargs or {}):
            self.largest = max(self.largest, out.numel())
        return out


def test_the_pass_keeps_to_its_blocks():
    """Ten blocks of 100 rows: every block's rows copied once into the same two buffers
    (two copies a block), nothing of V × d made anew, no scalar read before the single one."""
    a = _head((1000, 64), 11, torch.bfloat16)
    b, gain = _moved(a, 12, torch.bfloat16), _gain(64, 13).float()
    with _Ops() as ops:
        pair = head_pair(a, b, gain, block=100)
    assert pair.finite
    assert ops.names.count("copy_") == 20 and ops.names.count("_to_copy") == 1  # only the gain is upcast whole
    assert ops.largest <= 100 * 64  # the buffers are a block; the row norms (V) and sums (d) are smaller
    assert "_local_scalar_dense" not in ops.names


def test_the_family_reads_no_number_back_before_the_end():
    """On a GPU each float(), .item() or bool() of a tensor is a host sync: the values come back in one .tolist()."""
    a = _head((300, 64), 14, torch.bfloat16)
    older, newer = LayerWeights(head=a), LayerWeights(head=_moved(a, 15, torch.bfloat16), final_gain=_gain(64, 16))
    with _Ops() as ops:
        values = output_values(older, newer)
    assert set(values) == set(MONITORS) and "_local_scalar_dense" not in ops.names


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
@pytest.mark.parametrize("with_gain", [True, False])
def test_the_family_values_of_a_pair_are_the_newer_heads_scales_and_the_update(tied, dtype, with_gain):
    a, b = _head((33, 10), 6, dtype, mean=0.2), _head((33, 10), 7, dtype, mean=0.2)
    gain = _gain(10, 8) if with_gain else None
    older, newer = (LayerWeights(head=a, head_tied=tied, final_gain=_gain(10, 9) if with_gain else None),
                    LayerWeights(head=b, head_tied=tied, final_gain=gain))
    expected = {**brute_scales(b, gain), **brute_update(a, b)}
    assert output_values(older, newer, spectrum=True) == pytest.approx(expected, rel=1e-9)
    values = output_values(older, newer)
    assert set(values) == set(MONITORS) and values.pop("dw_head_entropy_norm") is None  # the key stays, null
    assert values == pytest.approx({k: v for k, v in expected.items() if k != "dw_head_entropy_norm"}, rel=1e-10)
    reads = {m.name: m.read for m in OUTPUT.monitors}
    layer = LayerResult(layer=3, families={NAME: output_values(older, newer)})
    assert all(reads[name](layer) == layer.families[NAME][name] for name in MONITORS)


def test_the_update_spectrum_is_reported_never_judged():
    """Why null by default changes no verdict: nothing judges it (detection/output.py reads the scales only)."""
    spec = {m.name: m for m in OUTPUT.monitors}
    assert spec["dw_head_entropy_norm"].judging is None


@pytest.mark.parametrize("where", ["older", "newer", "gain"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_layer_without_the_head_or_with_a_non_finite_head_or_gain_has_no_values(where, bad):
    w = _head((9, 4), 1, torch.float32)
    assert output_values(LayerWeights(), LayerWeights()) == {}
    heads = {"older": w.clone(), "newer": _moved(w, 2, torch.float32)}
    gain = _gain(4, 3)
    if where == "gain":
        gain[1] = bad
    else:
        heads[where][2, 1] = bad
    for spectrum in (False, True):
        assert output_values(LayerWeights(head=heads["older"]), LayerWeights(head=heads["newer"], final_gain=gain),
                             spectrum=spectrum) == {}


def test_an_infinite_gain_over_a_zero_column_still_has_no_values():
    """0 · ∞ is NaN in the sums: a non-finite gain is seen even where the head's column is 0."""
    w = _head((9, 4), 1, torch.float32)
    w[:, 2] = 0
    gain = _gain(4, 3)
    gain[2] = float("inf")
    assert output_values(LayerWeights(head=w), LayerWeights(head=_moved(w, 2, torch.float32), final_gain=gain)) == {}


@pytest.mark.parametrize("spectrum", [False, True])
def test_an_unchanged_head_has_no_update_entropy_and_a_zero_update(spectrum):
    w = _head((9, 4), 1, torch.bfloat16)
    update = head_update(w, w.clone(), spectrum=spectrum)
    assert update.entropy_norm is None and update.relative_norm == 0.0 and update.mean_coherence is None


def test_shapes_that_do_not_fit_are_refused():
    with pytest.raises(ValueError, match="gain of shape"):
        head_stats(torch.ones(3, 4), torch.ones(5))
    with pytest.raises(ValueError, match="do not match"):
        head_update(torch.ones(3, 4), torch.ones(4, 4))
    with pytest.raises(ValueError, match="expected a head"):
        head_stats(torch.ones(4))
