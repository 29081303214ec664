"""ckptscan: catch LLM training instability in saved checkpoints.

    import ckptscan
    report = ckptscan.scan_pair("run/checkpoint-1000", "run/checkpoint-1100")
    report.summary.status            # "ok" | "warn" | "alert" | "unchanged"
    run = ckptscan.scan_run("run/")  # every consecutive pair, judged as a series
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# The public API, imported on first use: `import ckptscan` itself stays cheap
# (torch takes seconds to import), so the console entry point can turn a
# Ctrl-C during start-up into a clean exit instead of a traceback.
_EXPORTS = {
    "CkptScanError": "ckptscan.errors",
    "Probe": "ckptscan.probe",
    "capture_probe": "ckptscan.probe",
    "load_probe": "ckptscan.probe",
    "ScanOptions": "ckptscan.scan",
    "scan_checkpoints": "ckptscan.scan",
    "scan_pair": "ckptscan.scan",
    "scan_run": "ckptscan.trend",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ckptscan' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
