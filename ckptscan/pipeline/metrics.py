"""compute: a run spec -> metrics. No thresholds, no findings: cacheable.

    metrics = compute(resolve_run("runs/main"), ScanOptions())
    report = judge(metrics, spec.config.thresholds)

Pairs already in the cache are not computed again, and only the checkpoints
that the remaining pairs need are read (each once). Live mode and the Ray
executor call this same function.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Protocol, Sequence

from ckptscan.caches.pair_cache import file_identity
from ckptscan.detection.judge import Metrics
from ckptscan.executors import Executor
from ckptscan.layouts import resolve_layout
from ckptscan.monitors.optimizer_family import FAMILY as OPTIMIZER_FAMILY
from ckptscan.monitors import registry
from ckptscan.readers import Checkpoint
from ckptscan.readers.optimizer_state import unread_reason
from ckptscan.readers.trainer_state import interval_lr
from ckptscan.schema.results import CheckpointRef, LayerResult, PairResult
from ckptscan.pipeline.run import RunSpec
from ckptscan.scan import ScanOptions, scan_layers
from ckptscan.system.collector import collector_paused


class PairStore(Protocol):
    """What `compute` asks of a cache: a `PairCache` on disk, or a watch's
    `SeriesCache` in front of one."""

    def keys(self, checkpoints: Sequence[Checkpoint], pairs: Sequence[tuple[int, int]], settings: dict[str, str]
             ) -> list[dict[str, Any]]: ...
    def get_many(self, keys: list[dict[str, Any]]) -> list[list[LayerResult] | None]: ...
    def put(self, key: dict[str, Any], layers: list[LayerResult]) -> None: ...
    def pack(self, keys: list[dict[str, Any]], layers: list[list[LayerResult]]) -> None: ...
    def identity(self, key: dict[str, Any]) -> str: ...
    def get_layers(self, key: dict[str, Any]) -> dict[int, LayerResult]: ...
    def put_layer(self, key: dict[str, Any], layer: LayerResult) -> None: ...


def compute(
    spec: RunSpec,
    options: ScanOptions | None = None,
    *,
    cache: PairStore | None = None,
    progress: Callable[[int, int], None] | None = None,
    executor: Executor | None = None,
) -> Metrics:
    """Every pair of `spec`, from the cache where it has them.

    `executor` runs the layer tasks (`ckptscan.executors`; default: threads
    here). It only schedules the work: the numbers, and so the cache, are the
    same whichever runs them."""
    options = options or ScanOptions()
    ckpts, pairs = spec.checkpoints, spec.pairs
    settings = pair_settings(options, spec)
    keys = cache.keys(ckpts, pairs, settings) if cache is not None else []
    with collector_paused():  # a long run's thousands of cached pairs
        layers: list[list[LayerResult] | None] = cache.get_many(keys) if cache is not None else [None] * len(pairs)
    cached = [found is not None for found in layers]
    missing = [k for k, found in enumerate(layers) if found is None]
    model = None
    if missing:
        # Read only the checkpoints the missing pairs need, each once.
        needed = sorted({i for k in missing for i in pairs[k]})
        position = {i: p for p, i in enumerate(needed)}
        model, computed = scan_layers([ckpts[i] for i in needed],
                                      [(position[pairs[k][0]], position[pairs[k][1]]) for k in missing],
                                      options, spec.probe, progress, executor=executor,
                                      **_resume([keys[k] for k in missing] if cache is not None else [], cache))
        for k, pair_layers in zip(missing, computed):
            layers[k] = pair_layers
            if cache is not None:
                cache.put(keys[k], pair_layers)
    complete = [found for found in layers if found is not None]
    if cache is not None and len(complete) == len(keys):
        cache.pack(keys, complete)
    if model is None:
        model = resolve_layout(ckpts[0], options.overrides, options.tensor_map).info

    results = [PairResult(ckpts[a].step, ckpts[b].step, _found(found), str(ckpts[a].path), str(ckpts[b].path))
               for (a, b), found in zip(pairs, layers)]
    run_settings: dict[str, Any] = {}
    if spec.kind == "run":
        run_settings = {"run": spec.path, **spec.pairing}
        if spec.run_notes:  # e.g. accelerate's checkpoint_K: the steps shown are save indices
            run_settings["run_notes"] = list(spec.run_notes)
    if spec.loss_log is not None:
        for pair in results:
            spec.loss_log.annotate(pair)
        run_settings.update(loss_log=str(spec.loss_log.path), lr_warmup_end_step=spec.loss_log.warmup_end())
    for (a, b), pair in zip(pairs, results):
        stated_lr(pair, ckpts[a], ckpts[b])
        registry.fill(pair)
    if results and not any(OPTIMIZER_FAMILY in layer.families for pair in results for layer in pair.layers):
        # Said once for the report, not per pair: its optimizer family is not judged.
        run_settings["optimizer_state"] = unread_reason(ckpts[pairs[-1][1]])
    return Metrics(
        kind=spec.kind,
        model=model,
        checkpoints=[CheckpointRef(str(c.path), c.step) for c in ckpts],
        pairs=results,
        skipped=list(spec.skipped),
        settings=run_settings,
        probe=str(spec.probe.path) if spec.probe is not None else None,
        loss_log=spec.loss_log,
        cached=cached,
        pair_keys=[cache.identity(k) for k in keys] if cache is not None else [],
    )


def _found(layers: list[LayerResult] | None) -> list[LayerResult]:
    """A pair's layers, from the cache or computed: every pair has them by now."""
    assert layers is not None, "a pair was neither in the cache nor computed"
    return layers


def _resume(keys: list[dict[str, Any]], cache: PairStore | None) -> dict[str, Any]:
    """scan_layers' `known` and `on_layer` for the pairs of `keys`: layers an
    interrupted run finished for every one of them are not computed again,
    and each layer is cached as it arrives.

    Why by layer, not by pair: a task walks one group of layers through every
    checkpoint, so a pair is complete only when the last group finishes, at
    the very end of the run; per-layer entries are what an interrupted run
    has to show for its work."""
    if cache is None:
        return {}
    partial = [cache.get_layers(key) for key in keys]
    common = set.intersection(*(set(found) for found in partial))
    known = {layer: [found[layer] for found in partial] for layer in common}

    def arrived(layer: int, results: list[LayerResult]) -> None:
        for key, result in zip(keys, results):
            cache.put_layer(key, result)

    return {"known": known, "on_layer": arrived}


def pair_settings(options: ScanOptions, spec: RunSpec) -> dict[str, str]:
    """What besides the two checkpoints decides a pair's numbers: the options'
    cache key and the probe file's identity."""
    probe = spec.probe
    return {**options.cache_key(),
            "probe": "null" if probe is None else json.dumps(file_identity(probe.path), sort_keys=True)}


def stated_lr(pair: PairResult, older: Checkpoint, newer: Checkpoint) -> None:
    """The pair's learning rate where the loss log left it unknown, from
    the checkpoints: the newer one's logged history (a Hugging Face
    trainer_state.json: the rates of the very updates between the two),
    else the older one's saved scheduler state (Megatron's: the rate at the
    interval's start). The loss log wins over both: it is what the user
    named for this run, and it logs every step."""
    if pair.lr is not None:
        return
    history = newer.meta.get("lr_history")
    if history:
        pair.lr = interval_lr(history, pair.from_step, pair.to_step)
    stated = older.meta.get("lr")
    if pair.lr is None and isinstance(stated, (int, float)) and not isinstance(stated, bool):
        pair.lr = float(stated)
