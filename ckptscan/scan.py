"""The scan core: checkpoints -> per-layer metrics of (older, newer) pairs.

Data flows one way: readers (bytes -> tensors) -> layouts (tensors -> heads
and routers) -> monitors (math) -> results. No thresholds here: detection
judges the metrics afterwards (`ckptscan.detection.judge`). The loop
is layer-major: for each layer, the checkpoints are visited in step order and
only the previous checkpoint's layer is held, so memory stays at about two
layers' monitored tensors and each checkpoint's bytes are read once. Layers
are independent: an executor (`ckptscan.executors`) runs them as tasks, by
default a couple at once on worker threads (`ckptscan.parallel`: one
worker's reads overlap the other's arithmetic), or on a Ray cluster.
Only the monitored tensors' bytes are read, and with `heads` only those
heads' rows of W_q and their KV heads' rows of W_k.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import torch

from ckptscan.errors import CkptScanError
from ckptscan.layouts import (
    HeadOverrides,
    LayerPlan,
    LayerWeights,
    ModelInfo,
    ModelLayout,
    TensorMap,
    resolve_layout,
)
from ckptscan.layouts.base import ROUTER_ROLES
from ckptscan.monitors.attention import QKGrams, QKSpectra, kv_head_index, qk_grams, qk_spectra
from ckptscan.monitors.router import router_metrics
from ckptscan.monitors.routing import RoutingStats, routing_stats
from ckptscan.monitors.spectral import SpectralStats, spectral_stats
from ckptscan.monitors.whole_matrix import whole_matrix_singular_values
from ckptscan.probe import Probe
from ckptscan.readahead import ReadAhead
from ckptscan.readers import Checkpoint
from ckptscan.results import AttentionResult, HeadResult, LayerResult, RouterResult
from ckptscan.storage import RemotePath

if TYPE_CHECKING:
    from ckptscan.executors import Executor


@dataclass(frozen=True)
class ScanOptions:
    """How metrics are computed. Frozen: a scan's options never change under it.

    Every field either can change a number, and is then listed in
    `cache_key()`, or only schedules the work (`SCHEDULING`); a test fails
    when a new field is neither, so the cache cannot serve numbers computed
    with other settings."""

    compute_dtype: torch.dtype = torch.float32
    overrides: HeadOverrides = field(default_factory=HeadOverrides)
    layers: Sequence[int] | None = None  # None: every layer
    device: str = "cpu"  # "cpu", "cuda", "cuda:N" or "auto" (cuda when available)
    heads: Sequence[int] | None = None  # None: every query head; else these (and their KV heads)
    tensor_map: TensorMap | None = None  # user regex -> role map replacing the layout resolvers
    full_spectrum: bool = False  # whole-matrix ΔW_q/ΔW_k spectra, O(d³) per layer
    workers: int | None = None  # layer worker threads; None: min(2, CPUs)
    # torch intra-op threads while the scan runs (set once, restored after);
    # None: CPUs / workers. Live mode passes its trainer's own count.
    threads: int | None = None

    def __post_init__(self) -> None:
        for name in ("layers", "heads"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, tuple(int(v) for v in value))

    def cache_key(self) -> dict[str, str]:
        """The settings that can change a metric, as stable strings."""
        tensor_map = self.tensor_map
        return {
            "compute_dtype": str(self.compute_dtype),
            "overrides": repr(self.overrides),
            "layers": repr(self.layers),
            "device": self.device,
            "heads": repr(self.heads),
            "tensor_map": "null" if tensor_map is None else json.dumps(
                {"patterns": {k: p.pattern for k, p in sorted(tensor_map.patterns.items())},
                 "settings": tensor_map.settings}, sort_keys=True, default=str),
            "full_spectrum": repr(self.full_spectrum),
        }


# ScanOptions fields that only schedule the work: they never change a number.
SCHEDULING = ("workers", "threads")

# Top-k for expert load when the config does not say (Mixtral's value).
DEFAULT_TOP_K = 2


def scan_layers(
    checkpoints: Sequence[Checkpoint],
    pairs: Sequence[tuple[int, int]],
    options: ScanOptions,
    probe: Probe | None = None,
    progress: Callable[[int, int], None] | None = None,
    *,
    executor: Executor | None = None,
    known: Mapping[int, Sequence[LayerResult]] | None = None,
    on_layer: Callable[[int, list[LayerResult]], None] | None = None,
) -> tuple[ModelInfo, list[list[LayerResult]]]:
    """The metrics of every (older, newer) index pair of `checkpoints`
    (ordered oldest first), layer by layer: (model, [pair][layer] results).

    `executor` runs the layer tasks (default: `LocalExecutor`, threads here).
    `known`: layer -> its results for every pair, already computed (a resumed
    run): those layers are not scheduled. `on_layer(layer, [pair] results)`
    is called on this thread as each computed layer arrives, and
    `progress(layers done, layers to compute)` after it.
    """
    checkpoints = list(checkpoints)
    if len(checkpoints) < 2:
        raise CkptScanError("need at least two checkpoints to compare")
    pairs = list(pairs)
    if not pairs or any(not 0 <= a < b < len(checkpoints) for a, b in pairs):
        raise CkptScanError(f"invalid checkpoint pairs {pairs}: each must be (older, newer) indices")
    layouts = [resolve_layout(c, options.overrides, options.tensor_map) for c in checkpoints]
    for ckpt, layout in zip(checkpoints[1:], layouts[1:]):
        _check_compatible(checkpoints[0], layouts[0], ckpt, layout)
    plans = _selected_plans(layouts[0], options.layers, checkpoints[0].path)
    if probe is not None:
        routers = {p.layer: (name, checkpoints[0].tensors.shape(name)) for p in plans if (name := _router_name(p))}
        probe.check_routers(routers, layouts[0].info.hidden_size, checkpoints[0].path)
    task = LayerTask(checkpoints, pairs, options, probe, layouts)
    found = {layer: list(results) for layer, results in (known or {}).items() if len(results) == len(pairs)}
    todo = [p.layer for p in plans if p.layer not in found]
    if executor is None:
        from ckptscan.executors.local import LocalExecutor

        executor = LocalExecutor(options.workers, options.threads)
    groups = executor.group(todo) if todo else []
    done = 0
    # Remote checkpoints: fetch the next layer-loads while the current ones are computed on.
    if any(isinstance(c.path, RemotePath) for c in checkpoints):
        task.readahead = ReadAhead(todo, task.used, task.prefetch_load)
    try:
        for position, group_results in executor.map(task, groups) if groups else ():
            for layer, layer_results in zip(groups[position], group_results):
                found[layer] = layer_results
                if on_layer is not None:
                    on_layer(layer, layer_results)
                done += 1
                if progress is not None:
                    progress(done, len(todo))
    finally:
        if task.readahead is not None:
            task.readahead.close()
    return layouts[0].info, [[found[p.layer][k] for p in plans] for k in range(len(pairs))]


class LayerTask:
    """One scan's per-layer work: `task(layers, stop)` -> [layer][pair] results.

    Each layer visits the checkpoints in step order and holds a checkpoint's
    layer only while a later pair still needs it: each checkpoint's bytes are
    read once, and each checkpoint's Grams are computed once.

    Picklable by location, for executors that run it in other processes:
    the pickle holds the checkpoints' paths, the probe's path and the options,
    never an open file or a tensor of weights, and the receiving process
    re-opens the checkpoints and resolves their layouts itself (reading
    headers only). The driver has checked them; the worker reads its rows
    straight from where they are stored.
    """

    def __init__(self, checkpoints: Sequence[Checkpoint], pairs: Sequence[tuple[int, int]], options: ScanOptions,
                 probe: Probe | None = None, layouts: Sequence[ModelLayout] | None = None) -> None:
        self.checkpoints = list(checkpoints)
        self.pairs = [tuple(pair) for pair in pairs]
        # "auto" is resolved where the task runs: the driver's CUDA says nothing of a worker node's.
        self.requested = options
        self.options = replace(options, device=resolve_device(options.device))
        self.probe = probe
        self.layouts = list(layouts) if layouts is not None else [
            resolve_layout(c, options.overrides, options.tensor_map) for c in self.checkpoints]
        self.top_k = self.layouts[0].info.top_k or DEFAULT_TOP_K
        self.selection = _head_selection(self.layouts[0].info, options.heads, self.checkpoints[0].path)
        self.used = sorted({i for pair in self.pairs for i in pair})
        self.last_use = {i: max(b for a, b in self.pairs if i in (a, b)) for i in self.used}
        self.bases = {a for a, _ in self.pairs}  # checkpoints whose Grams a pair reuses
        self.readahead: ReadAhead | None = None  # set by `scan_layers` for remote checkpoints

    def __reduce__(self) -> tuple:
        return (_Located, ([str(c.path) for c in self.checkpoints], self.pairs, self.requested,
                           None if self.probe is None else str(self.probe.path)))

    def __call__(self, layers: Sequence[int], stop: threading.Event) -> list[list[LayerResult]]:
        return [self.layer(layer, stop) for layer in layers]

    def describe(self, layers: Sequence[int]) -> str:
        """The task's work in words, for an error that can only name the task."""
        first, last = self.checkpoints[self.used[0]], self.checkpoints[self.used[-1]]
        return _describe(layers, first.path, last.path, len(self.used))

    def layer(self, layer: int, stop: threading.Event) -> list[LayerResult]:
        """This layer of every pair ([] once `stop` is set: the consumer has gone)."""
        options, pairs = self.options, self.pairs
        held: dict[int, _LoadedLayer] = {}
        compared: list[LayerResult | None] = [None] * len(pairs)
        plan = self.layouts[0].layers[_plan_position(self.layouts[0], layer)]
        # The probe's inputs for this layer are read once and routed by every checkpoint.
        probe_input = self.probe.router_input(layer) if self.probe is not None and _router_name(plan) else None
        if probe_input is not None:
            probe_input = probe_input.to(options.device)
        for i in self.used:
            if stop.is_set():  # the consumer has gone (error elsewhere, Ctrl-C)
                return []
            layout = self.layouts[i]
            plan_i = layout.layers[_plan_position(layout, layer)]
            if self.readahead is not None:
                self.readahead.reach(layer, i)
            held[i] = _load_layer(self.checkpoints[i], plan_i, options, probe_input, self.top_k, self.selection,
                                  as_base=i in self.bases)
            for k, (a, b) in enumerate(pairs):
                if b == i:
                    compared[k] = _compare(layer, held[a], held[b], options, self.selection)
            held = {j: loaded for j, loaded in held.items() if self.last_use[j] > i}
        return compared

    def prefetch_load(self, layer: int, i: int) -> Callable[[], None] | None:
        """Start fetching checkpoint i's `layer` (a `ReadAhead` starter)."""
        layout = self.layouts[i]
        return _prefetch(self.checkpoints[i], layout.layers[_plan_position(layout, layer)], self.selection)


