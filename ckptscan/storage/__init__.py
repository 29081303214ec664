"""Where checkpoint bytes come from: local files, or objects behind a URL.

Local paths stay `pathlib.Path` and are read exactly as before (`pread`).
A URL (`s3://`, `gs://`, `az://`, `hf://`, `http(s)://`, any fsspec
protocol) becomes a `RemotePath`: the same few path operations the readers
and run discovery use (`/`, `name`, `parent`, `is_file`, `is_dir`,
`iterdir`, `glob`, `stat`, `read_text`), plus `read_ranges`, which fetches
exact byte ranges concurrently. Readers ask for byte ranges and never learn
where the bytes live. Nothing here ever writes to a store.
"""

from __future__ import annotations

import re
from pathlib import Path

from ckptscan.system.paths import expand_path
from ckptscan.storage.remote_path import ObjectInfo, RemotePath
from ckptscan.storage.stores import open_store

__all__ = ["ObjectInfo", "RemotePath", "as_path"]

# scheme://rest, as fsspec and obstore parse URLs. A Windows drive ("C:\") has no "//".
_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://(.*)$")


def as_path(path: str | Path | RemotePath) -> Path | RemotePath:
    """A local `Path`, or a `RemotePath` for a URL (its store is opened once per bucket)."""
    if isinstance(path, RemotePath):
        return path
    if isinstance(path, Path):
        return expand_path(path)
    if path.startswith("file://"):
        return Path(path[len("file://"):])
    match = _URL.match(path)
    if match is None:
        return expand_path(path)
    scheme, rest = match.group(1).lower(), match.group(2)
    root, _, key = rest.partition("/")
    store = open_store(scheme, root)
    return RemotePath(store, key.strip("/"))
