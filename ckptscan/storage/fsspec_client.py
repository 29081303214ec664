"""Every other protocol fsspec knows (`hf://`, `http(s)://`, `ssh://`, …),
through its filesystem's ranged `cat_file`. Installed by the matching extra
(`ckptscan[http]`, `ckptscan[hf]`) or by the user's own fsspec implementation."""

from __future__ import annotations

from typing import Any

from ckptscan.storage.errors import Denied, NotFound, missing_extra
from ckptscan.storage.ranged import RangedReader
from ckptscan.storage.remote_path import Listing, ObjectInfo


class FsspecStore(RangedReader):
    def __init__(self, scheme: str, root: str):
        super().__init__()
        self.url = f"{scheme}://{root}"
        self._root = root
        try:
            import fsspec
            cls = fsspec.get_filesystem_class(scheme)
            self._fs = cls()
        except (ImportError, ValueError):  # unknown protocol, or its implementation is not installed
            raise missing_extra(scheme, self.url) from None
        self._url_paths = scheme in ("http", "https")  # these filesystems take whole URLs as paths

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
            return self._fs.cat_file(self._path(key), start=start, end=end)
        except Exception as e:
            raise self._translate(e) from None


def _version(entry: dict[str, Any]) -> str | None:
    for field in ("ETag", "etag", "generation", "last_commit", "mtime", "LastModified"):
        if entry.get(field):
            return str(entry[field])
    return None