class _Located:
    """A `LayerTask` as it arrives in another process: its inputs by location,
    opened when it first runs (so that a checkpoint broken since the driver
    checked it fails the task with the reader's error, not the unpickling)."""

    def __init__(self, locations: list[str], pairs: list[tuple[int, int]], options: ScanOptions,
                 probe: str | None) -> None:
        self.args = (locations, pairs, options, probe)
        self.task: LayerTask | None = None

    def __reduce__(self) -> tuple:
        return (_Located, self.args)

    def __call__(self, layers: Sequence[int], stop: threading.Event) -> list[list[LayerResult]]:
        if self.task is None:
            from ckptscan.probe import load_probe
            from ckptscan.readers import open_checkpoint

            locations, pairs, options, probe = self.args
            self.task = LayerTask([open_checkpoint(location) for location in locations], pairs, options,
                                  None if probe is None else load_probe(probe))
        return self.task(layers, stop)

    def describe(self, layers: Sequence[int]) -> str:
        locations, pairs, _, _ = self.args
        used = sorted({i for pair in pairs for i in pair})
        return _describe(layers, locations[used[0]], locations[used[-1]], len(used))


def _describe(layers: Sequence[int], first: object, last: object, count: int) -> str:
    span = f"layer {layers[0]}" if len(layers) == 1 else f"layers {layers[0]}-{layers[-1]}"
    return f"{span} of the {count} checkpoints {first} … {last}"


