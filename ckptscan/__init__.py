"""ckptscan: catch LLM training instability in saved checkpoints.

    import ckptscan
    report = ckptscan.scan_pair("run/checkpoint-1000", "run/checkpoint-1100")
    report.summary.status            # "ok" | "warn" | "alert" | "unchanged" | "not_judged"
    run = ckptscan.scan_run("run/")  # every consecutive pair, judged as a series

Each entry point takes the options and a `ScanRequest`'s fields as keywords
(stride, probe, reference, thresholds, cache, executor, ...) and returns a
report (docs/python-api.md). The steps inside them (resolve, compute, judge)
are importable from their modules: `ckptscan.pipeline.run`, `ckptscan.pipeline.metrics`,
`ckptscan.detection.judge`.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

__version__ = "0.2.0"

# The public face, imported on first use: `import ckptscan` itself stays
# cheap (torch takes seconds to import), so the console entry point can turn
# a Ctrl-C during start-up into a clean exit instead of a traceback.
_EXPORTS = {
    # Entry points: a pair, a run, a live run, a sweep, a saved report (read and written).
    "scan_pair": "ckptscan.pipeline.api",
    "scan_run": "ckptscan.pipeline.api",
    "watch_run": "ckptscan.pipeline.watch",
    "compare_runs": "ckptscan.pipeline.sweep",
    "load_report": "ckptscan.document.reading",
    "write_json": "ckptscan.document.writing",
    "capture_probe": "ckptscan.inputs.probe",
    "load_probe": "ckptscan.inputs.probe",
    # What a scan is asked: the request, its options and thresholds, and the
    # values its fields take (a probe, a cache, a Ray cluster).
    "ScanRequest": "ckptscan.pipeline.request",
    "ScanOptions": "ckptscan.scan",
    "Thresholds": "ckptscan.detection.rules",
    "Probe": "ckptscan.inputs.probe",
    "PairCache": "ckptscan.caches.pair_cache",
    "RayExecutor": "ckptscan.executors.ray",
    # What a scan returns, and the one error it raises on bad input.
    "ScanReport": "ckptscan.schema.results",
    "PairResult": "ckptscan.schema.results",
    "LayerResult": "ckptscan.schema.results",
    "Finding": "ckptscan.schema.results",
    "Summary": "ckptscan.schema.results",
    "SweepReport": "ckptscan.schema.results",
    "WatchEvent": "ckptscan.pipeline.watch",
    "CkptScanError": "ckptscan.errors",
}

# Names the face used to offer that are the pipeline's insides: still
# importable from `ckptscan` (with a DeprecationWarning) and, without one,
# from the module named.
_DEPRECATED = {
    "AUTO": "ckptscan.pipeline.request",
    "RunSpec": "ckptscan.pipeline.run",
    "resolve_run": "ckptscan.pipeline.run",
    "resolve_pair": "ckptscan.pipeline.run",
    "run_spec": "ckptscan.pipeline.run",
    "Metrics": "ckptscan.pipeline.metrics",
    "compute": "ckptscan.pipeline.metrics",
    "judge": "ckptscan.detection.judge",
    "LocalExecutor": "ckptscan.executors.local",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    if name in _DEPRECATED:
        warnings.warn(f"ckptscan.{name} is deprecated: import it from {_DEPRECATED[name]}, or use "
                      "ckptscan.scan_run / ckptscan.scan_pair", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(_DEPRECATED[name]), name)
    raise AttributeError(f"module 'ckptscan' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
