"""A pair's attention result: the per-head QK spectra of the older and newer
weights (`ckptscan.monitors.attention`) as per-head rows and layer means."""

from __future__ import annotations

import torch

from ckptscan.layouts import LayerWeights
from ckptscan.monitors.attention import QKGrams, QKSpectra, logit_scale, qk_norm_logit_bound, qk_spectra
from ckptscan.monitors.spectral import spectral_stats
from ckptscan.monitors.whole_matrix import whole_matrix_singular_values
from ckptscan.schema.results import AttentionResult, HeadResult
from ckptscan.scan.selection import HeadSelection
from ckptscan.scan.summaries import finite_or_none, mean_of_changed


def attention_result(a: LayerWeights, b: LayerWeights, grams_a: QKGrams | None, dtype: torch.dtype,
                     selection: HeadSelection | None, full_spectrum: bool) -> AttentionResult:
    """The QK spectra of the heads scanned (every head without a selection),
    per head and as layer means, with the whole-matrix and MLA rope parts."""
    heads = selection or HeadSelection.every(a.q.shape[0], a.k.shape[0])
    spectra = qk_spectra(a.q, a.k, b.q, b.k, compute_dtype=dtype, grams_a=grams_a, kv_index=heads.kv_index)
    scale = None
    if (b.q_norm_gain is None or b.k_norm_gain is None) and b.input_gain is not None:
        scale = logit_scale(b.q, b.k, input_gain=b.input_gain, kv_index=heads.kv_index, compute_dtype=dtype).cpu()
    result = _from_spectra(spectra, heads, scale)
    if b.q_norm_gain is not None and b.k_norm_gain is not None:
        result.qk_norm_logit_bound = finite_or_none(qk_norm_logit_bound(b.q_norm_gain, b.k_norm_gain))
    if full_spectrum:
        _fill_full_spectrum(result, a, b, dtype)
    if a.rope_q is not None and b.rope_q is not None:
        _fill_rope(result, a, b, dtype)
    return result


# The per-head entropy columns, in the order `_from_spectra` stacks them, and the other per-head values.
_SPECTRA = ("delta2_entropy", "delta3_entropy", "dwq_entropy", "dwk_entropy", "delta1_entropy")
_VALUES = ("q_spectral_norm", "qk_logit_bound", "logit_scale")


