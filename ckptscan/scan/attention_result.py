"""A pair's attention result: the per-head QK spectra of the older and newer
weights (`ckptscan.monitors.attention`) as per-head rows and layer means."""

from __future__ import annotations

from dataclasses import fields, replace

import torch

from ckptscan.layouts import LayerWeights
from ckptscan.monitors.attention import QKGrams, QKSpectra, logit_scale, qk_norm_logit_bound, qk_spectra
from ckptscan.monitors.spectral import SpectralStats, spectral_stats
from ckptscan.monitors.whole_matrix import whole_matrix_singular_values
from ckptscan.schema.results import AttentionResult, HeadResult
from ckptscan.scan.selection import HeadSelection
from ckptscan.scan.summaries import finite_or_none, mean_of_changed, min_of_changed, values_or_none


def attention_result(a: LayerWeights, b: LayerWeights, grams_a: QKGrams | None, dtype: torch.dtype,
                     selection: HeadSelection | None, full_spectrum: bool) -> AttentionResult:
    """The QK spectra of the heads scanned (every head without a selection),
    per head and as layer means, with the whole-matrix and MLA rope parts."""
    heads = selection or HeadSelection.every(a.q.shape[0], a.k.shape[0])
    spectra = _on_cpu(qk_spectra(a.q, a.k, b.q, b.k, compute_dtype=dtype, grams_a=grams_a,
                                 kv_index=heads.kv_index))
    result = _from_spectra(spectra, heads)
    _fill_logit_scale(result, b, heads)
    if full_spectrum:
        _fill_full_spectrum(result, a, b, dtype)
    if a.rope_q is not None and b.rope_q is not None:
        _fill_rope(result, a, b, dtype)
    return result


def _from_spectra(spectra: QKSpectra, selection: HeadSelection) -> AttentionResult:
    """Per-head rows and layer means. Row i of `spectra` is query head
    selection.heads[i]; head numbers in the result are the model's."""
    d1, d2, d3 = spectral_stats(spectra.delta1), spectral_stats(spectra.delta2), spectral_stats(spectra.delta3)
    dwq, dwk = spectral_stats(spectra.dwq), spectral_stats(spectra.dwk)
    dwk_per_head = _index_stats(dwk, selection.kv_index)
    # One conversion per column, not one per head and field: this list is
    # built for every layer of every pair.
    columns = zip(
        selection.heads.tolist(),
        selection.kv_heads[selection.kv_index].tolist(),
        values_or_none(d2.entropy, d2.unchanged),
        values_or_none(d3.entropy, d3.unchanged),
        values_or_none(dwq.entropy, dwq.unchanged),
        values_or_none(dwk_per_head.entropy, dwk_per_head.unchanged),
        values_or_none(d1.entropy, d1.unchanged),
        values_or_none(d2.normalized_entropy, d2.unchanged),
        spectra.q_spectral_norm.tolist(),
        spectra.qk_logit_bound.tolist(),
    )
    heads = [
        HeadResult(
            head=h,
            kv_head=g,
            delta2_entropy=e2,
            delta3_entropy=e3,
            dwq_entropy=eq,
            dwk_entropy=ek,
            delta1_entropy=e1,
            delta2_entropy_norm=n2,
            q_spectral_norm=qn,
            qk_logit_bound=lb,
        )
        for h, g, e2, e3, eq, ek, e1, n2, qn, lb in columns
    ]
    changed = ~d2.unchanged
    worst = None
    if bool(changed.any()):
        masked = torch.where(changed, d2.entropy, torch.full_like(d2.entropy, float("inf")))
        worst = int(selection.heads[masked.argmin()])
    base = spectra.q_spectral_norm_base
    growth = spectra.q_spectral_norm / torch.where(base > 0, base, torch.ones_like(base))
    return AttentionResult(
        delta2_entropy=mean_of_changed(d2.entropy, d2.unchanged),
        delta2_entropy_min=min_of_changed(d2.entropy, d2.unchanged),
        delta2_entropy_norm=mean_of_changed(d2.normalized_entropy, d2.unchanged),
        delta3_entropy=mean_of_changed(d3.entropy, d3.unchanged),
        dwq_entropy=mean_of_changed(dwq.entropy, dwq.unchanged),
        dwk_entropy=mean_of_changed(dwk.entropy, dwk.unchanged),
        dwq_rel_norm=spectra.dwq_rel_norm,
        dwk_rel_norm=spectra.dwk_rel_norm,
        qk_logit_bound=float(spectra.qk_logit_bound.max()),
        heads=heads,
        delta2_entropy_worst_head=worst,
        delta2_entropy_norm_min=min_of_changed(d2.normalized_entropy, d2.unchanged),
        delta2_effective_rank=mean_of_changed(d2.effective_rank, d2.unchanged),
        delta1_entropy=mean_of_changed(d1.entropy, d1.unchanged),
        dwq_entropy_norm=mean_of_changed(dwq.normalized_entropy, dwq.unchanged),
        dwk_entropy_norm=mean_of_changed(dwk.normalized_entropy, dwk.unchanged),
        q_spectral_norm_max=float(spectra.q_spectral_norm.max()),
        q_spectral_norm_growth=float(growth.max()),
        unchanged=bool(d2.unchanged.all()),
        q_weight_cosine=finite_or_none(spectra.q_cosine),
        k_weight_cosine=finite_or_none(spectra.k_cosine),
    )


