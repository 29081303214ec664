"""Every other protocol fsspec knows (`hf://`, `http(s)://`, `ssh://`, …),
through its filesystem's ranged `cat_file`. Installed by the matching extra
(`ckptscan[http]`, `ckptscan[hf]`) or by the user's own fsspec implementation.

`hf://` reads `HF_ENDPOINT` (a mirror, or a Hub emulation) and `HF_TOKEN`
when the store is opened, not when huggingface_hub was first imported; it
lists through HfFileSystem and reads each range with one GET of the file's
`resolve` URL (see `_hub_range`)."""

from __future__ import annotations

import os
from typing import Any

from ckptscan.storage.errors import Denied, NotFound, missing_extra
from ckptscan.storage.ranged import TIMEOUT_S, RangedReader
from ckptscan.storage.remote_path import Listing, ObjectInfo


class FsspecStore(RangedReader):
    def __init__(self, scheme: str, root: str):
        super().__init__()
        self.url = f"{scheme}://{root}"
        self._root = root
        try:
            import fsspec
            cls = fsspec.get_filesystem_class(scheme)
            # A filesystem of our own: fsspec's shared instances keep listings
            # across commands (a `watch` would never see a new checkpoint).
            self._fs = cls(skip_instance_cache=True, **_options(scheme))
        except (ImportError, ValueError):  # unknown protocol, or its implementation is not installed
            raise missing_extra(scheme, self.url) from None
        self._url_paths = scheme in ("http", "https")  # these filesystems take whole URLs as paths
        self.lists_trees = not self._url_paths
        self._hub = scheme == "hf"
        self._urls: dict[str, str] = {}  # key -> resolve URL (hf://)

    def _path(self, key: str) -> str:
        path = f"{self._root}/{key}" if key else self._root
        return f"{self.url.split('://')[0]}://{path}" if self._url_paths else path

    def _translate(self, e: Exception) -> Exception:
        response = getattr(e, "response", None)  # an HTTP error of requests, httpx or huggingface_hub
        status = getattr(response, "status_code", None)
        if isinstance(e, FileNotFoundError) or status == 404:
            return NotFound()
        if isinstance(e, PermissionError) or status in (401, 403):
            return Denied(_status(response) if status else str(e) or "permission denied")
        if status:
            return StatusError(_status(response))
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

    def _list_tree(self, prefix: str) -> list[tuple[str, ObjectInfo]]:
        top = self._path(prefix.rstrip("/"))
        try:
            found = self._fs.find(top, detail=True, withdirs=False)
        except Exception as e:
            raise self._translate(e) from None
        # Paths as fsspec names them (no protocol, or whole URLs): keys relative to the store's root.
        base = len(self._path("")) + 1
        objects = []
        for name, entry in found.items():
            if entry.get("size") is None:  # HTTP listings are links without sizes: ask each file (HEAD)
                entry = {**entry, **self._fs.info(name)}
            objects.append((name[base:] if name.startswith(self._path("")) else name,
                            ObjectInfo(int(entry.get("size") or 0), _version(entry))))
        return objects

    def _get(self, key: str, start: int, end: int) -> Any:
        try:
            if self._hub:
                return self._hub_range(key, start, end)
            return self._fs.cat_file(self._path(key), start=start, end=end)
        except Exception as e:
            raise self._translate(e) from None

    def _hub_range(self, key: str, start: int, end: int) -> bytes:
        """One ranged GET of the file's resolve URL (redirects followed), with
        ckptscan's request timeout. HfFileSystem's own file objects retry 5xx
        five times with sleeps of up to 8 s under RangedReader's four tries,
        logging each one to stderr, and their read-ahead cache fetched ~1.6x
        the bytes asked for."""
        from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

        url = self._urls.get(key)
        if url is None:
            url = self._urls[key] = self._fs.url(self._path(key))
        headers = {**build_hf_headers(token=self._fs.token), "Range": f"bytes={start}-{end - 1}"}
        response = get_session().get(url, headers=headers, timeout=TIMEOUT_S, follow_redirects=True)
        hf_raise_for_status(response)
        return response.content


class StatusError(Exception):
    """An HTTP error answer worth retrying, in a few words."""


def _status(response: Any) -> str:
    """The status in words ("503 Service Unavailable"), and the Hub's error code when it sends one."""
    phrase = getattr(response, "reason_phrase", None) or getattr(response, "reason", "")
    code = response.headers.get("X-Error-Code")
    return f"{response.status_code} {phrase}".strip() + (f", {code}" if code else "")


def _options(scheme: str) -> dict[str, Any]:
    if scheme != "hf":
        return {}
    return {"endpoint": os.environ.get("HF_ENDPOINT") or None, "token": os.environ.get("HF_TOKEN") or None}


def _version(entry: dict[str, Any]) -> str | None:
    for field in ("ETag", "etag", "generation", "last_commit", "mtime", "LastModified"):
        if entry.get(field):
            return str(entry[field])
    return None