def _from_spectra(spectra: QKSpectra, selection: HeadSelection, scale: torch.Tensor | None) -> AttentionResult:
    """Per-head rows and layer means, read back in one transfer. Row i of
    `spectra` is query head selection.heads[i]; head numbers in the result are
    the model's. `scale`: the newer checkpoint's logit scale per head, or None.
    A head whose weights did not change has no spectrum (None); a mean over
    heads excludes them, and is None when none changed."""
    num_heads = spectra.delta2.shape[0]
    # Every spectrum in one statistics pass: the narrower ones padded with zeros
    # (no energy, no entropy), each normalised by its own possible rank.
    parts = [spectra.delta2, spectra.delta3, spectra.dwq, spectra.delta1, spectra.dwk]
    width = spectra.delta2.shape[-1]
    rows = torch.cat([torch.nn.functional.pad(x, (0, width - x.shape[-1])) for x in parts])
    ranks = torch.tensor([x.shape[-1] for x in parts]).repeat_interleave(torch.tensor([len(x) for x in parts]))
    stats = spectral_stats(rows, rank=ranks)
    kv_rows = torch.arange(4 * num_heads, len(rows))  # ΔW_k, one row per KV head
    # [5, H] in `_SPECTRA` order; ΔW_k as each query head's KV head.
    order = torch.cat([torch.arange(3 * num_heads), kv_rows[selection.kv_index],
                       torch.arange(3 * num_heads, 4 * num_heads)])
    entropy, norm_entropy, eff_rank, unchanged = (getattr(stats, f)[order].unflatten(0, (5, num_heads)) for f in
                                                  ("entropy", "normalized_entropy", "effective_rank", "unchanged"))
    kv_changed = ~stats.unchanged[kv_rows]
    changed = ~unchanged
    # Layer means over changed heads (ΔW_k over KV heads), their counts, and minima: [sum, count] pairs.
    sources = [(entropy[0], changed[0]), (norm_entropy[0], changed[0]), (entropy[1], changed[1]),
               (entropy[2], changed[2]), (eff_rank[0], changed[0]), (entropy[4], changed[4]),
               (norm_entropy[2], changed[2]), (stats.entropy[kv_rows], kv_changed),
               (stats.normalized_entropy[kv_rows], kv_changed)]
    sums = torch.stack([torch.where(kept, values, 0.0).sum() for values, kept in sources])
    counts = torch.stack([kept.sum() for _, kept in sources]).to(torch.float64)
    minima = torch.stack([torch.where(changed[0], x, float("inf")).amin() for x in (entropy[0], norm_entropy[0])])
    worst = torch.where(changed[0], entropy[0], float("inf")).argmin()
    base = spectra.q_spectral_norm_base
    nan = torch.full((num_heads,), float("nan"), dtype=torch.float64)
    scales = nan if scale is None else scale.to(torch.float64)
    layer = torch.cat([sums, counts, minima, torch.stack([
        spectra.qk_logit_bound.max(), spectra.q_spectral_norm.max(),
        (spectra.q_spectral_norm / torch.where(base > 0, base, 1.0)).max(),
        spectra.dwq_rel_norm, spectra.dwk_rel_norm, spectra.q_cosine, spectra.k_cosine,
        worst.to(torch.float64), scales.max()])])
    columns = torch.cat([entropy, unchanged.to(torch.float64), torch.stack([
        torch.where(unchanged[0], 0.0, norm_entropy[0]), spectra.q_spectral_norm, spectra.qk_logit_bound, scales])])
    # The one readback of the layer: every number the report holds.
    column_values, layer_values = columns.tolist(), layer.tolist()
    count = len(sources)
    means = [total / n if n else None for total, n in zip(layer_values[:count], layer_values[count:2 * count])]
    (d2_min, d2_norm_min, logit_bound, norm_max, growth, dwq_rel, dwk_rel, q_cos, k_cos, worst_row,
     scale_max) = layer_values[2 * count:]
    any_changed = bool(means[0] is not None)
    heads = []
    for row, (h, g) in enumerate(zip(selection.heads.tolist(), selection.kv_heads[selection.kv_index].tolist())):
        spectral = {name: None if column_values[5 + i][row] else column_values[i][row] for i, name in enumerate(_SPECTRA)}
        heads.append(HeadResult(
            head=h, kv_head=g, **spectral,
            delta2_entropy_norm=None if column_values[5][row] else column_values[10][row],
            q_spectral_norm=column_values[11][row], qk_logit_bound=column_values[12][row],
            logit_scale=None if scale is None else finite_or_none(column_values[13][row])))
    return AttentionResult(
        delta2_entropy=means[0],
        delta2_entropy_min=d2_min if any_changed else None,
        delta2_entropy_norm=means[1],
        delta3_entropy=means[2],
        dwq_entropy=means[3],
        dwk_entropy=means[7],
        dwq_rel_norm=dwq_rel,
        dwk_rel_norm=dwk_rel,
        qk_logit_bound=logit_bound,
        heads=heads,
        delta2_entropy_worst_head=int(selection.heads[int(worst_row)]) if any_changed else None,
        delta2_entropy_norm_min=d2_norm_min if any_changed else None,
        delta2_effective_rank=means[4],
        delta1_entropy=means[5],
        dwq_entropy_norm=means[6],
        dwk_entropy_norm=means[8],
        q_spectral_norm_max=norm_max,
        q_spectral_norm_growth=growth,
        unchanged=not any_changed,
        q_weight_cosine=finite_or_none(q_cos),
        k_weight_cosine=finite_or_none(k_cos),
        logit_scale=None if scale is None else finite_or_none(scale_max),
    )


def _fill_rope(result: AttentionResult, a: LayerWeights, b: LayerWeights, dtype: torch.dtype) -> None:
    """MLA's decoupled rope part: each query head's rope rows against the one
    key shared by all heads, monitored as its own one-KV-head QK term (the
    content heads cannot carry it: the rope key is not per head)."""
    spectra = qk_spectra(a.rope_q, a.rope_k, b.rope_q, b.rope_k, compute_dtype=dtype)
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
