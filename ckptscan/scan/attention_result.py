"""A pair's attention result: the per-head QK spectra of the older and newer
weights (`ckptscan.monitors.attention`) as per-head rows and layer means."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ckptscan.layouts import LayerWeights
from ckptscan.monitors.attention import (QKGrams, QKSpectra, logit_scale_from_squares, logit_scale_squares,
                                         qk_gram_blocks, qk_norm_logit_bound, qk_spectra, qk_spectra_from_blocks)
from ckptscan.monitors.spectral import spectral_stats
from ckptscan.monitors.whole_matrix import whole_matrix_singular_values
from ckptscan.schema.results import AttentionResult, HeadResult
from ckptscan.scan.selection import HeadSelection
from ckptscan.scan.summaries import finite_or_none, mean_of_changed


@dataclass
class PendingAttention:
    """A pair's layer on its way to its attention result: the O(d) Gram work
    done on the weights' device (`qk_gram_blocks`), the small solve not yet,
    so that several layers (and pairs) are solved and read back at once."""

    blocks: torch.Tensor  # [K, H + G, r, r] float64, CPU
    selection: HeadSelection
    width: int  # d, the hidden size the heads project from
    scale: torch.Tensor | None  # [H] the newer checkpoint's logit_scale_squares, CPU; None without an input gain
    # What only some layouts have (a QK-norm's bound, MLA's rope part, the whole-matrix
    # spectra), filled into the result once it exists.
    fills: list[Callable[[AttentionResult], None]] = field(default_factory=list)

    @property
    def batch_key(self) -> tuple:
        """Pending layers with equal keys are solved in one batch."""
        return (tuple(self.blocks.shape), self.width, tuple(self.selection.kv_index.tolist()), self.scale is None)


def attention_blocks(a: LayerWeights, b: LayerWeights, grams_a: QKGrams | None, dtype: torch.dtype,
                     selection: HeadSelection | None, full_spectrum: bool) -> PendingAttention:
    """The device work of a pair's layer: its Gram blocks and logit scale."""
    if a.q is None or a.k is None or b.q is None or b.k is None:
        raise ValueError("attention_blocks is given layers with attention only")
    heads = selection or HeadSelection.every(a.q.shape[0], a.k.shape[0])
    blocks = qk_gram_blocks(a.q, a.k, b.q, b.k, compute_dtype=dtype, grams_a=grams_a)
    pending = PendingAttention(blocks, heads, a.q.shape[-1], None)
    if b.q_norm_gain is not None and b.k_norm_gain is not None:
        bound = finite_or_none(qk_norm_logit_bound(b.q_norm_gain, b.k_norm_gain))
        pending.fills.append(lambda result: setattr(result, "qk_norm_logit_bound", bound))
    elif b.input_gain is not None:
        # Every head: repeat_kv's grouping, a broadcast rather than a gather.
        pending.scale = logit_scale_squares(b.q, b.k, input_gain=b.input_gain,
                                            kv_index=None if selection is None else heads.kv_index,
                                            compute_dtype=dtype).cpu()
    if full_spectrum:
        pending.fills.append(lambda result: _fill_full_spectrum(result, a, b, dtype))
    if a.rope_q is not None and b.rope_q is not None:
        pending.fills.append(lambda result: _fill_rope(result, a, b, dtype))
    return pending


def attention_results(pending: Sequence[PendingAttention]) -> list[AttentionResult]:
    """The attention results of pending layers, in order: those of one shape
    solved together (`qk_spectra_from_blocks`) and read back at once."""
    results: list[AttentionResult | None] = [None] * len(pending)
    batches: dict[tuple, list[int]] = {}
    for index, item in enumerate(pending):
        batches.setdefault(item.batch_key, []).append(index)
    for indices in batches.values():
        first = pending[indices[0]]
        spectra = qk_spectra_from_blocks(torch.stack([pending[i].blocks for i in indices]),
                                         len(first.selection.kv_index), first.selection.kv_index, first.width)
        scales = None if first.scale is None else logit_scale_from_squares(
            torch.stack([pending[i].scale for i in indices]), first.blocks.shape[-1])
        for i, result in zip(indices, _from_spectra(spectra, first.selection, scales)):
            for fill in pending[i].fills:
                fill(result)
            results[i] = result
    return [result for result in results if result is not None]