@dataclass
class _LoadedLayer:
    weights: LayerWeights
    nonfinite: dict[str, int]
    qk_finite: bool = False  # W_q/W_k present, finite and within the compute dtype's range
    grams: QKGrams | None = None  # only for a checkpoint that is the older side of a pair
    routing: RoutingStats | None = None
    stored_dtype: dict[str, str] = field(default_factory=dict)  # role -> safetensors dtype name
    compute_dtype: torch.dtype = torch.float32


def _load_layer(
    ckpt: Checkpoint,
    plan: LayerPlan,
    options: ScanOptions,
    probe_input: torch.Tensor | None = None,
    top_k: int = DEFAULT_TOP_K,
    selection: _HeadSelection | None = None,
    as_base: bool = True,
) -> _LoadedLayer:
    """One checkpoint's layer, read and checked. `as_base`: the checkpoint is
    the older side of some pair, whose Grams `qk_spectra` reuses; the newer
    side's are assembled from the difference blocks, so they are not formed."""
    dtype = options.compute_dtype
    _prefetch(ckpt, plan, selection)
    raw = {name: _read_tensor(ckpt, plan, name, selection) for name in plan.tensors}
    if options.device != "cpu":
        raw = {name: tensor.to(options.device) for name, tensor in raw.items()}
    nonfinite = {}
    for name, tensor in raw.items():
        if tensor.is_floating_point() and not _surely_finite(tensor):
            bad = int((~torch.isfinite(tensor)).sum())
            if bad:
                nonfinite[plan.roles.get(name, name)] = bad
    weights = _build(plan, raw, dtype, selection)
    grams = None
    qk_finite = weights.q is not None and all(r in ROUTER_ROLES for r in nonfinite)
    if qk_finite:
        grams = qk_grams(weights.q, weights.k, dtype) if as_base else None
        if _overflows(weights, grams, dtype) and dtype != torch.float64:
            # Finite weights so large (|w| ≳ 1e17) that their float32 Grams
            # overflow: this layer is computed in float64, which holds the
            # square of any value a float32 or narrower dtype can store.
            dtype = torch.float64
            weights = _build(plan, raw, dtype, selection)
            grams = qk_grams(weights.q, weights.k, dtype) if as_base else None
        if _overflows(weights, grams, dtype):
            name = next(n for n, role in plan.roles.items() if role not in ROUTER_ROLES)
            raise CkptScanError("values too large for float64 arithmetic", path=ckpt.path, tensor=name)
    routing = None
    # A non-finite router weight or bias leaves the routing null (the numeric rule reports it).
    if probe_input is not None and weights.router is not None and not any(r in nonfinite for r in ROUTER_ROLES):
        try:
            routing = routing_stats(probe_input, weights.router, top_k, scoring=weights.router_scoring,
                                    selection_bias=weights.router_bias, compute_dtype=dtype)
        except ValueError as e:
            raise CkptScanError(f"cannot route the probe: {e}", path=ckpt.path, tensor=_router_name(plan)) from None
    stored = {plan.roles.get(name, name): ckpt.tensors.dtype(name) for name in plan.tensors}
    return _LoadedLayer(weights, nonfinite, qk_finite, grams, routing, stored, dtype)


