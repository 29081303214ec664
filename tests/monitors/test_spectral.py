"""Specification of ckptscan.monitors.spectral.spectral_stats (monitors.md,
"Spectral statistics"), checked against the definitions written out in numpy:
p_i = σ_i²/Σσ², H = −Σ p ln p (natural log, 0 ln 0 = 0), H/ln n, exp(H),
Σσ²/σ_1², ‖·‖_F."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptscan.monitors.spectral import SpectralStats, eigvalsh_two_sizes, spectral_stats
from dense_reference import spectrum_stats

FIELDS = ("entropy", "normalized_entropy", "effective_rank", "stable_rank", "frobenius_norm", "spectral_norm")


def assert_matches_reference(stats: SpectralStats, spectra: np.ndarray, n: int, rel=1e-12):
    """Relative 1e-12; entropies also absolute 1e-14: −p ln p with p ≈ 1 is
    only absolutely accurate (ln p ≈ p − 1 inherits p's rounding)."""
    for index, spectrum in enumerate(spectra):
        ref = spectrum_stats(spectrum, n)
        assert bool(stats.unchanged[index]) == ref["unchanged"]
        if ref["unchanged"]:
            continue
        for field in FIELDS:
            floor = 1e-14 if "entropy" in field else 0.0
            assert float(getattr(stats, field)[index]) == pytest.approx(ref[field], rel=rel, abs=floor), field


@settings(max_examples=150, deadline=None)
@given(
    batch=st.integers(1, 4),
    length=st.integers(1, 40),
    log_scale=st.floats(-150, 150),
    seed=st.integers(0, 2**32 - 1),
    with_zeros=st.booleans(),
)
def test_statistics_follow_the_definitions_at_any_scale(batch, length, log_scale, seed, with_zeros):
    rng = np.random.default_rng(seed)
    spectra = rng.uniform(0.01, 1.0, size=(batch, length)) ** rng.uniform(1, 4) * 10.0**log_scale
    if with_zeros:  # zero singular values contribute 0 ln 0 = 0
        spectra[:, rng.integers(0, length, size=length // 2)] = 0.0
        spectra[:, 0] = 10.0**log_scale
    stats = spectral_stats(torch.tensor(spectra))
    assert stats.entropy.shape == (batch,)
    assert_matches_reference(stats, spectra, length)


@pytest.mark.parametrize("rank", [2, 7, 64])
def test_rank_argument_sets_the_normaliser_ln_n(rank):
    spectra = np.random.default_rng(rank).uniform(0.1, 1.0, size=(3, 5))
    stats = spectral_stats(torch.tensor(spectra), rank=rank)
    assert_matches_reference(stats, spectra, rank)


def test_order_of_the_singular_values_does_not_matter():
    s = torch.tensor([3.0, 0.5, 2.0, 1e-3, 0.0], dtype=torch.float64)
    a, b = spectral_stats(s), spectral_stats(s.flip(0)[torch.tensor([2, 0, 4, 1, 3])])
    for field in FIELDS:
        assert float(getattr(a, field)) == pytest.approx(float(getattr(b, field)), rel=1e-15)


def test_all_zero_spectrum_is_unchanged_and_never_nan():
    spectra = torch.zeros(3, 6, dtype=torch.float64)
    spectra[1] = torch.tensor([2.0, 1.0, 0, 0, 0, 0])  # a changed one in the same batch
    stats = spectral_stats(spectra)
    assert stats.unchanged.tolist() == [True, False, True]
    for field in FIELDS + ("unchanged",):
        value = getattr(stats, field)
        assert not torch.isnan(value.double()).any(), field
    for field in FIELDS:
        assert float(getattr(stats, field)[0]) == 0.0, field
    ref = spectrum_stats([2.0, 1.0, 0, 0, 0, 0], 6)
    assert float(stats.entropy[1]) == pytest.approx(ref["entropy"], rel=1e-14)


@pytest.mark.parametrize("shape", [(0,), (4, 0), (1,), (3, 1)])
def test_empty_and_single_value_spectra_are_well_defined(shape):
    stats = spectral_stats(torch.zeros(shape, dtype=torch.float64))
    assert bool(stats.unchanged.all())
    for field in FIELDS:
        assert not torch.isnan(getattr(stats, field)).any(), field


def test_one_direction_has_zero_entropy_and_unit_ranks():
    stats = spectral_stats(torch.tensor([[0.0, 4.0, 0.0]], dtype=torch.float64))
    assert float(stats.entropy[0]) == 0.0 and float(stats.normalized_entropy[0]) == 0.0
    assert float(stats.effective_rank[0]) == 1.0 and float(stats.stable_rank[0]) == 1.0
    assert float(stats.frobenius_norm[0]) == 4.0 and float(stats.spectral_norm[0]) == 4.0


def test_single_possible_direction_has_normalised_entropy_one():
    # n = 1: one direction is the only possible spectrum (monitors.md choice).
    stats = spectral_stats(torch.tensor([[2.5]], dtype=torch.float64))
    assert float(stats.normalized_entropy[0]) == 1.0 and float(stats.entropy[0]) == 0.0


@pytest.mark.parametrize("n", [2, 5, 256])
def test_flat_spectrum_has_entropy_ln_n_and_effective_rank_n(n):
    stats = spectral_stats(torch.full((n,), 0.37, dtype=torch.float64))
    assert float(stats.entropy) == pytest.approx(math.log(n), rel=1e-14)
    assert float(stats.normalized_entropy) == pytest.approx(1.0, rel=1e-14)
    assert float(stats.effective_rank) == pytest.approx(n, rel=1e-13)
    assert float(stats.stable_rank) == pytest.approx(n, rel=1e-14)
    assert float(stats.frobenius_norm) == pytest.approx(0.37 * math.sqrt(n), rel=1e-14)


def test_statistics_are_scale_free_and_do_not_underflow():
    base = torch.tensor([1.0, 0.3, 0.01], dtype=torch.float64)
    ref = spectral_stats(base)
    for scale in (1e-200, 1e-160, 1e160, 1e200):  # σ² would underflow/overflow
        stats = spectral_stats(base * scale)
        assert not bool(stats.unchanged)
        for field in ("entropy", "normalized_entropy", "effective_rank", "stable_rank"):
            assert float(getattr(stats, field)) == pytest.approx(float(getattr(ref, field)), rel=1e-14), field
        assert float(stats.frobenius_norm) == pytest.approx(float(ref.frobenius_norm) * scale, rel=1e-14)


def test_float32_singular_values_are_accepted():
    s = np.array([3.0, 1.0, 0.25], dtype=np.float32)
    stats = spectral_stats(torch.tensor(s))
    assert stats.entropy.dtype == torch.float64
    assert float(stats.entropy) == pytest.approx(spectrum_stats(s.astype(np.float64), 3)["entropy"], rel=1e-14)


def test_non_finite_spectrum_is_not_reported_unchanged():
    stats = spectral_stats(torch.tensor([1.0, float("nan"), 0.5], dtype=torch.float64))
    assert not bool(stats.unchanged)
    assert math.isnan(float(stats.entropy))


# ------------------------------------------- two sizes in one solver call ---


def random_symmetric(rng, count, k, psd, rank=None):
    factor = rng.normal(size=(count, k, rank or k)) * rng.uniform(1e-6, 1e3, size=(count, 1, 1))
    if psd:
        return factor @ factor.transpose(0, 2, 1)
    return factor + factor.transpose(0, 2, 1)


@settings(max_examples=60, deadline=None)
@given(wide=st.integers(0, 3), narrow=st.integers(1, 7), k=st.integers(1, 9), seed=st.integers(0, 2**32 - 1),
       rank=st.integers(0, 9))
def test_eigvalsh_two_sizes_equals_separate_dense_eigensolves(wide, narrow, k, seed, rank):
    """Each matrix's eigenvalues as numpy finds them on its own: wide ones to
    1e-12 of their largest, narrow positive semi-definite ones (of any rank,
    scales 1e-6 to 1e3 apart in one call) to 1e-12 of theirs."""
    rng = np.random.default_rng(seed)
    big = random_symmetric(rng, wide, 2 * k, psd=False)
    small = random_symmetric(rng, narrow, k, psd=True, rank=min(rank, k) or None)
    got_wide, got_narrow = eigvalsh_two_sizes(torch.tensor(big).reshape(wide, 2 * k, 2 * k), torch.tensor(small))
    assert got_wide.shape == (wide, 2 * k) and got_narrow.shape == (narrow, k)
    for got, want in zip(got_wide.numpy(), np.linalg.eigvalsh(big) if wide else []):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * np.abs(want).max())
    for got, want in zip(got_narrow.numpy(), np.linalg.eigvalsh(small)):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * max(np.abs(want).max(), 1e-300))


def test_eigvalsh_two_sizes_keeps_zero_matrices_exactly_zero():
    rng = np.random.default_rng(5)
    small = np.concatenate([np.zeros((2, 4, 4)), random_symmetric(rng, 1, 4, psd=True)])
    _, got = eigvalsh_two_sizes(torch.zeros(0, 8, 8, dtype=torch.float64), torch.tensor(small))
    assert torch.all(got[:2] == 0)


def test_eigvalsh_two_sizes_refuses_wide_matrices_of_another_size():
    with pytest.raises(ValueError, match="cannot share a call"):
        eigvalsh_two_sizes(torch.zeros(1, 5, 5, dtype=torch.float64), torch.zeros(1, 3, 3, dtype=torch.float64))
