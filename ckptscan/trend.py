"""A whole training run as a series of checkpoint pairs, judged over time.

    from ckptscan.trend import TrendOptions, scan_run
    report = scan_run("runs/main", trend=TrendOptions(loss_log="runs/main/train_log.jsonl"))
    report.summary.first_alert_step   # {"attention": 1700, "router": None, "numeric": None}

Pairs: every consecutive pair of checkpoints; with `stride` s, the chain of
every s-th checkpoint from the first (a stable chain, so a growing run keeps
its cached pairs); with `base="first"`, every s-th checkpoint against the
first. Pairs already in the cache are not computed again, and only the
checkpoints that the remaining pairs need are read.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from ckptscan.cache import PairCache
from ckptscan.detection.reference import load_reference
from ckptscan.detection.rules import assess_report
from ckptscan.discovery import discover_run
from ckptscan.errors import CkptScanError
from ckptscan.layouts import resolve_layout
from ckptscan.loss_log import divergence_step, read_loss_log
from ckptscan.results import CheckpointRef, LayerResult, PairResult, ScanReport, Summary
from ckptscan.scan import ScanOptions, scan_checkpoints

BASES = ("previous", "first")


@dataclass(frozen=True)
class TrendOptions:
    stride: int = 1
    base: str = "previous"  # "previous": each checkpoint against the one before; "first": against the first
    loss_log: str | Path | None = None
    reference: str | Path | None = None  # JSON report of a known-healthy run


def plan_pairs(count: int, stride: int = 1, base: str = "previous") -> list[tuple[int, int]]:
    """(older, newer) checkpoint index pairs of a run of `count` checkpoints."""
    if stride < 1:
        raise CkptScanError(f"--stride must be ≥ 1, not {stride}")
    if base not in BASES:
        raise CkptScanError(f"--base must be one of {list(BASES)}, not {base!r}")
    chain = list(range(0, count, stride))
    if base == "first":
        return [(0, j) for j in chain[1:]]
    return list(zip(chain, chain[1:]))


def scan_run(
    run_dir: str | Path,
    options: ScanOptions | None = None,
    trend: TrendOptions | None = None,
    cache: PairCache | None = None,
) -> ScanReport:
    """Scan a run directory's checkpoints pair by pair and judge the series."""
    options = options or ScanOptions()
    trend = trend or TrendOptions()
    run = discover_run(run_dir)
    ckpts = run.checkpoints
    if len(ckpts) < 2:
        raise CkptScanError(f"found {len(ckpts)} usable checkpoint(s); a trend needs at least two", path=run_dir)
    pairs = plan_pairs(len(ckpts), trend.stride, trend.base)
    if not pairs:
        raise CkptScanError(f"--stride {trend.stride} leaves no pair among {len(ckpts)} checkpoints", path=run_dir)

    keys = [cache.key(ckpts[a], ckpts[b]) for a, b in pairs] if cache is not None else [None] * len(pairs)
    metrics: list[list[LayerResult] | None] = [cache.get(k) if cache is not None else None for k in keys]
    missing = [k for k, m in enumerate(metrics) if m is None]
    model = None
    if missing:
        # Read only the checkpoints the missing pairs need, each once.
        needed = sorted({i for k in missing for i in pairs[k]})
        position = {i: p for p, i in enumerate(needed)}
        scanned = scan_checkpoints("trend", [ckpts[i] for i in needed], options,
                                   [(position[pairs[k][0]], position[pairs[k][1]]) for k in missing])
        model = scanned.model
        for k, pair in zip(missing, scanned.pairs):
            # Findings and statuses are detection's, redone below for every pair:
            # a fresh pair carries only metrics, as a cached one does.
            metrics[k] = [_metrics_only(layer) for layer in pair.layers]
            if cache is not None:
                cache.put(keys[k], metrics[k])
    if model is None:
        model = resolve_layout(ckpts[0], options.overrides, options.tensor_map).info

    report = ScanReport(
        command="trend",
        model=model,
        checkpoints=[CheckpointRef(str(c.path), c.step) for c in ckpts],
        pairs=[PairResult(ckpts[a].step, ckpts[b].step, layers, str(ckpts[a].path), str(ckpts[b].path))
               for (a, b), layers in zip(pairs, metrics)],
        summary=Summary(status="ok", flagged_layers=[], first_alert_step={}),
        skipped=run.skipped,
        probe=str(options.probe.path) if options.probe is not None else None,
    )
    newest = max(b for _, b in pairs)
    report.settings = {
        "run": str(run.path),
        "pairing": trend.base,
        "stride": trend.stride,
        # Checkpoints newer than the newest scanned one: they wait for the stride.
        "pending_steps": [c.step for c in ckpts[newest + 1:]],
    }
    if run.notes:  # e.g. accelerate's checkpoint_K: steps shown are save indices
        report.settings["run_notes"] = run.notes

    thresholds = options.thresholds
    divergence = None
    if trend.loss_log is not None:
        log = read_loss_log(trend.loss_log)
        for pair in report.pairs:
            pair.loss = log.pair_loss(pair.from_step, pair.to_step)
        divergence = divergence_step(log, thresholds.loss_window, thresholds.loss_margin)
        lr_warmup = log.warmup_end()
        # Judging starts after the learning-rate warm-up at the earliest.
        if lr_warmup is not None and lr_warmup > thresholds.warmup_steps:
            thresholds = dataclasses.replace(thresholds, warmup_steps=lr_warmup)
        report.settings.update(loss_log=str(log.path), lr_warmup_end_step=lr_warmup)
    reference = None
    if trend.reference is not None:
        reference = load_reference(trend.reference, thresholds.warmup_pairs, thresholds.warmup_steps)
        reference.check_model(model)
    assess_report(report, thresholds, reference, divergence)
    return report


def _metrics_only(layer: LayerResult) -> LayerResult:
    return dataclasses.replace(layer, findings=[], status="ok")
