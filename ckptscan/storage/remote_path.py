"""`RemotePath`: an object key in a store, with the path operations readers use.

An object store has keys, not directories: a "directory" is a key prefix
ending in "/". Each prefix is listed once (one paged LIST with delimiter "/")
and the listing is kept by the store client, so `is_file`, `is_dir`, `stat`
and `iterdir` after the first cost no requests. That snapshot is what a scan
wants: a checkpoint that appears mid-scan is seen by the next command.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any, Iterator, Protocol


@dataclass(frozen=True)
class ObjectInfo:
    """What identifies an object's bytes: its size and its ETag (S3, Azure)
    or generation (GCS); None when the store has neither."""

    size: int
    etag: str | None


@dataclass(frozen=True)
class Listing:
    files: dict[str, ObjectInfo]  # name -> info, for objects directly under the prefix
    dirs: frozenset[str]  # names of sub-prefixes


def tree_listings(root: str, objects: list[tuple[str, ObjectInfo]]) -> dict[str, Listing]:
    """The listing of `root` and of every prefix under it, from the keys of
    every object under `root` (a LIST without delimiter)."""
    files: dict[str, dict[str, ObjectInfo]] = {root: {}}
    dirs: dict[str, set[str]] = {root: set()}
    start = len(root) + 1 if root else 0
    for key, info in objects:
        parts = [p for p in key[start:].split("/") if p]
        if not parts:
            continue
        prefix = root
        for part in parts[:-1]:
            dirs.setdefault(prefix, set()).add(part)
            prefix = f"{prefix}/{part}" if prefix else part
            files.setdefault(prefix, {})
            dirs.setdefault(prefix, set())
        if key.endswith("/"):  # a "folder" marker object: a prefix, not a file
            dirs.setdefault(prefix, set()).add(parts[-1])
            marker = f"{prefix}/{parts[-1]}" if prefix else parts[-1]
            files.setdefault(marker, {})
            dirs.setdefault(marker, set())
        else:
            files[prefix][parts[-1]] = info
    return {prefix: Listing(files[prefix], frozenset(dirs[prefix])) for prefix in files}


class Store(Protocol):
    """The few operations ckptscan needs from a store; every one only reads."""

    url: str  # scheme://bucket, without a trailing slash

    def listing(self, key: str) -> Listing: ...

    def start_listings(self, dirs: list[str], trees: list[str]) -> list[Any]: ...

    def read_early(self, key: str, start: int, end: int) -> None: ...

    def read_ranges(self, key: str, ranges: list[tuple[int, int]],
                    what: str | list[str] | None = None) -> list[memoryview]: ...

    def fetch_ranges(self, key: str, ranges: list[tuple[int, int]],
                     what: str | list[str] | None = None) -> Any: ...


class _Stat:
    def __init__(self, info: ObjectInfo):
        self.st_size = info.size


class RemotePath:
    """`key` is relative to the store's root, with no leading or trailing "/"."""

    def __init__(self, store: Store, key: str):
        self.store = store
        self.key = key

    # -- pure path arithmetic --------------------------------------------------
    def __str__(self) -> str:
        return f"{self.store.url}/{self.key}" if self.key else self.store.url

    def __repr__(self) -> str:
        return f"RemotePath({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemotePath) and str(self) == str(other)

    def __lt__(self, other: RemotePath) -> bool:
        return str(self) < str(other)

    def __hash__(self) -> int:
        return hash(str(self))

    def __truediv__(self, name: str) -> RemotePath:
        name = str(name).strip("/")
        return RemotePath(self.store, f"{self.key}/{name}" if self.key else name)

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def parent(self) -> RemotePath:
        return RemotePath(self.store, self.key.rsplit("/", 1)[0] if "/" in self.key else "")

    @property
    def suffix(self) -> str:
        name = self.name
        dot = name.rfind(".")
        return name[dot:] if 0 < dot < len(name) - 1 else ""

    @property
    def stem(self) -> str:
        name = self.name
        return name[: len(name) - len(self.suffix)] if self.suffix else name

    @property
    def parts(self) -> tuple[str, ...]:
        return tuple(p for p in self.key.split("/") if p)

    def resolve(self) -> RemotePath:
        return self

    def is_absolute(self) -> bool:
        return True

    # -- questions answered from the cached listing -----------------------------
    def _listing(self) -> Listing:
        return self.store.listing(self.key)

    def list_with_parent(self) -> None:
        """The parent's listing (is this a file, a folder?) and that of every
        key under this prefix, taken side by side: one round trip, after
        which every question about this folder and what is inside it costs
        no request. Those already taken are not taken again."""
        for future in self.store.start_listings([self.parent.key] if self.key else [], [self.key]):
            future.result()

    def info(self) -> ObjectInfo | None:
        if not self.key:
            return None
        return self.parent._listing().files.get(self.name)

    def is_file(self) -> bool:
        return self.info() is not None

    def is_dir(self) -> bool:
        if not self.key:
            return True
        return self.name in self.parent._listing().dirs

    def exists(self) -> bool:
        return self.is_dir() or self.is_file()

    def stat(self) -> _Stat:
        info = self.info()
        if info is None:
            raise FileNotFoundError(2, "no such object", str(self))
        return _Stat(info)

    def iterdir(self) -> Iterator[RemotePath]:
        listing = self._listing()
        for name in sorted({*listing.files, *listing.dirs}):
            yield self / name

    def glob(self, pattern: str) -> Iterator[RemotePath]:
        """Names directly under this prefix matching `pattern` (no "**")."""
        for child in self.iterdir():
            if fnmatch.fnmatchcase(child.name, pattern):
                yield child

    # -- bytes -------------------------------------------------------------------
    def read_ranges(self, ranges: list[tuple[int, int]], what: str | list[str] | None = None) -> list[memoryview]:
        """The bytes [start, end) of each range, fetched concurrently; `what`
        (the tensor read, or one name per range) goes into error messages."""
        return self.store.read_ranges(self.key, ranges, what)

    def fetch_ranges(self, ranges: list[tuple[int, int]], what: str | list[str] | None = None) -> Any:
        """`read_ranges` started, not waited for: a `stores.Fetch` (`result()`, `cancel()`)."""
        return self.store.fetch_ranges(self.key, ranges, what)

    def read_bytes(self) -> bytes:
        info = self.info()
        if info is None:
            raise FileNotFoundError(2, "no such object", str(self))
        return bytes(self.read_ranges([(0, info.size)])[0]) if info.size else b""

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)