def _from_spectra(spectra: QKSpectra, selection: HeadSelection, scale: torch.Tensor | None) -> list[AttentionResult]:
    """Per-head rows and layer means of L layers' spectra (a leading layer
    dimension), read back in one transfer. Row i of a layer is query head
    selection.heads[i]; head numbers in the result are the model's. `scale`:
    the newer checkpoints' logit scale per head [L, H], or None. A head whose
    weights did not change has no spectrum (None); a mean over heads excludes
    them, and is None when none changed."""
    layers, num_heads = spectra.delta2.shape[:2]
    # Every spectrum in one statistics pass: the narrower ones padded with zeros
    # (no energy, no entropy), each normalised by its own possible rank.
    parts = [spectra.delta2, spectra.delta3, spectra.dwq, spectra.delta1, spectra.dwk]
    width = spectra.delta2.shape[-1]
    rows = torch.cat([torch.nn.functional.pad(x, (0, width - x.shape[-1])) for x in parts], 1)
    ranks = torch.tensor([x.shape[-1] for x in parts]).repeat_interleave(torch.tensor([x.shape[1] for x in parts]))
    stats = spectral_stats(rows, rank=ranks)
    # [L, 5, H] in `_SPECTRA` order; ΔW_k as each query head's KV head.
    order = torch.tensor(list(range(3 * num_heads)) + [4 * num_heads + g for g in selection.kv_index.tolist()]
                         + list(range(3 * num_heads, 4 * num_heads)))
    entropy, norm_entropy, eff_rank, unchanged = (getattr(stats, f)[:, order].unflatten(1, (5, num_heads)) for f in
                                                  ("entropy", "normalized_entropy", "effective_rank", "unchanged"))
    changed = ~unchanged
    # Layer means over the heads that changed (ΔW_k over KV heads), as [sum, count]:
    # Δ2, Δ3, ΔW_q, Δ1 entropies, Δ2 and ΔW_q normalised, Δ2 effective rank; ΔW_k and normalised.
    values = torch.cat([entropy[:, [0, 1, 2, 4]], norm_entropy[:, [0, 2]], eff_rank[:, [0]]], 1)
    kept = changed[:, [0, 1, 2, 4, 0, 2, 0]]
    kv_values = torch.stack([stats.entropy[:, 4 * num_heads:], stats.normalized_entropy[:, 4 * num_heads:]], 1)
    kv_kept = ~stats.unchanged[:, None, 4 * num_heads:]
    minima = torch.where(changed[:, :1], torch.stack([entropy[:, 0], norm_entropy[:, 0]], 1), float("inf")).amin(-1)
    base = spectra.q_spectral_norm_base
    scales = torch.full((layers, num_heads), float("nan"), dtype=torch.float64) if scale is None else scale.double()
    layer = torch.cat([
        torch.where(kept, values, 0.0).sum(-1), torch.where(kv_kept, kv_values, 0.0).sum(-1),
        kept.sum(-1).double(), kv_kept.sum(-1).double().expand(-1, 2), minima,
        torch.stack([spectra.qk_logit_bound.amax(-1), spectra.q_spectral_norm.amax(-1),
                     (spectra.q_spectral_norm / torch.where(base > 0, base, 1.0)).amax(-1),
                     spectra.dwq_rel_norm, spectra.dwk_rel_norm, spectra.q_cosine, spectra.k_cosine,
                     torch.where(changed[:, 0], entropy[:, 0], float("inf")).argmin(-1).double(),
                     scales.amax(-1)], 1)], 1)
    columns = torch.cat([entropy, unchanged.double(),
                         torch.stack([torch.where(unchanged[:, 0], 0.0, norm_entropy[:, 0]),
                                      spectra.q_spectral_norm, spectra.qk_logit_bound, scales], 1)], 1)
    # The one readback of the batch: every number the reports hold.
    head_numbers = selection.heads.tolist()
    kv_numbers = selection.kv_heads[selection.kv_index].tolist()
    return [_result(c, v, head_numbers, kv_numbers, scale is not None)
            for c, v in zip(columns.tolist(), layer.tolist())]


# The per-head entropy columns, in the order `_from_spectra` stacks them.
_SPECTRA = ("delta2_entropy", "delta3_entropy", "dwq_entropy", "dwk_entropy", "delta1_entropy")


def _result(columns: list[list[float]], values: list[float], head_numbers: list[int], kv_numbers: list[int],
            has_scale: bool) -> AttentionResult:
    """One layer's result from its read-back columns [14][H] and layer values."""
    sums, counts = values[:9], values[9:18]
    means = [total / n if n else None for total, n in zip(sums, counts)]
    (d2_entropy, d3_entropy, dwq_entropy, d1_entropy, d2_norm, dwq_norm, d2_rank, dwk_entropy, dwk_norm) = means
    (d2_min, d2_norm_min, logit_bound, norm_max, growth, dwq_rel, dwk_rel, q_cos, k_cos, worst_row,
     scale_max) = values[18:]
    any_changed = d2_entropy is not None
    heads = []
    for row, (h, g) in enumerate(zip(head_numbers, kv_numbers)):
        spectral = {name: None if columns[5 + i][row] else columns[i][row] for i, name in enumerate(_SPECTRA)}
        heads.append(HeadResult(
            head=h, kv_head=g, **spectral,
            delta2_entropy_norm=None if columns[5][row] else columns[10][row],
            q_spectral_norm=columns[11][row], qk_logit_bound=columns[12][row],
            logit_scale=finite_or_none(columns[13][row]) if has_scale else None))
    return AttentionResult(
        delta2_entropy=d2_entropy,
        delta2_entropy_min=d2_min if any_changed else None,
        delta2_entropy_norm=d2_norm,
        delta3_entropy=d3_entropy,
        dwq_entropy=dwq_entropy,
        dwk_entropy=dwk_entropy,
        dwq_rel_norm=dwq_rel,
        dwk_rel_norm=dwk_rel,
        qk_logit_bound=logit_bound,
        heads=heads,
        delta2_entropy_worst_head=head_numbers[int(worst_row)] if any_changed else None,
        delta2_entropy_norm_min=d2_norm_min if any_changed else None,
        delta2_effective_rank=d2_rank,
        delta1_entropy=d1_entropy,
        dwq_entropy_norm=dwq_norm,
        dwk_entropy_norm=dwk_norm,
        q_spectral_norm_max=norm_max,
        q_spectral_norm_growth=growth,
        unchanged=not any_changed,
        q_weight_cosine=finite_or_none(q_cos),
        k_weight_cosine=finite_or_none(k_cos),
        logit_scale=finite_or_none(scale_max) if has_scale else None,
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
