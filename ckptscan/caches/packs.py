"""Packs: a run's cached pairs (the pair cache) or judged pairs (the judge
cache) in one file, beside their per-pair entries, and when to write one again.

A re-run reads its run's pack in one go instead of a file a pair (at 2,000
pairs that was most of the re-run). The file is

    b"ckptscan-pack\\n" | header length (8 bytes) | CRC-32 (4 bytes) | header (JSON) | floats

(lengths little-endian). The header holds what the cache keeps of the pack
(the names of its pairs, in order) and its rows as `caches/tables.py`
columns, where each column of floats, `{"f8": BASE64}` in a report, is `{"f8@": [OFFSET, COUNT]}`: COUNT
float64 values at OFFSET bytes into the floats. A float column is most of a
pack's bytes, and reading it as bytes instead of base64 in a JSON string
took a quarter of reading the pack. The CRC-32 is of the header and the
floats: a pack has no key to check a pair by, as a per-pair entry has, and
a flipped bit in a length would shift rows between pairs.

The pack is only a faster copy of the per-pair entries: a missing, stale or
unreadable pack (`PackError`) is passed over, and its pairs are read from
their own files.
"""

from __future__ import annotations

import base64
import json
import struct
import zlib
from pathlib import Path
from typing import Any, Callable

from ckptscan.system.output import write_output

MAGIC = b"ckptscan-pack\n"
PACK_FORMAT = 2  # 1: the same header as JSON text with the floats in base64 (never released)
# A pack is written again when more pairs than this, and than this share of
# those it holds, are past it: a nightly re-run adds one pair, and writing
# 2,000 pairs again costs ~2 s (bench/long_run.py), so about every 250 runs.
PACK_AFTER_PAIRS = 16
PACK_AFTER_SHARE = 1 / 8


class PackError(ValueError):
    """A pack that cannot be read as one (truncated, another format, another version)."""


def pack_due(packed: int, total: int) -> bool:
    """Whether a pack of `packed` pairs of a run of `total` is written again."""
    return total - packed > max(PACK_AFTER_PAIRS, packed * PACK_AFTER_SHARE)


def common_prefix(a: list[str], b: list[str]) -> int:
    """How many names `a` and `b` share from their first."""
    count = 0
    for x, y in zip(a, b):
        if x != y:
            break
        count += 1
    return count


def write_pack(path: Path, names: list[str], column: dict[str, Any]) -> None:
    """The pack of pairs `names` whose rows are `column` (`tables.encode`),
    to `path` atomically, its floats moved out of the header. OSError propagates."""
    floats: list[bytes] = []
    size = 0

    def moved(node: dict[str, Any]) -> dict[str, Any]:
        nonlocal size
        raw = base64.b64decode(node["f8"])
        floats.append(raw)
        size += len(raw)
        return {**{k: v for k, v in node.items() if k != "f8"}, "f8@": [size - len(raw), len(raw) // 8]}

    header = {"format": PACK_FORMAT, "pairs": names, "rows": _floats_mapped(column, "f8", moved)}
    text = json.dumps(header, allow_nan=True).encode()
    crc = zlib.crc32(b"".join(floats), zlib.crc32(text))
    write_output(path, b"".join([MAGIC, struct.pack("<QI", len(text), crc), text, *floats]))


def read_pack(path: Path) -> tuple[list[str], dict[str, Any]]:
    """The names and rows `write_pack` was given, each float column's values
    as bytes (`document.columns.decode` takes either). OSError, PackError."""
    data = path.read_bytes()
    start = len(MAGIC) + 12
    if not data.startswith(MAGIC) or len(data) < start:
        raise PackError(f"{path}: not a pack")
    length, crc = struct.unpack_from("<QI", data, len(MAGIC))
    if zlib.crc32(memoryview(data)[start:]) != crc:
        raise PackError(f"{path}: its CRC-32 does not match (cut short or damaged)")
    try:
        header = json.loads(data[start:start + length])
        if header["format"] != PACK_FORMAT:
            raise PackError(f"{path}: another pack format")
        names, rows = header["pairs"], header["rows"]
    except (ValueError, KeyError, TypeError) as e:
        raise PackError(f"{path}: {e}") from None
    floats = memoryview(data)[start + length:]

    def restored(node: dict[str, Any]) -> dict[str, Any]:
        offset, count = node["f8@"]
        if not (type(offset) is int and type(count) is int and 0 <= offset and offset + 8 * count <= len(floats)):
            raise PackError(f"{path}: a column of floats past the end of the file")
        return {**{k: v for k, v in node.items() if k != "f8@"}, "f8": floats[offset:offset + 8 * count]}

    return names, _floats_mapped(rows, "f8@", restored)


def _floats_mapped(column: Any, kind: str, f: Callable[[dict[str, Any]], dict[str, Any]]) -> Any:
    """`column` (a `tables` or `document.columns` column) with `f` applied to
    each column of floats (a dict with key `kind`). Only the columns'
    structure is walked, never a value: a raw value that looks like a column is left as it is."""
    if not isinstance(column, dict):
        raise PackError("not a column")
    if kind in column:
        column = f(column)
    mapped = dict(column)
    for key in ("none", "lengths", "items", "keys", "codes", "arr"):
        if isinstance(mapped.get(key), dict):
            mapped[key] = _floats_mapped(mapped[key], kind, f)
    if "fields" in mapped:
        mapped["fields"] = [[name, _floats_mapped(field, kind, f)] for name, field in mapped["fields"]]
    if "obj" in mapped:
        mapped["obj"] = [[key, _floats_mapped(field, kind, f), None if has is None else _floats_mapped(has, kind, f)]
                         for key, field, has in mapped["obj"]]
    return mapped
