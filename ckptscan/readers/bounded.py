"""A checkpoint's small metadata files, read with limits: config.json, shard
indexes (`*.index.json`), DCP `.metadata`, Megatron's metadata.json.

Like safetensors headers (`MAX_HEADER_BYTES`), each is refused before it is
read when it is larger than any real one could be: a 50 GB "config.json", or
/dev/zero or a FIFO posing as one, must give one line and exit 2, not fill
memory or hang. And what was parsed is refused when it nests deeper than any
real one does, before code that walks it recursively gets to it.
"""

from __future__ import annotations

import io
import json
import os
import stat
from pathlib import Path
from typing import Any, Iterable

from ckptscan.errors import CkptScanError
from ckptscan.storage import RemotePath

# Real files are far smaller: a config.json is a few KB; the index of a
# DeepSeek-V3-sized model (~90k tensors) about 10 MB, the same order as the
# safetensors header its shards carry; DCP metadata of a 400B-parameter run
# on thousands of ranks some hundreds of MB.
MAX_CONFIG_BYTES = 16 * 2**20
MAX_INDEX_BYTES = 100 * 2**20
MAX_DCP_METADATA_BYTES = 1024 * 2**20
# Real configs and indexes nest < 6 deep, DCP metadata < 10.
MAX_DEPTH = 64


def read_limited(path: Path | RemotePath, limit: int, what: str) -> bytes:
    """The bytes of regular file (or object) `path`, refused (CkptScanError) when over `limit`."""
    if isinstance(path, RemotePath):
        info = path.info()
        if info is None:
            raise CkptScanError(f"{what}: no such object", path=path)
        _check_size(path, info.size, limit, what)  # from the listing: nothing over the limit is fetched
        data = path.read_bytes()
        _check_size(path, len(data), limit, what)
        return data
    try:
        # O_NONBLOCK: a FIFO posing as the file must not block open().
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise CkptScanError(f"{what} is not a regular file", path=path)
            _check_size(path, st.st_size, limit, what)
            chunks, size = [], 0
            while chunk := os.read(fd, min(1 << 20, limit + 1 - size)):  # +1: see a file that grew
                chunks.append(chunk)
                size += len(chunk)
                _check_size(path, size, limit, what)
        finally:
            os.close(fd)
    except OSError as e:
        raise CkptScanError(f"cannot read: {e.strerror or e}", path=path) from None
    return b"".join(chunks)


def load_json(path: Path | RemotePath, limit: int, what: str) -> Any:
    """Parse JSON file `path` within `limit` bytes and MAX_DEPTH levels."""
    raw = read_limited(path, limit, what)
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:  # ValueError: JSONDecodeError, ints past the digit limit
        raise CkptScanError(f"invalid JSON ({e})", path=path) from None
    except RecursionError:
        raise CkptScanError("invalid JSON (nested too deeply)", path=path) from None
    check_depth(value, path, what)
    return value


def open_limited(path: Path | RemotePath, limit: int, what: str) -> io.BytesIO:
    """File `path` (within `limit` bytes) as an in-memory binary stream, for unpicklers."""
    return io.BytesIO(read_limited(path, limit, what))


def check_depth(value: Any, path: Path | RemotePath, what: str) -> None:
    """Refuse containers (dicts, lists, tuples, sets, objects' attributes)
    nested deeper than MAX_DEPTH. Iterative, each object visited once, so a
    deep or self-referencing structure costs its size, never the C stack."""
    seen: set[int] = set()
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        children = _children(node)
        if children is None or id(node) in seen:
            continue
        seen.add(id(node))
        if depth >= MAX_DEPTH:
            raise CkptScanError(f"{what} nests more than {MAX_DEPTH} levels deep (corrupt or hostile?)", path=path)
        # Leaves (most of a JSON document: its keys and numbers) have no children: not pushed.
        stack.extend((child, depth + 1) for child in children if not isinstance(child, _LEAVES) and child is not None)


_LEAVES = (str, bytes, int, float, bool)


def _children(node: Any) -> Iterable[Any] | None:
    if isinstance(node, dict):
        return [*node.keys(), *node.values()]
    if isinstance(node, (list, tuple, set, frozenset)):
        return node
    if isinstance(node, (str, bytes, int, float, bool)) or node is None:
        return None
    attributes = getattr(node, "__dict__", None)  # DCP's metadata dataclasses
    return list(attributes.values()) if isinstance(attributes, dict) else None


def _check_size(path: Path | RemotePath, size: int, limit: int, what: str) -> None:
    if size > limit:
        raise CkptScanError(f"{what} is larger than {limit // 2**20} MiB (corrupt or not a {what}?)", path=path)
