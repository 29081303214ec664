"""JSON report: the versioned, stable schema users' CI scripts parse.

Non-finite floats never reach the file (JSON has no NaN): they become null,
and the rule that saw them has already recorded a finding. Files are written
atomically (temp file + rename), so a reader never sees half a report.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from ckptscan import __version__
from ckptscan.errors import CkptScanError
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
        write_atomic(Path(path), report_json(report))
    except OSError as e:
        raise CkptScanError(f"cannot write the JSON report: {e.strerror or e}", path=path) from None


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` so that `path` is either old or complete.

    The text goes to a temp file in the same directory, is flushed to disk,
    then renamed over `path` (atomic on POSIX). Any failure, Ctrl-C included,
    removes the temp file and leaves `path` as it was. OSError propagates:
    callers decide whether a failed write is fatal (a report) or not (a cache).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp creates 0600; give the file the mode a plain open() would.
        os.fchmod(fd, _mode_for(path))
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


def _mode_for(path: Path) -> int:
    """The existing file's permissions, else 0666 less the umask."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable; best effort (not every filesystem can)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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
