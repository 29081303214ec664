"""JSON report: the versioned, stable schema users' CI scripts parse.

Non-finite floats never reach the file (JSON has no NaN): they become null,
and the rule that saw them has already recorded a finding. Files are written
through `ckptscan.output`: atomically to a file, so a reader never sees half
a report, and straight through to a pipe, a device or stdout (`-`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from pathlib import Path
from typing import Any

from ckptscan import __version__
from ckptscan.errors import CkptScanError
from ckptscan.output import write_output
from ckptscan.results import SCHEMA_VERSION, ScanReport


def report_dict(report: ScanReport) -> dict[str, Any]:
    body = _plain(dataclasses.asdict(report))
    command = body.pop("command")
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "ckptscan", "version": __version__},
        "command": command,
        **body,
    }


def report_json(report: ScanReport) -> str:
    return json.dumps(report_dict(report), indent=2, allow_nan=False) + "\n"


def write_json(report: ScanReport, path: str | Path) -> None:
    try:
        write_output(path, report_json(report))
    except OSError as e:
        raise CkptScanError(f"cannot write the JSON report: {e.strerror or e}", path=path) from None


def _plain(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral):  # numpy integers too
        return int(value)
    if isinstance(value, numbers.Real):  # numpy floats too, which json cannot encode
        value = float(value)
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
