"""The scan's tasks: `scan_layers` checks the checkpoints, cuts the layers
into tasks for an executor and gathers their results; a `LayerTask` computes
one layer of every pair, visiting the checkpoints in step order."""

from __future__ import annotations

import math
import threading
from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from ckptscan.errors import CkptScanError
from ckptscan.layouts import LayerPlan, ModelInfo, ModelLayout, resolve_layout
from ckptscan.inputs.probe import Probe
from ckptscan.monitors.optimizer_family import FAMILY as OPTIMIZER_FAMILY
from ckptscan.storage.readahead import ReadAhead
from ckptscan.readers import Checkpoint
from ckptscan.schema.results import LayerResult
from ckptscan.scan.comparing import Compared, compare, finish
from ckptscan.scan.loading import LoadedLayer, load_layer
from ckptscan.scan.optimizer_state import optimizer_values
from ckptscan.scan.options import DEFAULT_TOP_K, ScanOptions
from ckptscan.scan.reading import prefetch, resolve_device
from ckptscan.scan.selection import check_compatible, layer_plan, router_name, select_heads, select_layers
from ckptscan.storage import RemotePath

if TYPE_CHECKING:
    from ckptscan.executors import Executor

# Gram blocks waiting for their batched solve (`LayerTask.__call__`), at most.
# The solve runs on the host in float64 whatever the device, and its working
# memory is up to about SOLVE_FACTOR times its blocks (measured: 47 MB above
# the 3.4 MB of one 1B layer's blocks; 34x before the solve let its assembled
# blocks go early). With a GPU the batch is the point (each batch is one
# transfer and one readback): 16 MiB, ~4 pair-layers of a 1B model, ~0.25 GB
# of host memory a worker while it solves. On a CPU a batch saves only Python
# and small ops, and two workers' solves must fit a 2-core machine's memory:
# 2 MiB, one pair-layer of a 1B model at a time, several of a smaller one.
SOLVE_FACTOR = 16
PENDING_BYTES = 16 << 20
CPU_PENDING_BYTES = 2 << 20


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
        check_compatible(checkpoints[0], layouts[0], ckpt, layout)
    plans = select_layers(layouts[0], options.layers, checkpoints[0].path)
    if probe is not None:
        routers = {p.layer: (name, checkpoints[0].tensors.shape(name)) for p in plans if (name := router_name(p))}
        probe.check_routers(routers, layouts[0].info.hidden_size, checkpoints[0].path)
    task = LayerTask(checkpoints, pairs, options, probe, layouts)
    found = {layer: list(results) for layer, results in (known or {}).items() if len(results) == len(pairs)}
    todo = [p.layer for p in plans if p.layer not in found]
    if executor is None:
        from ckptscan.executors.local import LocalExecutor

        executor = LocalExecutor(options.workers, options.threads, layer_bytes=task_bytes(checkpoints[0], plans))
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


