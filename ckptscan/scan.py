"""The library API: scan checkpoint pairs and runs into plain dataclasses.

Data flows one way: readers (bytes -> tensors) -> layouts (tensors -> heads
and routers) -> monitors (math) -> results -> detection (findings). The loop
is layer-major: for each layer, the checkpoints are visited in step order and
only the previous checkpoint's layer is held, so memory stays at about two
layers' monitored tensors and each checkpoint's bytes are read once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from ckptscan.detection.rules import Thresholds, assess_report
from ckptscan.errors import CkptScanError
from ckptscan.layouts import HeadOverrides, LayerPlan, LayerWeights, ModelLayout, resolve_layout
from ckptscan.monitors.attention import QKGrams, QKSpectra, kv_head_index, qk_grams, qk_spectra
from ckptscan.monitors.router import router_metrics
from ckptscan.monitors.spectral import SpectralStats, spectral_stats
from ckptscan.readers import Checkpoint, open_checkpoint
from ckptscan.results import (
    AttentionResult,
    CheckpointRef,
    HeadResult,
    LayerResult,
    PairResult,
    RouterResult,
    ScanReport,
    Summary,
)


@dataclass
class ScanOptions:
    compute_dtype: torch.dtype = torch.float32
    overrides: HeadOverrides = field(default_factory=HeadOverrides)
    layers: Sequence[int] | None = None  # None: every layer
    thresholds: Thresholds = field(default_factory=Thresholds)


def scan_pair(path_a: str | Path, path_b: str | Path, options: ScanOptions | None = None) -> ScanReport:
    """Compare two checkpoints (a older, b newer) layer by layer."""
    options = options or ScanOptions()
    return _scan("diff", [open_checkpoint(path_a), open_checkpoint(path_b)], options)


def scan_checkpoints(
    command: str,
    checkpoints: Sequence[Checkpoint],
    options: ScanOptions | None = None,
    pairs: Sequence[tuple[int, int]] | None = None,
) -> ScanReport:
    """Compare already-opened checkpoints (ordered oldest first).

    `pairs` are (older, newer) index pairs; by default every consecutive pair.
    A fixed base is [(0, j) for j in 1..N-1]; a stride s is [(i, i+s) …].
    """
    return _scan(command, list(checkpoints), options or ScanOptions(), pairs)


def _scan(
    command: str,
    checkpoints: list[Checkpoint],
    options: ScanOptions,
    pairs: Sequence[tuple[int, int]] | None = None,
) -> ScanReport:
    if len(checkpoints) < 2:
        raise CkptScanError("need at least two checkpoints to compare")
    pairs = list(pairs) if pairs is not None else [(i, i + 1) for i in range(len(checkpoints) - 1)]
    if not pairs or any(not 0 <= a < b < len(checkpoints) for a, b in pairs):
        raise CkptScanError(f"invalid checkpoint pairs {pairs}: each must be (older, newer) indices")
    layouts = [resolve_layout(c, options.overrides) for c in checkpoints]
    for ckpt, layout in zip(checkpoints[1:], layouts[1:]):
        _check_compatible(checkpoints[0], layouts[0], ckpt, layout)
    plans = _selected_plans(layouts[0], options.layers, checkpoints[0].path)

    results = [
        PairResult(checkpoints[a].step, checkpoints[b].step, [], str(checkpoints[a].path), str(checkpoints[b].path))
        for a, b in pairs
    ]
    used = sorted({i for pair in pairs for i in pair})
    last_use = {i: max(b for a, b in pairs if i in (a, b)) for i in used}
    for plan in plans:
        # Visit checkpoints in step order, holding a layer only while a later
        # pair still needs it: each checkpoint's bytes are read once.
        held: dict[int, _LoadedLayer] = {}
        for i in used:
            layout = layouts[i]
            held[i] = _load_layer(checkpoints[i], layout.layers[_plan_position(layout, plan.layer)], options)
            for result, (a, b) in zip(results, pairs):
                if b == i:
                    result.layers.append(_compare(plan.layer, held[a], held[b], options))
            held = {j: layer for j, layer in held.items() if last_use[j] > i}

    report = ScanReport(
        command=command,
        model=layouts[0].info,
        checkpoints=[CheckpointRef(str(c.path), c.step) for c in checkpoints],
        pairs=results,
        summary=Summary(status="ok", flagged_layers=[], first_alert_step={}),
    )
    assess_report(report, options.thresholds)
    return report


@dataclass
class _LoadedLayer:
    weights: LayerWeights
    nonfinite: dict[str, int]
    grams: QKGrams | None = None


def _load_layer(ckpt: Checkpoint, plan: LayerPlan, options: ScanOptions) -> _LoadedLayer:
    dtype = options.compute_dtype
    raw = {name: ckpt.tensors.get(name) for name in plan.tensors}
    nonfinite = {}
    for name, tensor in raw.items():
        if tensor.is_floating_point():
            bad = int((~torch.isfinite(tensor)).sum())
            if bad:
                nonfinite[plan.roles.get(name, name)] = bad
    weights = plan.build(raw, dtype)
    grams = None
    if weights.q is not None and not any(r in nonfinite for r in ("W_q", "W_k", "q_norm", "k_norm")):
        grams = qk_grams(weights.q, weights.k, dtype)
    return _LoadedLayer(weights, nonfinite, grams)


def _compare(layer: int, a: _LoadedLayer, b: _LoadedLayer, options: ScanOptions) -> LayerResult:
    dtype = options.compute_dtype
    result = LayerResult(layer=layer)
    for role, count in {**a.nonfinite, **b.nonfinite}.items():
        result.nonfinite[role] = max(a.nonfinite.get(role, 0), b.nonfinite.get(role, 0))
    wa, wb = a.weights, b.weights
    if wa.q is not None and a.grams is not None and b.grams is not None:
        spectra = qk_spectra(wa.q, wa.k, wb.q, wb.k, compute_dtype=dtype, grams_a=a.grams, grams_b=b.grams)
        result.attention = _attention_result(spectra, wa.q.shape[0], wa.k.shape[0])
    if wa.router is not None and wb.router is not None and "router" not in result.nonfinite:
        result.router = _router_result(wa, wb)
    return result


def _attention_result(spectra: QKSpectra, num_heads: int, num_kv_heads: int) -> AttentionResult:
    kv = kv_head_index(num_heads, num_kv_heads)
    d1, d2, d3 = spectral_stats(spectra.delta1), spectral_stats(spectra.delta2), spectral_stats(spectra.delta3)
    dwq, dwk = spectral_stats(spectra.dwq), spectral_stats(spectra.dwk)
    dwk_per_head = _index_stats(dwk, kv)
    heads = [
        HeadResult(
            head=h,
            kv_head=int(kv[h]),
            delta2_entropy=_value(d2.entropy, d2.unchanged, h),
            delta3_entropy=_value(d3.entropy, d3.unchanged, h),
            dwq_entropy=_value(dwq.entropy, dwq.unchanged, h),
            dwk_entropy=_value(dwk_per_head.entropy, dwk_per_head.unchanged, h),
            delta1_entropy=_value(d1.entropy, d1.unchanged, h),
            delta2_entropy_norm=_value(d2.normalized_entropy, d2.unchanged, h),
            q_spectral_norm=float(spectra.q_spectral_norm[h]),
            qk_logit_bound=float(spectra.qk_logit_bound[h]),
        )
        for h in range(num_heads)
    ]
    changed = ~d2.unchanged
    worst = None
    if bool(changed.any()):
        masked = torch.where(changed, d2.entropy, torch.full_like(d2.entropy, float("inf")))
        worst = int(masked.argmin())
    base = spectra.q_spectral_norm_base
    growth = spectra.q_spectral_norm / torch.where(base > 0, base, torch.ones_like(base))
    return AttentionResult(
        delta2_entropy=_mean(d2.entropy, d2.unchanged),
        delta2_entropy_min=_min(d2.entropy, d2.unchanged),
        delta2_entropy_norm=_mean(d2.normalized_entropy, d2.unchanged),
        delta3_entropy=_mean(d3.entropy, d3.unchanged),
        dwq_entropy=_mean(dwq.entropy, dwq.unchanged),
        dwk_entropy=_mean(dwk.entropy, dwk.unchanged),
        dwq_rel_norm=spectra.dwq_rel_norm,
        dwk_rel_norm=spectra.dwk_rel_norm,
        qk_logit_bound=float(spectra.qk_logit_bound.max()),
        heads=heads,
        delta2_entropy_worst_head=worst,
        delta2_entropy_norm_min=_min(d2.normalized_entropy, d2.unchanged),
        delta2_effective_rank=_mean(d2.effective_rank, d2.unchanged),
        delta1_entropy=_mean(d1.entropy, d1.unchanged),
        dwq_entropy_norm=_mean(dwq.normalized_entropy, dwq.unchanged),
        dwk_entropy_norm=_mean(dwk.normalized_entropy, dwk.unchanged),
        q_spectral_norm_max=float(spectra.q_spectral_norm.max()),
        q_spectral_norm_growth=float(growth.max()),
        unchanged=bool(d2.unchanged.all()),
    )


def _router_result(a: LayerWeights, b: LayerWeights) -> RouterResult:
    m = router_metrics(a.router, b.router, a.router_bias, b.router_bias)
    unchanged = bool(m.dwr.unchanged)
    return RouterResult(
        epsilon=_finite(m.epsilon),
        cosine_similarity=_finite(m.cosine_similarity),
        dwr_entropy=None if unchanged else float(m.dwr.entropy),
        epsilon_change=_finite(m.epsilon - m.epsilon_base),
        cosine_similarity_change=_finite(m.cosine_similarity - m.cosine_similarity_base),
        dwr_entropy_norm=None if unchanged else float(m.dwr.normalized_entropy),
        dwr_rel_norm=_finite(m.dwr_rel_norm),
        bias_spread=m.bias_spread,
        bias_spread_change=None if m.bias_spread is None else m.bias_spread - (m.bias_spread_base or 0.0),
        unchanged=unchanged,
    )


def _index_stats(stats: SpectralStats, index: torch.Tensor) -> SpectralStats:
    return SpectralStats(*(getattr(stats, f)[index] for f in stats.__dataclass_fields__))


def _value(values: torch.Tensor, unchanged: torch.Tensor, i: int) -> float | None:
    return None if bool(unchanged[i]) else float(values[i])


def _mean(values: torch.Tensor, unchanged: torch.Tensor) -> float | None:
    kept = values[~unchanged]
    return float(kept.mean()) if kept.numel() else None


def _min(values: torch.Tensor, unchanged: torch.Tensor) -> float | None:
    kept = values[~unchanged]
    return float(kept.min()) if kept.numel() else None


def _finite(value: float) -> float | None:
    return value if value == value and abs(value) != float("inf") else None


def _selected_plans(layout: ModelLayout, layers: Sequence[int] | None, path: Path) -> list[LayerPlan]:
    if layers is None:
        return layout.layers
    available = {p.layer for p in layout.layers}
    missing = sorted(set(layers) - available)
    if missing:
        raise CkptScanError(f"no layer(s) {missing}; the model has layers {min(available)}..{max(available)}",
                            path=path)
    return [p for p in layout.layers if p.layer in set(layers)]


def _plan_position(layout: ModelLayout, layer: int) -> int:
    for i, plan in enumerate(layout.layers):
        if plan.layer == layer:
            return i
    raise AssertionError(f"layer {layer} vanished after the compatibility check")


def _check_compatible(ckpt_a: Checkpoint, layout_a: ModelLayout, ckpt_b: Checkpoint, layout_b: ModelLayout) -> None:
    if layout_a.info != layout_b.info:
        diffs = [
            f"{f}: {getattr(layout_a.info, f)} vs {getattr(layout_b.info, f)}"
            for f in layout_a.info.__dataclass_fields__
            if getattr(layout_a.info, f) != getattr(layout_b.info, f)
        ]
        raise CkptScanError(f"checkpoints are of different models ({'; '.join(diffs)}): {ckpt_a.path} vs {ckpt_b.path}")
    for plan_a, plan_b in zip(layout_a.layers, layout_b.layers):
        for name_a, name_b in zip(plan_a.tensors, plan_b.tensors):
            shape_a, shape_b = ckpt_a.tensors.shape(name_a), ckpt_b.tensors.shape(name_b)
            if shape_a != shape_b or name_a != name_b:
                raise CkptScanError(
                    f"shape {list(shape_a)} in {ckpt_a.path} but {list(shape_b)} in {ckpt_b.path}", tensor=name_a
                )

