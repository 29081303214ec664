"""Whole-object downloads, for formats that cannot be read by byte range.

A torch pickle (`.bin`, `.pt`, `.ckpt`) is a zip whose tensors are found
only by reading its pickled structure, and an old-style pickle interleaves
structure and data: neither can be read in ranges, so the file is copied to
a private temporary directory (removed at exit) and memory-mapped there, as
locally. The copy is bounded: `CKPTSCAN_DOWNLOAD_LIMIT` bytes in all
(default 64 GiB), and never more than the free space of that disk. A run of
pickles is kept downloaded while it is scanned, since the layer-major loop
visits every checkpoint once per layer.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path

from ckptscan.errors import CkptScanError
from ckptscan.storage.ranged import setting
from ckptscan.storage.remote_path import RemotePath

LIMIT = int(setting("CKPTSCAN_DOWNLOAD_LIMIT", 64 << 30))
# Written in pieces of this size, so memory stays bounded whatever the file size.
PIECE = 64 << 20

# (URL, size, ETag) -> the local copy: a changed object is downloaded again.
_downloaded: dict[tuple[str, int, str | None], Path] = {}
_used = 0
_directory: Path | None = None
_lock = threading.Lock()


def local_copy(remote: RemotePath) -> Path:
    """A local copy of `remote`, downloaded once per process."""
    global _used, _directory
    with _lock:
        info = remote.info()
        if info is None:
            raise CkptScanError("no such object", path=remote)
        key = (str(remote), info.size, info.etag)
        if key in _downloaded:
            return _downloaded[key]
        if _directory is None:
            _directory = Path(tempfile.mkdtemp(prefix="ckptscan-download-",
                                               dir=os.environ.get("CKPTSCAN_DOWNLOAD_DIR")))
            atexit.register(shutil.rmtree, _directory, ignore_errors=True)
        free = shutil.disk_usage(_directory).free
        if _used + info.size > LIMIT or info.size > free:
            raise CkptScanError(f"this torch pickle cannot be read by byte range and must be downloaded whole, but "
                                f"its {info.size / 2**30:.2f} GiB exceed the download limit ({LIMIT / 2**30:.1f} GiB "
                                f"in all, CKPTSCAN_DOWNLOAD_LIMIT; {free / 2**30:.1f} GiB free in {_directory})",
                                path=remote)
        _used += info.size
        target = _directory / f"{len(_downloaded)}-{remote.name}"
        sys.stderr.write(f"note: {remote} is a torch pickle, which cannot be read by byte range: downloading "
                         f"{info.size / 2**20:.1f} MiB to {_directory} (removed at exit)\n")
        with open(target, "wb") as f:
            for start in range(0, info.size, PIECE):
                end = min(start + PIECE, info.size)
                # Each piece arrives as concurrent parts; RangedReader checks each part's length.
                f.write(remote.read_ranges([(start, end)])[0])
        _downloaded[key] = target
        return target
