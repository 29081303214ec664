"""JSON report: the versioned, stable schema users' CI scripts parse.

Non-finite floats never reach the file (JSON has no NaN): they become null,
and the rule that saw them has already recorded a finding. Files are written
atomically (temp file + rename), so a reader never sees half a report.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from ckptscan import __version__
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
    write_atomic(Path(path), report_json(report))


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` so that `path` is either old or complete."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _plain(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
