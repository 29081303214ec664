"""ckptscan: catch LLM training instability in saved checkpoints.

    import ckptscan
    report = ckptscan.scan_pair("run/checkpoint-1000", "run/checkpoint-1100")
    report.summary.status            # "ok" | "warn" | "alert" | "unchanged"
    run = ckptscan.scan_run("run/")  # every consecutive pair, judged as a series
"""

__version__ = "0.1.0"

from ckptscan.errors import CkptScanError  # noqa: E402
from ckptscan.probe import Probe, capture_probe, load_probe  # noqa: E402
from ckptscan.scan import ScanOptions, scan_checkpoints, scan_pair  # noqa: E402
from ckptscan.trend import scan_run  # noqa: E402

__all__ = [
    "CkptScanError", "Probe", "ScanOptions", "__version__", "capture_probe", "load_probe", "scan_checkpoints",
    "scan_pair", "scan_run",
]
