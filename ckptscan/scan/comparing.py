"""Comparing a layer of two checkpoints: (older, newer) loaded layers -> the
pair's `LayerResult` (non-finite counts, the fraction of weights changed,
the attention and router results, and the values of each registered family
that computes its own). `compare` does a layer's work on its weights' device
and leaves the attention's small solve pending; `finish` solves the pending
layers of several pairs and layers at once (one batched solve, one readback)."""

from __future__ import annotations

import torch

from dataclasses import dataclass

from ckptscan.layouts import LayerWeights
from ckptscan.monitors import registry
from ckptscan.readers.rows import StoredRows
from ckptscan.schema.results import LayerResult
from ckptscan.scan.attention_result import PendingAttention, attention_blocks, attention_results
from ckptscan.scan.loading import LoadedLayer
from ckptscan.scan.options import ScanOptions
from ckptscan.scan.router_result import router_result
from ckptscan.scan.selection import HeadSelection


@dataclass
class Compared:
    """A pair's layer compared, its attention result still to be solved (`finish`)."""

    result: LayerResult
    attention: PendingAttention | None = None

    @property
    def pending_bytes(self) -> int:
        return 0 if self.attention is None else self.attention.blocks.numel() * 8


def compare(
    layer: int, a: LoadedLayer, b: LoadedLayer, options: ScanOptions, selection: HeadSelection | None = None
) -> Compared:
    dtype = torch.float64 if torch.float64 in (a.compute_dtype, b.compute_dtype) else a.compute_dtype
    result = LayerResult(layer=layer)
    for role in {**a.nonfinite, **b.nonfinite}:
        result.nonfinite[role] = max(a.nonfinite.get(role, 0), b.nonfinite.get(role, 0))
    wa, wb = a.weights, b.weights
    result.stored_dtype = dict(b.stored_dtype)
    result.changed_fraction = _changed_fractions(wa, wb)
    compared = Compared(result)
    if a.qk_finite and b.qk_finite:
        compared.attention = attention_blocks(wa, wb, a.grams, dtype, selection, options.full_spectrum)
    if wa.router is not None and wb.router is not None and "router" not in result.nonfinite:
        result.router = router_result(wa, wb, a.routing, b.routing)
    head_proven = False
    for family in registry.families():
        compute = (family.full_compute if options.full_spectrum else None) or family.compute
        if compute is not None:
            values = compute(wa, wb)
            if values:  # {}: the family has nothing in this layer (the output family outside the last)
                result.families[family.name] = values
                head_proven |= family.proves_head_finite
    # The LM head is read a chunk at a time (`StoredRows`), not checked with the
    # layer's tensors: the output family's pass proves it finite; where it did
    # not, its non-finite values are counted for the numeric rule.
    for weights in (wa, wb):
        if isinstance(weights.head, StoredRows):
            if not weights.head.keep:  # read by its one pair: the chunk held goes now
                weights.head.release()
            if not head_proven and (bad := weights.head.count_nonfinite()):
                role = "embedding" if weights.head_tied else "lm_head"
                result.nonfinite[role] = max(result.nonfinite.get(role, 0), bad)
    return compared


def finish(compared: list[Compared]) -> list[LayerResult]:
    """The results of compared layers, their attention solved together."""
    pending = [c for c in compared if c.attention is not None]
    for item, attention in zip(pending, attention_results([c.attention for c in pending if c.attention])):
        item.result.attention = attention
    return [c.result for c in compared]


def _changed_fractions(a: LayerWeights, b: LayerWeights) -> dict[str, float]:
    """Per role, the fraction of elements that differ between the checkpoints
    (a widening cast keeps distinct stored values distinct), read back at once."""
    pairs = [(role, x, y) for role, x, y in (("W_q", a.q, b.q), ("W_k", a.k, b.k), ("router", a.router, b.router))
             if x is not None and y is not None and x.shape == y.shape and x.numel()]
    if not pairs:
        return {}
    counts = torch.stack([_count_changed(x, y) for _, x, y in pairs]).tolist()
    return {role: count / x.numel() for (role, x, _), count in zip(pairs, counts)}


def _count_changed(x: torch.Tensor, y: torch.Tensor, chunk: int = 1 << 22) -> torch.Tensor:
    """Elements with x != y (a 0-d tensor), compared a chunk at a time: a
    whole-layer boolean mask of a 7B q_proj would be 16 MB of fresh pages per
    layer, page-faulted in on every pair; 4 MB chunks reuse the same block of
    memory and keep a 1B layer to one comparison per tensor."""
    x, y = x.reshape(-1), y.reshape(-1)
    parts = [torch.count_nonzero(x[i:i + chunk] != y[i:i + chunk]) for i in range(0, x.numel(), chunk)]
    return parts[0] if len(parts) == 1 else torch.stack(parts).sum()
