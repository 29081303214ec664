"""Tables: values of a typed field (result dataclasses, lists and dicts of
them) as columns, one per field, and back.

A cached re-run of a long trend rebuilds every pair it judged before: at
2,000 pairs of 16 layers, ~2·10⁵ objects. Read as one JSON file a pair, their
floats parsed from decimal text and each object built from a dict, that was
most of the re-run (bench/long_run.py). Here the rows of a class are one
column per field (`document.columns`: floats as their float64 bytes) and come
back by calling the class on its columns, `map(cls, *columns)`: no dict, no
keyword parsing per object. `decode(hint, encode(hint, values)) == values`,
NaN, ±inf, -0.0 and None included, bit for bit.

What a column of `hint`'s values looks like:
* a dataclass (or `C | None`): `{"rows": N, "fields": [[NAME, COLUMN], ...],
  "none": COLUMN | null}`, the fields in the class's order, each COLUMN that
  field's values over the N non-null rows (this same encoding, by the
  field's type), `none` the nulls among the rows;
* `list[C]` / `dict[str, C]` of a dataclass C: `{"lengths": COLUMN,
  "items": COLUMN}` / `{"keys": COLUMN, "items": COLUMN}`, the items of all
  rows in one column (a null list or dict: a null length or key list);
* anything else: a `document.columns` column.
A table whose names are not the class's fields (written by another version),
or whose columns, nulls, lengths or keys do not add up, is a ValueError:
the caches' callers take it as a miss.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any

from ckptscan.document import columns


def encode(hint: Any, values: list[Any]) -> dict[str, Any]:
    """`values`, each of type `hint` (or None), as one column."""
    kind, item = _kind(hint)
    if kind == "rows":
        present = [v for v in values if v is not None]
        fields = [[name, encode(field_hint, [getattr(row, name) for row in present])]
                  for name, field_hint in _fields(item)]
        nones = columns.encode([v is None for v in values]) if len(present) < len(values) else None
        return {"rows": len(present), "fields": fields, "none": nones}
    if kind == "list":
        return {"lengths": columns.encode([None if v is None else len(v) for v in values]),
                "items": encode(item, [x for v in values if v is not None for x in v])}
    if kind == "dict":
        return {"keys": columns.encode([None if v is None else list(v) for v in values]),
                "items": encode(item, [x for v in values if v is not None for x in v.values()])}
    return columns.encode(values)


def decode(hint: Any, column: dict[str, Any]) -> list[Any]:
    """The values `encode(hint, …)` was given."""
    kind, item = _kind(hint)
    if kind == "rows":
        fields = _fields(item)
        if [name for name, _ in column["fields"]] != [name for name, _ in fields]:
            raise ValueError(f"the table's fields are not {item.__name__}'s")
        values = [decode(field_hint, encoded) for (_, field_hint), (_, encoded) in zip(fields, column["fields"])]
        if any(len(field) != column["rows"] for field in values):
            raise ValueError(f"a column of {item.__name__} holds other than {column['rows']} rows")
        rows = list(map(item, *values)) if fields else [item() for _ in range(column["rows"])]
        if column["none"] is None:
            return rows
        nones = columns.decode(column["none"])
        if nones.count(False) != len(rows):
            raise ValueError(f"the nulls among {item.__name__}'s rows do not leave {len(rows)}")
        it = iter(rows)
        return [None if none else next(it) for none in nones]
    if kind == "list":
        items, lengths, start, lists = decode(item, column["items"]), columns.decode(column["lengths"]), 0, []
        if sum(length or 0 for length in lengths) != len(items):
            raise ValueError("the lists' lengths do not add up to their items")
        for length in lengths:
            lists.append(None if length is None else items[start:start + length])
            start += length or 0
        return lists
    if kind == "dict":
        items, key_lists, start, dicts = decode(item, column["items"]), columns.decode(column["keys"]), 0, []
        if sum(len(keys or []) for keys in key_lists) != len(items):
            raise ValueError("the dicts' keys do not add up to their items")
        for keys in key_lists:
            dicts.append(None if keys is None else dict(zip(keys, items[start:start + len(keys)])))
            start += len(keys or [])
        return dicts
    return columns.decode(column)


@functools.cache
def _kind(hint: Any) -> tuple[str, Any]:
    """("rows", C) for a dataclass C or C | None; ("list", C) / ("dict", C)
    for a list / str-keyed dict of C (or of C | None); ("plain", None) else."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(members) != 1:
            return "plain", None
        hint = members[0]
    if dataclasses.is_dataclass(hint):
        return "rows", hint
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is list and _kind(args[0])[0] == "rows":
        return "list", args[0]
    if origin is dict and _kind(args[1])[0] == "rows":
        return "dict", args[1]
    return "plain", None


@functools.cache
def _fields(cls: type) -> list[tuple[str, Any]]:
    """The class's fields and their types, in the order `cls(*values)` takes them."""
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    if not all(f.init for f in fields):
        raise TypeError(f"{cls.__name__} has a field its __init__ does not take")
    return [(f.name, hints[f.name]) for f in fields]