def _surely_finite(tensor: torch.Tensor) -> bool:
    """True when the tensor's sum is finite, which proves every value finite
    (NaN and ±Inf propagate through a sum). One fast reduction instead of
    the exact count's three passes (~10x cheaper on a 7B q_proj); only a
    non-finite (or overflowing) sum pays for the count."""
    if tensor.dtype not in (torch.bfloat16, torch.float16, torch.float32, torch.float64):
        return False
    return bool(torch.isfinite(tensor.sum()))


def _build(plan: LayerPlan, raw: dict[str, torch.Tensor], dtype: torch.dtype,
           selection: _HeadSelection | None) -> LayerWeights:
    weights = plan.build(raw, dtype)
    if selection is not None and weights.q is not None:
        weights.q, weights.k = weights.q[selection.heads], weights.k[selection.kv_heads]
        if weights.rope_q is not None:  # MLA: every head shares the one rope key
            weights.rope_q = weights.rope_q[selection.heads]
    return weights


def _overflows(weights: LayerWeights, grams: QKGrams | None, dtype: torch.dtype) -> bool:
    """Whether Gram entries are within 16x of `dtype`'s range (or past it): the
    ΔQ Grams of a pair can be 4x larger than either checkpoint's.

    Without the Grams, a bound decides first: every entry of a Gram of rows
    of length d is at most d·max|w|² (Cauchy–Schwarz), so weights within it
    need no Gram formed; only weights past it pay for the exact check."""
    limit = torch.finfo(dtype).max / 16
    if grams is None:
        q, k = weights.q, weights.k
        peak = max((max(-float(low), float(high)) for low, high in (torch.aminmax(w) for w in (q, k) if w.numel())),
                   default=0.0)
        if peak * peak * q.shape[-1] <= limit:  # a Python float: peak² cannot overflow here
            return False
        grams = qk_grams(q, k, dtype)
    return not all(bool(g.abs().amax() <= limit) for g in (grams.qq, grams.kk) if g.numel())


