"""ckptscan: catch LLM training instability in saved checkpoints.

    import ckptscan
    report = ckptscan.scan_pair("run/checkpoint-1000", "run/checkpoint-1100")
    report.summary.status            # "ok" | "warn" | "alert" | "unchanged"
    run = ckptscan.scan_run("run/")  # every consecutive pair, judged as a series

    # The same in its three steps: what to scan, the numbers, the verdict.
    spec = ckptscan.resolve_run("run/")
    metrics = ckptscan.compute(spec, ckptscan.ScanOptions())
    report = ckptscan.judge(metrics, spec.config.thresholds, spec.reference)
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.2.0"

# The public API, imported on first use: `import ckptscan` itself stays cheap
# (torch takes seconds to import), so the console entry point can turn a
# Ctrl-C during start-up into a clean exit instead of a traceback.
_EXPORTS = {
    "CkptScanError": "ckptscan.errors",
    "Probe": "ckptscan.probe",
    "capture_probe": "ckptscan.probe",
    "load_probe": "ckptscan.probe",
    "ScanOptions": "ckptscan.scan",
    "AUTO": "ckptscan.run",
    "RunSpec": "ckptscan.run",
    "resolve_run": "ckptscan.run",
    "resolve_pair": "ckptscan.run",
    "Metrics": "ckptscan.metrics",
    "compute": "ckptscan.metrics",
    "Thresholds": "ckptscan.detection.rules",
    "judge": "ckptscan.detection.judge",
    "load_report": "ckptscan.report.load",
    "PairCache": "ckptscan.cache",
    "LocalExecutor": "ckptscan.executors.local",
    "RayExecutor": "ckptscan.executors.ray",
    "scan_pair": "ckptscan.api",
    "scan_run": "ckptscan.api",
    "run_spec": "ckptscan.run",
    "watch_run": "ckptscan.watch",
    "WatchEvent": "ckptscan.watch",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ckptscan' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
