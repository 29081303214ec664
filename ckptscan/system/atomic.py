"""Atomic file writes: a reader sees the old file or the complete new one,
never half of it. Callers go through `ckptscan.system.output.write_output`, which
sends here only regular files and paths that do not exist yet."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write `data` (text as UTF-8) to `path` so that `path` is either old or complete.

    The data goes to a temp file in the same directory, is flushed to disk,
    then renamed over `path` (atomic on POSIX). Any failure, Ctrl-C included,
    removes the temp file and leaves `path` as it was. OSError propagates:
    callers decide whether a failed write is fatal (a report) or not (a cache).
    """
    payload = data.encode("utf-8") if isinstance(data, str) else data
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp creates 0600; give the file the mode a plain open() would.
        os.fchmod(fd, _mode_for(path))
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        _refuse_special(path)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


def _refuse_special(path: Path) -> None:
    """Never rename over what is not a regular file: a FIFO, a device or a
    symlink that appeared at `path` since the caller looked stays as it is."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise FileExistsError(errno.EEXIST, "exists and is not a regular file", str(path))


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
