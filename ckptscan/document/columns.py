"""Columns: a list of JSON values written as one JSON value, column by column.

Schema 2 of the JSON report (`parts.py`) writes its pairs this way:
a long report is ~10⁵ layer records with the same keys, and in v1 the keys
were half of its bytes and the decimal floats most of the rest. Here a
list of dicts becomes one column per key, written once; a column of floats
is their IEEE-754 float64 bytes in base64 (10.7 characters a value instead
of ~18, and bit-for-bit the float the report held); a column that repeats
one value is run-length encoded; a column of a few strings is a table of
them and their codes. `decode(encode(values)) == values` for any list of
JSON values (dict key order included), which the tests check on random
nested values.

An encoded column is a dict with one key, its kind:

* `{"f8": BASE64}`: floats and nulls (null as NaN: a report never holds a
  NaN, `plain.plain` writes a non-finite float as null); where the floats
  hold a NaN (the caches keep what was computed, `caches/tables.py`),
  `{"f8": BASE64, "none": COLUMN}`, the nulls in a column of booleans;
* `{"rle": [VALUE, COUNT, VALUE, COUNT, ...]}`: runs of equal scalars;
* `{"cat": [STRING, ...], "codes": COLUMN}`: strings by their index;
* `{"obj": [[KEY, COLUMN, HAS], ...], "n": COUNT, "none": COLUMN | null}`:
  COUNT dicts (and a null where `none`, a column of booleans, is true); each key's COLUMN holds
  the values of the dicts that have it, HAS (a column of booleans over the
  dicts, or null: all have it) says which do; keys in the dicts' order;
* `{"arr": COLUMN, "items": COLUMN, "none": COLUMN | null}`: lists, their
  lengths and all their items in one column;
* `{"raw": [VALUE, ...]}`: anything else, as it is.
"""

from __future__ import annotations

import base64
import math
from typing import Any

import numpy as np

# A column of scalars is run-length encoded when it has at most this share
# of runs: a long run's statuses, states and nulls are nearly all one value.
RLE_SHARE = 0.25
# A column of strings is a table and codes when it has at most this many
# distinct strings (a judgement's states, a finding's rules).
CATEGORIES = 64


def encode(values: list[Any]) -> dict[str, Any]:
    """`values` (JSON values) as one column (see the module docstring)."""
    kinds = {type(v) for v in values if v is not None}
    if kinds == {dict}:
        return _encode_dicts(values)
    if kinds == {list}:
        return _encode_lists(values)
    if kinds <= {float, int, str, bool}:
        runs = _runs(values)
        if len(runs) <= max(1, RLE_SHARE * len(values)) * 2:
            return {"rle": runs}
        if kinds == {float}:
            packed = np.array([math.nan if v is None else v for v in values], dtype="<f8")
            column: dict[str, Any] = {"f8": base64.b64encode(packed.tobytes()).decode("ascii")}
            if any(v != v for v in values):  # a NaN (None != None is False): the nulls said apart
                column["none"] = encode([v is None for v in values])
            return column
        if kinds == {str}:
            table = list(dict.fromkeys(v for v in values if v is not None))
            if len(table) <= CATEGORIES and None not in values:
                index = {v: i for i, v in enumerate(table)}
                return {"cat": table, "codes": encode([index[v] for v in values])}
    return {"raw": list(values)}


def decode(column: dict[str, Any]) -> list[Any]:
    """The values `encode` was given."""
    if "f8" in column:
        payload = column["f8"]  # base64 in a report; the bytes themselves in a cache's pack (caches/packs.py)
        packed = np.frombuffer(base64.b64decode(payload) if isinstance(payload, str) else payload, dtype="<f8")
        values: list[Any] = packed.tolist()
        nulls = np.flatnonzero(decode(column["none"]) if "none" in column else np.isnan(packed)).tolist()
        for i in nulls:
            values[i] = None
        return values
    if "rle" in column:
        runs = column["rle"]
        values = []
        for i in range(0, len(runs), 2):
            values.extend([runs[i]] * runs[i + 1])
        return values
    if "cat" in column:
        table = column["cat"]
        return [table[code] for code in decode(column["codes"])]
    if "obj" in column:
        return _decode_dicts(column)
    if "arr" in column:
        return _decode_lists(column)
    if "raw" in column:
        return list(column["raw"])
    raise ValueError(f"unknown column kind {sorted(column)}")


def _runs(values: list[Any]) -> list[Any]:
    """[value, count, ...]: equal means the same type and value (1, 1.0 and
    True stay apart; so do 0.0 and -0.0)."""
    runs: list[Any] = []
    previous: Any = _NOTHING
    for value in values:
        if previous is not _NOTHING and _same(value, previous):
            runs[-1] += 1
        else:
            runs += [value, 1]
            previous = value
    return runs


_NOTHING = object()


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b) or a != b:
        return False
    return type(a) is not float or math.copysign(1.0, a) == math.copysign(1.0, b)


def _none_column(values: list[Any]) -> dict[str, Any] | None:
    return encode([v is None for v in values]) if any(v is None for v in values) else None


def _encode_dicts(values: list[Any]) -> dict[str, Any]:
    present = [v for v in values if v is not None]
    order: dict[str, int] = {}
    for row in present:
        for key in row:
            order.setdefault(key, len(order))
    for row in present:
        # A dict whose keys come in another order than the others' could not be
        # rebuilt from the columns as it was: the whole column stays raw.
        positions = [order[key] for key in row]
        if positions != sorted(positions):
            return {"raw": list(values)}
    keys = []
    for key in order:
        has = [key in row for row in present]
        rows = present if all(has) else [row for row in present if key in row]
        keys.append([key, encode([row[key] for row in rows]), None if all(has) else encode(has)])
    return {"obj": keys, "n": len(present), "none": _none_column(values)}


def _decode_dicts(column: dict[str, Any]) -> list[Any]:
    rows: list[dict[str, Any]] = [{} for _ in range(column["n"])]
    for key, encoded, has_column in column["obj"]:
        values = decode(encoded)
        if has_column is None:
            for row, value in zip(rows, values):
                row[key] = value
        else:
            it = iter(values)
            for row, has in zip(rows, decode(has_column)):
                if has:
                    row[key] = next(it)
    return _with_nones(rows, decode(column["none"]) if column["none"] is not None else None)


def _encode_lists(values: list[Any]) -> dict[str, Any]:
    present = [v for v in values if v is not None]
    return {"arr": encode([len(v) for v in present]), "items": encode([item for v in present for item in v]),
            "none": _none_column(values)}


def _decode_lists(column: dict[str, Any]) -> list[Any]:
    items, rows, start = decode(column["items"]), [], 0
    for length in decode(column["arr"]):
        rows.append(items[start:start + length])
        start += length
    return _with_nones(rows, decode(column["none"]) if column["none"] is not None else None)


def _with_nones(rows: list[Any], nones: list[bool] | None) -> list[Any]:
    if nones is None:
        return rows
    it = iter(rows)
    return [None if none else next(it) for none in nones]
