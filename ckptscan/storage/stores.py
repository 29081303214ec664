"""Store clients behind one interface.

S3 (and S3-compatible endpoints), GCS and Azure go through obstore, a
Python binding of the Rust `object_store` crate; every other fsspec protocol
(`hf://`, `http(s)://`, …) through fsspec. obstore is the one kept for the
big three because it was faster on the same server (bench/remote.py:
concurrent ranged GETs through obstore vs s3fs's `cat_ranges`). Both read
through the engine they share (`ckptscan.storage.ranged`).
"""

from __future__ import annotations

from ckptscan.storage.fsspec_client import FsspecStore
from ckptscan.storage.obstore_client import OBSTORE_SCHEMES, ObstoreStore
from ckptscan.storage.ranged import RangedReader


def open_store(scheme: str, root: str) -> RangedReader:
    """A client for `scheme://root`. Each URL a user names gets its own, so
    its listings are a snapshot taken during this command: creating one
    costs no request."""
    if scheme in OBSTORE_SCHEMES:
        return ObstoreStore(scheme, root)
    return FsspecStore(scheme, root)
