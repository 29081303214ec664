"""What the destinations beside the report files share (W&B, MLflow, a
webhook): which run a report is of, a stable id for it, and what a failure
costs.

A destination is a service the scan does not depend on: one that fails (no
network, a bad URI, a full disk, a server error) costs one line on stderr,
and the scan's exit code and JSON report stay what the checkpoints say.
`deliver` is that rule, around each `write_<destination>` call.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
from typing import Callable, TextIO, TypeVar

from ckptscan.errors import CkptScanError
from ckptscan.results import ScanReport

T = TypeVar("T")
# A failure line is one line; an exception's text can be a page (a server's HTML error body).
MAX_REASON_CHARS = 300


def require_package(module: str, flag: str, package: str, extra: str) -> None:
    """Before any long scan: an output flag whose package is missing is exit 2
    with the fix, rather than a failure after the scan."""
    try:
        importlib.import_module(module)
    except ImportError:
        raise CkptScanError(f"{flag} needs the {package} package: pip install 'ckptscan[{extra}]'") from None


def run_location(report: ScanReport) -> str:
    """The run the report is of: its directory as an absolute path, or its
    URL (s3://, hf://, ...); for `diff`, the two checkpoints compared."""
    run = report.settings.get("run")
    if run:
        return str(run) if "://" in str(run) else os.path.abspath(str(run))
    if report.pairs:
        return " ".join(p if "://" in p else os.path.abspath(p)
                        for p in (report.pairs[0].from_path, report.pairs[-1].to_path))
    return report.command


def run_key(report: ScanReport) -> str:
    """A stable id of the run: the same run location gives the same id on every
    re-run (a nightly scan finds its W&B or MLflow run again by it). 16 hex
    characters, a valid W&B run id."""
    return hashlib.sha256(run_location(report).encode()).hexdigest()[:16]


def deliver(destination: str, write: Callable[..., T], *args: object, stderr: TextIO | None = None,
            **kwargs: object) -> T | None:
    """`write(*args, **kwargs)`; should it fail, one line on stderr naming the
    destination and why, and None. Ctrl-C still interrupts (130)."""
    try:
        return write(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - any failure of a destination is reported, never raised
        reason = " ".join(str(e).split()) or type(e).__name__
        if len(reason) > MAX_REASON_CHARS:
            reason = reason[:MAX_REASON_CHARS - 1] + "…"
        print(f"ckptscan: {destination} not updated: {reason}", file=stderr or sys.stderr, flush=True)
        return None