def task_bytes(checkpoint: Checkpoint, plans: Sequence[LayerPlan]) -> int:
    """About what one running task holds at most, from the tensors' shapes
    (headers only): its largest layer of two checkpoints at 4 bytes a value
    (float32 copies), twice over for the differences and their products, and
    the working memory of its batched solve (at most SOLVE_FACTOR times the
    largest batch of Gram blocks, a GPU's). The plan keeps the running tasks' sum within a
    share of the machine's memory (`plan_threads`)."""
    def elements(plan: LayerPlan) -> int:
        return sum(math.prod(checkpoint.tensors.shape(name)) for name in plan.tensors)

    largest = max((elements(plan) for plan in plans), default=0)
    return 2 * 2 * 4 * largest + SOLVE_FACTOR * PENDING_BYTES


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
        self.selection = select_heads(self.layouts[0].info, options.heads, self.checkpoints[0].path)
        self.used = sorted({i for pair in self.pairs for i in pair})
        self.last_use = {i: max(b for a, b in self.pairs if i in (a, b)) for i in self.used}
        # Checkpoints more than one pair reads: their LM head is kept as it is read, not re-read.
        self.reread = {i for i in self.used if sum(i in pair for pair in self.pairs) > 1}
        self.bases = {a for a, _ in self.pairs}  # checkpoints whose Grams a pair reuses
        self.readahead: ReadAhead | None = None  # set by `scan_layers` for remote checkpoints

    def open(self) -> LayerTask:
        """The task itself: its checkpoints are open (a shipped task opens them where it runs)."""
        return self

    def __reduce__(self) -> tuple:
        return (_Located, ([str(c.path) for c in self.checkpoints], self.pairs, self.requested,
                           None if self.probe is None else str(self.probe.path)))

    def __call__(self, layers: Sequence[int], stop: threading.Event) -> list[list[LayerResult]]:
        """The layers' results, [layer][pair]. Each layer's device work is done
        as it is read; the small attention solves of the layers and pairs wait
        and are done together, in batches of about `PENDING_BYTES` of Gram
        blocks (`CPU_PENDING_BYTES` on a CPU): one batched solve and one
        readback per batch, not per layer."""
        limit = CPU_PENDING_BYTES if self.options.device == "cpu" else PENDING_BYTES
        done: list[list[Compared]] = []
        waiting: list[Compared] = []
        for layer in layers:
            compared = self.layer(layer, stop)
            if not compared:  # stopped
                return []
            done.append(compared)
            waiting.extend(compared)
            if sum(c.pending_bytes for c in waiting) >= limit:
                finish(waiting)
                waiting = []
        finish(waiting)
        return [[c.result for c in compared] for compared in done]

    def describe(self, layers: Sequence[int]) -> str:
        """The task's work in words, for an error that can only name the task."""
        first, last = self.checkpoints[self.used[0]], self.checkpoints[self.used[-1]]
        return _describe(layers, first.path, last.path, len(self.used))

    def locations(self) -> list[str]:
        """Where the checkpoints this task reads are, in step order."""
        return [str(self.checkpoints[i].path) for i in self.used]

    def layer(self, layer: int, stop: threading.Event) -> list[Compared]:
        """This layer of every pair, compared, its attention still to solve
        ([] once `stop` is set: the consumer has gone)."""
        options, pairs = self.options, self.pairs
        held: dict[int, LoadedLayer] = {}
        compared: list[Compared | None] = [None] * len(pairs)
        plan = layer_plan(self.layouts[0], layer)
        # The probe's inputs for this layer are read once and routed by every checkpoint.
        probe_input = self.probe.router_input(layer) if self.probe is not None and router_name(plan) else None
        if probe_input is not None:
            probe_input = probe_input.to(options.device)
        for i in self.used:
            if stop.is_set():  # the consumer has gone (error elsewhere, Ctrl-C)
                return []
            layout = self.layouts[i]
            plan_i = layer_plan(layout, layer)
            if self.readahead is not None:
                self.readahead.reach(layer, i)
            held[i] = load_layer(self.checkpoints[i], plan_i, options, probe_input, self.top_k, self.selection,
                                  as_base=i in self.bases, keep_head=i in self.reread)
            optimizer = optimizer_values(self.checkpoints[i], plan_i) if any(b == i for _, b in pairs) else None
            for k, (a, b) in enumerate(pairs):
                if b == i:
                    pair = compare(layer, held[a], held[b], options, self.selection)
                    if optimizer is not None:  # the newer checkpoint's optimizer state
                        pair.result.families[OPTIMIZER_FAMILY] = dict(optimizer)
                    compared[k] = pair
            held = {j: loaded for j, loaded in held.items() if self.last_use[j] > i}
        return [c for c in compared if c is not None]

    def prefetch_load(self, layer: int, i: int) -> Callable[[], None] | None:
        """Start fetching checkpoint i's `layer` (a `ReadAhead` starter)."""
        layout = self.layouts[i]
        return prefetch(self.checkpoints[i], layer_plan(layout, layer), self.selection)


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

    def open(self) -> LayerTask:
        """The task, its checkpoints opened where it runs (once)."""
        if self.task is None:
            from ckptscan.inputs.probe import load_probe
            from ckptscan.readers import open_checkpoint

            locations, pairs, options, probe = self.args
            self.task = LayerTask([open_checkpoint(location) for location in locations], pairs, options,
                                  None if probe is None else load_probe(probe))
        return self.task

    def __call__(self, layers: Sequence[int], stop: threading.Event) -> list[list[LayerResult]]:
        return self.open()(layers, stop)

    def describe(self, layers: Sequence[int]) -> str:
        locations, pairs, _, _ = self.args
        used = sorted({i for pair in pairs for i in pair})
        return _describe(layers, locations[used[0]], locations[used[-1]], len(used))

    def locations(self) -> list[str]:
        locations, pairs, _, _ = self.args
        return [locations[i] for i in sorted({i for pair in pairs for i in pair})]


def _describe(layers: Sequence[int], first: object, last: object, count: int) -> str:
    span = f"layer {layers[0]}" if len(layers) == 1 else f"layers {layers[0]}-{layers[-1]}"
    return f"{span} of the {count} checkpoints {first} … {last}"
