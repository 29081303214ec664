"""Every other protocol fsspec knows (`hf://`, `http(s)://`, `ssh://`, …),
through its filesystem's ranged `cat_file`. Installed by the matching extra
(`ckptscan[http]`, `ckptscan[hf]`) or by the user's own fsspec implementation.

`hf://` reads `HF_ENDPOINT` (a mirror, or a Hub emulation) and `HF_TOKEN`
when the store is opened, not when huggingface_hub was first imported."""

from __future__ import annotations

import os
from typing import Any

from ckptscan.storage.remote_path import Listing, ObjectInfo
from ckptscan.storage.stores import Denied, NotFound, RangedReader, missing_extra


class FsspecStore(RangedReader):
    def __init__(self, scheme: str, root: str):
        super().__init__()
        self.url = f"{scheme}://{root}"
        self._root = root
        try:
            import fsspec
            from fsspec.spec import AbstractFileSystem
            cls = fsspec.get_filesystem_class(scheme)
            # A filesystem of our own: fsspec's shared instances keep listings
            # across commands (a `watch` would never see a new checkpoint).
            self._fs = cls(skip_instance_cache=True, **_options(scheme))
        except (ImportError, ValueError):  # unknown protocol, or its implementation is not installed
            raise missing_extra(scheme, self.url) from None
        self._url_paths = scheme in ("http", "https")
        # fsspec's generic `cat_file` reads through a buffered file whose
        # default cache fetches past the range (hf:// read ~1.6x the bytes
        # asked for); without a cache a range is one exact GET.
        self._exact = {"cache_type": "none"} if type(self._fs).cat_file is AbstractFileSystem.cat_file else {}  # these filesystems take whole URLs as paths

    def _path(self, key: str) -> str:
        path = f"{self._root}/{key}" if key else self._root
        return f"{self.url.split('://')[0]}://{path}" if self._url_paths else path

    def _translate(self, e: Exception) -> Exception:
        if isinstance(e, FileNotFoundError):
            return NotFound()
        if isinstance(e, PermissionError):
            return Denied(str(e) or "permission denied")
        return e

    def _list(self, prefix: str) -> Listing:
        try:
            entries = self._fs.ls(self._path(prefix.rstrip("/")), detail=True)
        except Exception as e:
            raise self._translate(e) from None
        files, dirs = {}, set()
        for entry in entries:
            name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
            if entry.get("type") == "directory":
                dirs.add(name)
            else:
                if entry.get("size") is None:  # HTTP listings are links without sizes: ask each file (HEAD)
                    entry = {**entry, **self._fs.info(entry["name"])}
                files[name] = ObjectInfo(int(entry.get("size") or 0), _version(entry))
        return Listing(files, frozenset(dirs))

    def _get(self, key: str, start: int, end: int) -> Any:
        try:
            return self._fs.cat_file(self._path(key), start=start, end=end, **self._exact)
        except Exception as e:
            raise self._translate(e) from None


def _options(scheme: str) -> dict[str, Any]:
    if scheme != "hf":
        return {}
    return {"endpoint": os.environ.get("HF_ENDPOINT") or None, "token": os.environ.get("HF_TOKEN") or None}


def _version(entry: dict[str, Any]) -> str | None:
    for field in ("ETag", "etag", "generation", "last_commit", "mtime", "LastModified"):
        if entry.get(field):
            return str(entry[field])
    return None