def _fill_logit_scale(result: AttentionResult, b: LayerWeights, selection: HeadSelection) -> None:
    """The newer checkpoint's logit scale per head and its maximum (from the
    input norm's gain), or the logit bound of its per-head QK-norm, where the
    layout gives what sets them."""
    if b.q_norm_gain is not None and b.k_norm_gain is not None:
        result.qk_norm_logit_bound = finite_or_none(qk_norm_logit_bound(b.q_norm_gain, b.k_norm_gain))
        return
    if b.input_gain is None or b.q is None or b.k is None:
        return
    scale = logit_scale(b.q, b.k, input_gain=b.input_gain, kv_index=selection.kv_index).cpu()
    for head, value in zip(result.heads, scale.tolist()):
        head.logit_scale = finite_or_none(value)
    result.logit_scale = finite_or_none(float(scale.max()))


def _fill_rope(result: AttentionResult, a: LayerWeights, b: LayerWeights, dtype: torch.dtype) -> None:
    """MLA's decoupled rope part: each query head's rope rows against the one
    key shared by all heads, monitored as its own one-KV-head QK term (the
    content heads cannot carry it: the rope key is not per head)."""
    spectra = _on_cpu(qk_spectra(a.rope_q, a.rope_k, b.rope_q, b.rope_k, compute_dtype=dtype))
    d2, dwq, dwk = spectral_stats(spectra.delta2), spectral_stats(spectra.dwq), spectral_stats(spectra.dwk)
    result.rope_delta2_entropy = mean_of_changed(d2.entropy, d2.unchanged)
    result.rope_delta2_entropy_norm = mean_of_changed(d2.normalized_entropy, d2.unchanged)
    result.rope_dwq_entropy = mean_of_changed(dwq.entropy, dwq.unchanged)
    result.rope_dwk_entropy = mean_of_changed(dwk.entropy, dwk.unchanged)
    result.rope_qk_logit_bound = float(spectra.qk_logit_bound.max())


def _fill_full_spectrum(result: AttentionResult, a: LayerWeights, b: LayerWeights, dtype: torch.dtype) -> None:
    """Whole-matrix ΔW_q and ΔW_k spectral entropies over the heads scanned."""
    result.dwq_full_entropy, result.dwq_full_entropy_norm = _whole_matrix_entropy(a.q, b.q, dtype)
    result.dwk_full_entropy, result.dwk_full_entropy_norm = _whole_matrix_entropy(a.k, b.k, dtype)


def _whole_matrix_entropy(
    blocks_a: torch.Tensor, blocks_b: torch.Tensor, dtype: torch.dtype
) -> tuple[float | None, float | None]:
    # Head blocks [n, r, d] back to the projection's [n·r, d] rows.
    delta = (blocks_b.to(dtype) - blocks_a.to(dtype)).reshape(-1, blocks_a.shape[-1])
    stats = spectral_stats(whole_matrix_singular_values(delta, dtype))
    if bool(stats.unchanged):
        return None, None
    return finite_or_none(float(stats.entropy)), finite_or_none(float(stats.normalized_entropy))


def _on_cpu(spectra: QKSpectra) -> QKSpectra:
    """The small per-head spectra on the CPU, moved once per pair (a no-op on
    the CPU path): the report is made of Python floats."""
    moved = {f.name: getattr(spectra, f.name).cpu() for f in fields(spectra)
             if isinstance(getattr(spectra, f.name), torch.Tensor)}
    return replace(spectra, **moved)


def _index_stats(stats: SpectralStats, index: torch.Tensor) -> SpectralStats:
    return SpectralStats(*(getattr(stats, f)[index] for f in stats.__dataclass_fields__))