def _changed_fractions(a: LayerWeights, b: LayerWeights) -> dict[str, float]:
    """Per role, the fraction of elements that differ between the checkpoints
    (a widening cast keeps distinct stored values distinct)."""
    found = {}
    for role, x, y in (("W_q", a.q, b.q), ("W_k", a.k, b.k), ("router", a.router, b.router)):
        if x is not None and y is not None and x.shape == y.shape and x.numel():
            found[role] = _count_changed(x, y) / x.numel()
    return found


def _count_changed(x: torch.Tensor, y: torch.Tensor, chunk: int = 1 << 18) -> int:
    """Elements with x != y, compared a chunk at a time: a whole-layer boolean
    mask (and count_nonzero's wider temporaries) would be tens of MB of fresh
    pages per layer, page-faulted in on every pair; chunks reuse the same
    small block of memory."""
    x, y = x.reshape(-1), y.reshape(-1)
    return sum(int(torch.count_nonzero(x[i:i + chunk] != y[i:i + chunk])) for i in range(0, x.numel(), chunk))


def _compare(
    layer: int, a: _LoadedLayer, b: _LoadedLayer, options: ScanOptions, selection: _HeadSelection | None = None
) -> LayerResult:
    dtype = torch.promote_types(a.compute_dtype, b.compute_dtype)
    result = LayerResult(layer=layer)
    for role in {**a.nonfinite, **b.nonfinite}:
        result.nonfinite[role] = max(a.nonfinite.get(role, 0), b.nonfinite.get(role, 0))
    wa, wb = a.weights, b.weights
    result.stored_dtype = dict(b.stored_dtype)
    result.changed_fraction = _changed_fractions(wa, wb)
    if a.qk_finite and b.qk_finite:
        heads = selection or _HeadSelection.every(wa.q.shape[0], wa.k.shape[0])
        spectra = _on_cpu(qk_spectra(wa.q, wa.k, wb.q, wb.k, compute_dtype=dtype, grams_a=a.grams,
                                     kv_index=heads.kv_index))
        result.attention = _attention_result(spectra, heads)
        if options.full_spectrum:
            _fill_full_spectrum(result.attention, wa, wb, dtype)
        if wa.rope_q is not None and wb.rope_q is not None:
            _fill_rope(result.attention, wa, wb, dtype)
    if wa.router is not None and wb.router is not None and "router" not in result.nonfinite:
        result.router = _router_result(wa, wb, a.routing, b.routing)
    return result


def _fill_rope(result: AttentionResult, a: LayerWeights, b: LayerWeights, dtype: torch.dtype) -> None:
    """MLA's decoupled rope part: each query head's rope rows against the one
    key shared by all heads, monitored as its own one-KV-head QK term (the
    content heads cannot carry it: the rope key is not per head)."""
    spectra = _on_cpu(qk_spectra(a.rope_q, a.rope_k, b.rope_q, b.rope_k, compute_dtype=dtype))
    d2, dwq, dwk = spectral_stats(spectra.delta2), spectral_stats(spectra.dwq), spectral_stats(spectra.dwk)
    result.rope_delta2_entropy = _mean(d2.entropy, d2.unchanged)
    result.rope_delta2_entropy_norm = _mean(d2.normalized_entropy, d2.unchanged)
    result.rope_dwq_entropy = _mean(dwq.entropy, dwq.unchanged)
    result.rope_dwk_entropy = _mean(dwk.entropy, dwk.unchanged)
    result.rope_qk_logit_bound = float(spectra.qk_logit_bound.max())


def _attention_result(spectra: QKSpectra, selection: _HeadSelection) -> AttentionResult:
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
        _values(d2.entropy, d2.unchanged),
        _values(d3.entropy, d3.unchanged),
        _values(dwq.entropy, dwq.unchanged),
        _values(dwk_per_head.entropy, dwk_per_head.unchanged),
        _values(d1.entropy, d1.unchanged),
        _values(d2.normalized_entropy, d2.unchanged),
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


