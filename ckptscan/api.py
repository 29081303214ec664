"""The one-call API: resolve + compute + judge, exactly what the CLI does.

    report = ckptscan.scan_pair("run/checkpoint-1000", "run/checkpoint-1100")
    report = ckptscan.scan_run("run/")   # the run's probe, loss log and config, as `ckptscan trend`

The steps are public too, for callers that cache, schedule or judge on their
own (`ckptscan trend`, live mode, the Ray executor):

    spec = ckptscan.resolve_run("run/", stride=2)
    metrics = ckptscan.compute(spec, ckptscan.ScanOptions(heads=[0, 1]))
    report = ckptscan.judge(metrics, spec.config.thresholds, spec.reference, reference_path=spec.reference_path)

A reference may be another run (`reference=["runs/seed1", "runs/seed2"]`):
it is scanned with the judged run's options, cache and pairing
(`reference_scanner`), once per process, and judged against as its JSON
report would be.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from ckptscan.cache import PairCache
from ckptscan.judge_cache import JudgeCache
from ckptscan.metrics import compute
from ckptscan.detection.judge import SeriesJudge
from ckptscan.detection.rules import Thresholds
from ckptscan.executors import Executor
from ckptscan.results import ScanReport
from ckptscan.report.json import report_dict
from ckptscan.report.load import as_json_values, report_from_dict
from ckptscan.run import AUTO, RunSpec, ScanReference, SideFile, resolve_pair, resolve_run
from ckptscan.scan import ScanOptions


def scan_pair(older: str | Path, newer: str | Path, options: ScanOptions | None = None, *,
              thresholds: Thresholds | None = None, **resolve: object) -> ScanReport:
    """Compare two checkpoints (older, newer) layer by layer, judged.

    `resolve`: `resolve_pair`'s side files (probe, loss_log, reference, config, settings).
    `thresholds` replaces the config's."""
    resolve.setdefault("scan_reference", reference_scanner(options, config=resolve.get("config", AUTO),
                                                           settings=resolve.get("settings", ())))
    return scan(resolve_pair(older, newer, **resolve), options, thresholds=thresholds)


def scan_run(run_dir: str | Path, options: ScanOptions | None = None, *, thresholds: Thresholds | None = None,
             cache: PairCache | None = None, progress: Callable[[int, int], None] | None = None,
             executor: Executor | None = None, **resolve: object) -> ScanReport:
    """Scan a run directory's checkpoints pair by pair and judge the series.

    `resolve`: `resolve_run`'s arguments (stride, base, probe, loss_log,
    reference, config, settings). `thresholds` replaces the config's.
    `executor`: where the layer tasks run (`ckptscan.executors`; default:
    threads here, e.g. `RayExecutor("auto")` for a Ray cluster)."""
    resolve.setdefault("scan_reference", reference_scanner(
        options, cache=cache, executor=executor, stride=resolve.get("stride", 1),
        base=resolve.get("base", "previous"), config=resolve.get("config", AUTO), settings=resolve.get("settings", ())))
    if cache is not None:
        resolve.setdefault("cache_dir", cache.directory)
    return scan(resolve_run(run_dir, **resolve), options, thresholds=thresholds, cache=cache, progress=progress,
                executor=executor)


def scan(spec: RunSpec, options: ScanOptions | None = None, *, thresholds: Thresholds | None = None,
         cache: PairCache | None = None, progress: Callable[[int, int], None] | None = None,
         executor: Executor | None = None) -> ScanReport:
    """compute + judge of a resolved spec. With a `cache`, judged pairs and the
    judge state are kept beside the metrics (`JudgeCache`): a re-run after one
    new checkpoint computes one pair and judges one pair."""
    metrics = compute(spec, options, cache=cache, progress=progress, executor=executor)
    judging = SeriesJudge(thresholds or spec.config.thresholds, spec.reference, spec.reference_path)
    if cache is not None:
        return JudgeCache(cache.directory).report(judging, metrics)
    return judging.report(metrics)


def reference_scanner(options: ScanOptions | None = None, *, cache: PairCache | None = None,
                      executor: Executor | None = None, stride: int = 1, base: str = "previous",
                      config: SideFile = AUTO, settings: Sequence[str] = ()) -> ScanReference:
    """How a reference given as a run is scanned: as the judged run is (its
    options, cache, executor, pairing and thresholds; the reference's own
    probe and loss log), each run once however often it is asked for (a
    watch resolves its references at every look). The report is the one its
    JSON file would hold (a JSON round trip: NaN is None there), so a run and
    its `trend --json` report judge alike."""
    scanned: dict[str, ScanReport] = {}

    def scan_reference(run_dir: str) -> ScanReport:
        if run_dir not in scanned:
            report = scan_run(run_dir, options, cache=cache, executor=executor, stride=stride, base=base,
                              config=config, settings=settings, scan_reference=None)
            scanned[run_dir] = report_from_dict(as_json_values(report_dict(report)), run_dir)
        return scanned[run_dir]
    return scan_reference
