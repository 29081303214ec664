"""The one-call API: resolve + compute + judge, exactly what the CLI does.

    report = ckptscan.scan_pair("run/checkpoint-1000", "run/checkpoint-1100")
    report = ckptscan.scan_run("run/")   # the run's probe, loss log and config, as `ckptscan trend`

The keyword arguments of both are a `ScanRequest`'s fields (stride, base,
probe, loss_log, reference, config, settings, thresholds, cache, executor);
the steps are public too, for callers that cache, schedule or judge on their
own (`ckptscan trend`, live mode, the Ray executor):

    request = resolve_references(ScanRequest(ScanOptions(heads=[0, 1]), stride=2))
    spec = ckptscan.resolve_run("run/", request)
    report = scan(spec, request)          # compute, then judge

A reference may be another run (`reference=["runs/seed1", "runs/seed2"]`):
`resolve_references` scans it up front with the judged run's options,
cache and pairing, and it is judged against as its JSON report would be.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from ckptscan.detection.judge import SeriesJudge
from ckptscan.caches.judge_cache import JudgeCache
from ckptscan.pipeline.metrics import compute
from ckptscan.document.reading import load_report
from ckptscan.detection.reference import ReferenceRun
from ckptscan.pipeline.request import AUTO, ReferenceSource, ScanRequest
from ckptscan.schema.results import ScanReport
from ckptscan.pipeline.run import RunSpec, resolve_pair, resolve_run
from ckptscan.scan import ScanOptions
from ckptscan.storage import as_path

Progress = Callable[[int, int], None]  # (layer tasks done, in all)


def scan_pair(older: str | Path, newer: str | Path, options: ScanOptions | None = None, **fields: Any) -> ScanReport:
    """Compare two checkpoints (older, newer) layer by layer, judged.

    `fields`: the request's (probe, loss_log, reference, config, settings;
    `thresholds` replaces the config's)."""
    request = resolve_references(ScanRequest.of(options, **fields))
    return scan(resolve_pair(older, newer, request), request)


def scan_run(run_dir: str | Path, options: ScanOptions | None = None, *, progress: Progress | None = None,
             **fields: Any) -> ScanReport:
    """Scan a run directory's checkpoints pair by pair and judge the series.

    `fields`: the request's (stride, base, probe, loss_log, reference,
    config, settings; `thresholds` replaces the config's; `cache`, a
    `PairCache`; `executor`, where the layer tasks run: `ckptscan.executors`,
    default threads here, e.g. `RayExecutor("auto")` for a Ray cluster)."""
    request = resolve_references(ScanRequest.of(options, **fields))
    return scan(resolve_run(run_dir, request), request, progress=progress)


def scan(spec: RunSpec, request: ScanRequest | ScanOptions | None = None, *, progress: Progress | None = None,
         **fields: Any) -> ScanReport:
    """compute + judge of a resolved spec: `request`, or the options and the
    request's fields as keywords (thresholds, cache, executor). With a
    `cache`, judged pairs and the judge state are kept beside the metrics
    (`JudgeCache`): a re-run after one new checkpoint computes one pair and
    judges one pair."""
    request = ScanRequest.given(request, fields)
    cache = request.cache
    metrics = compute(spec, request.options, cache=cache, progress=progress, executor=request.executor)
    judging = SeriesJudge(request.thresholds or spec.config.thresholds, spec.references)
    if cache is not None:
        return JudgeCache(cache.directory).report(judging, metrics)
    return judging.report(metrics)


def resolve_references(request: ScanRequest) -> ScanRequest:
    """The request with each reference resolved, once, before the judged
    run's spec is made, each to a `ReferenceRun`: a JSON report file (local
    or a URL) read, a run directory (or a URL prefix) scanned as the judged
    run is (its options, cache, executor, pairing, config and settings; the
    reference's own probe and loss log; not `thresholds`, which replace the
    judged run's alone), each run once however often it is named; a report
    object taken as it is, from no file."""
    scanned: dict[str, ReferenceRun] = {}
    references = request.references
    as_run = replace(request, probe=AUTO, loss_log=AUTO, references=(), thresholds=None)

    def resolved(source: ReferenceSource | ReferenceRun) -> ReferenceRun:
        if isinstance(source, ReferenceRun):
            return source
        if isinstance(source, ScanReport):
            return ReferenceRun(source, None)
        path = as_path(source)
        if not path.is_dir():
            return ReferenceRun(load_report(path), str(path))
        if str(path) not in scanned:
            scanned[str(path)] = ReferenceRun(scan(resolve_run(path, as_run), as_run), str(path))
        return scanned[str(path)]
    return replace(request, references=tuple(resolved(source) for source in references))


def reference_scanner(options: ScanOptions | None = None, **fields: Any) -> Callable[[str], ScanReport]:
    """Deprecated: how a reference run was scanned, given to `resolve_run` as
    `scan_reference`. The references of a request are resolved up front now
    (`resolve_references`)."""
    warnings.warn("reference_scanner is deprecated: resolve the references first "
                  "(ckptscan.pipeline.api.resolve_references)",
                  DeprecationWarning, stacklevel=2)
    request = ScanRequest.of(options, **fields)

    def scan_reference(run_dir: str) -> ScanReport:
        reference = resolve_references(replace(request, references=(run_dir,))).references[0]
        assert isinstance(reference, ReferenceRun)  # every source resolves to one
        return reference.report
    return scan_reference