def _router_result(
    a: LayerWeights, b: LayerWeights, routing_a: RoutingStats | None, routing_b: RoutingStats | None
) -> RouterResult:
    m = router_metrics(a.router, b.router, a.router_bias, b.router_bias)
    unchanged = bool(m.dwr.unchanged)
    result = RouterResult(
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
    if routing_b is not None:
        _fill_routing(result, routing_a, routing_b)
    return result


def _fill_routing(result: RouterResult, a: RoutingStats | None, b: RoutingStats) -> None:
    """Probe routing state at the newer checkpoint and its change from the older."""
    result.routing_entropy = _finite(b.entropy)
    result.routing_entropy_p05 = _finite(b.entropy_p05)
    result.routing_entropy_norm = _finite(b.entropy_norm)
    result.low_entropy_share = b.low_entropy_share
    result.load_cv = _finite(b.load_cv)
    result.dead_experts = b.dead_experts
    result.expert_load = b.load.tolist()
    result.routing_top_k = b.top_k
    if a is not None:
        result.routing_entropy_change = _finite(b.entropy - a.entropy)
        result.routing_entropy_p05_change = _finite(b.entropy_p05 - a.entropy_p05)
        result.low_entropy_share_change = b.low_entropy_share - a.low_entropy_share
        result.load_cv_change = _finite(b.load_cv - a.load_cv)


def _index_stats(stats: SpectralStats, index: torch.Tensor) -> SpectralStats:
    return SpectralStats(*(getattr(stats, f)[index] for f in stats.__dataclass_fields__))


def _values(values: torch.Tensor, unchanged: torch.Tensor) -> list[float | None]:
    return [None if same else value for value, same in zip(values.tolist(), unchanged.tolist())]


def _mean(values: torch.Tensor, unchanged: torch.Tensor) -> float | None:
    kept = values[~unchanged]
    return float(kept.mean()) if kept.numel() else None


def _min(values: torch.Tensor, unchanged: torch.Tensor) -> float | None:
    kept = values[~unchanged]
    return float(kept.min()) if kept.numel() else None


def _finite(value: float) -> float | None:
    return value if value == value and abs(value) != float("inf") else None


def resolve_device(device: str) -> str:
    """The torch device the math runs on: "auto" is "cuda" when torch can use
    a CUDA device and "cpu" otherwise; an explicit "cuda[:N]" must exist."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return device
    kind, colon, index = device.partition(":")
    if kind != "cuda" or (colon and not index.isdigit()):
        raise CkptScanError(f"--device must be 'cpu', 'cuda', 'cuda:N' or 'auto', not {device!r}")
    if not torch.cuda.is_available():
        raise CkptScanError(f"--device {device}: torch {torch.__version__} sees no CUDA device here; "
                            "use --device cpu (or auto, which falls back to the CPU)")
    if index and int(index) >= torch.cuda.device_count():
        raise CkptScanError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) here")
    return device


@dataclass(frozen=True)
class _HeadSelection:
    """Which query heads are scanned (model numbering, ascending), their KV
    heads (distinct, ascending), and for each selected query head the
    position of its KV head among `kv_heads`."""

    heads: torch.Tensor  # [H']
    kv_heads: torch.Tensor  # [G']
    kv_index: torch.Tensor  # [H'] into kv_heads
    head_dim: int = 0
    num_heads: int = 0
    num_kv_heads: int = 0

    @staticmethod
    def every(num_heads: int, num_kv_heads: int) -> _HeadSelection:
        kv = kv_head_index(num_heads, num_kv_heads)
        return _HeadSelection(torch.arange(num_heads), torch.arange(num_kv_heads), kv)

    def row_runs(self, role: str | None, shape: tuple[int, ...]) -> list[tuple[int, int]] | None:
        """Row ranges [lo, hi) of W_q or W_k holding the selected heads, or
        None (read the whole tensor) for other roles or any tensor that is not
        the plain [n·r, d] head-block layout `head_blocks` splits."""
        blocks, count = {"W_q": (self.heads, self.num_heads), "W_k": (self.kv_heads, self.num_kv_heads)}.get(
            role or "", (None, 0))
        if blocks is None or len(shape) != 2 or shape[0] != count * self.head_dim:
            return None
        runs: list[tuple[int, int]] = []
        for block in blocks.tolist():
            lo, hi = block * self.head_dim, (block + 1) * self.head_dim
            if runs and runs[-1][1] == lo:
                runs[-1] = (runs[-1][0], hi)
            else:
                runs.append((lo, hi))
        return runs


def _head_selection(info: ModelInfo, heads: Sequence[int] | None, path: Path) -> _HeadSelection | None:
    if heads is None:
        return None
    wanted = sorted(set(heads))
    if not wanted:
        raise CkptScanError("--heads selects no head", path=path)
    missing = [h for h in wanted if not 0 <= h < info.num_heads]
    if missing:
        raise CkptScanError(f"no head(s) {missing}; the model has query heads 0..{info.num_heads - 1}", path=path)
    kv_of_head = kv_head_index(info.num_heads, info.num_kv_heads)[wanted]
    kv_heads, kv_index = torch.unique(kv_of_head, sorted=True, return_inverse=True)
    return _HeadSelection(torch.tensor(wanted), kv_heads, kv_index, info.head_dim, info.num_heads, info.num_kv_heads)


def _prefetch(ckpt: Checkpoint, plan: LayerPlan, selection: _HeadSelection | None) -> Callable[[], None] | None:
    """A source in object storage gets every byte range of this layer at once
    (fetched concurrently, adjacent ranges coalesced) instead of one request
    after another; `_read_tensor` then takes them, waiting for those still in
    flight. Returns the source's function abandoning them (see `ReadAhead`).
    Local sources fetch nothing here and read as before."""
    prefetch = getattr(ckpt.tensors, "prefetch", None)
    if prefetch is None:
        return None
    wanted: list[tuple[str, tuple[int, int] | None]] = []
    for name in plan.tensors:
        runs = selection.row_runs(plan.roles.get(name), ckpt.tensors.shape(name)) if selection is not None else None
        wanted.extend([(name, None)] if runs is None else [(name, run) for run in runs])
    return prefetch(wanted)


def _read_tensor(ckpt: Checkpoint, plan: LayerPlan, name: str, selection: _HeadSelection | None) -> torch.Tensor:
    """One monitored tensor. With a head selection only the selected heads'
    rows of W_q/W_k are read, into an otherwise zero tensor of the full shape
    so that the layout's `build` sees the shape it checks; the zero rows
    belong to heads dropped right after `build`, never seen by the math."""
    shape = ckpt.tensors.shape(name)
    runs = selection.row_runs(plan.roles.get(name), shape) if selection is not None else None
    if runs is None:
        return ckpt.tensors.get(name)
    full = None
    for lo, hi in runs:
        part = ckpt.tensors.get(name, rows=(lo, hi))
        full = part.new_zeros(shape) if full is None else full
        full[lo:hi] = part
    return full


def _on_cpu(spectra: QKSpectra) -> QKSpectra:
    """The small per-head spectra on the CPU, moved once per pair (a no-op on
    the CPU path): the report is made of Python floats."""
    moved = {f.name: getattr(spectra, f.name).cpu() for f in fields(spectra)
             if isinstance(getattr(spectra, f.name), torch.Tensor)}
    return replace(spectra, **moved)


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
    return _finite(float(stats.entropy)), _finite(float(stats.normalized_entropy))


def _router_name(plan: LayerPlan) -> str | None:
    return next((name for name, role in plan.roles.items() if role == "router"), None)


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
    diffs = "; ".join(
        f"{f}: {getattr(layout_a.info, f)} vs {getattr(layout_b.info, f)}"
        for f in layout_a.info.__dataclass_fields__
        if getattr(layout_a.info, f) != getattr(layout_b.info, f)
    )
    # A differing tensor is named with both shapes, and the model settings
    # that differ with it.
    for plan_a, plan_b in zip(layout_a.layers, layout_b.layers):
        for name_a, name_b in zip(plan_a.tensors, plan_b.tensors):
            shape_a, shape_b = ckpt_a.tensors.shape(name_a), ckpt_b.tensors.shape(name_b)
            if shape_a != shape_b or name_a != name_b:
                raise CkptScanError(
                    f"shape {list(shape_a)} in {ckpt_a.path} but {list(shape_b)} in {ckpt_b.path}"
                    + (f" (different models: {diffs})" if diffs else ""),
                    tensor=name_a,
                )
    if diffs:
        raise CkptScanError(f"checkpoints are of different models ({diffs}): {ckpt_a.path} vs {ckpt_b.path}")
