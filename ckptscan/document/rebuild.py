"""Result objects straight from columns (`columns.py`), for
`load_report` of a schema-2 report: each field's column is built once and
the objects made from the columns side by side, instead of a dict per
value and `results.from_dict` over each (half of the time a long report
took to load). What it gives equals `from_dict` of each decoded value
(tested: schema 2 loads as its schema-1 file does); a column it has no
table for (a dict whose keys come in another order, a field only some
rows have) goes through `from_dict` value by value.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any

from ckptscan.document.columns import decode
from ckptscan.schema.results import from_dict


def build(hint: Any, column: dict[str, Any]) -> list[Any]:
    """The values of `column` as `from_dict` makes a field of type `hint` from each."""
    hint = _not_none(hint)
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint) and "obj" in column:
        return _table(typing.cast(type, hint), column)
    if origin is list and "arr" in column and _is_class(typing.get_args(hint)[0]):
        items, rows, start = build(typing.get_args(hint)[0], column["items"]), [], 0
        for length in decode(column["arr"]):
            rows.append(items[start:start + length])
            start += length
        return _with_nones(rows, column)
    if origin is dict and "obj" in column and _is_class(typing.get_args(hint)[1]):
        item = typing.get_args(hint)[1]
        dicts: list[dict[str, Any]] = [{} for _ in range(column["n"])]
        for key, encoded, has_column in column["obj"]:
            values = build(item, encoded)
            if has_column is None:
                for row, value in zip(dicts, values):
                    row[key] = value
            else:
                it = iter(values)
                for row, has in zip(dicts, decode(has_column)):
                    if has:
                        row[key] = next(it)
        return _with_nones(dicts, column)
    values = decode(column)
    if not _holds_classes(hint):
        return values  # numbers, strings, lists and dicts of them: the JSON value is the field's value
    return [None if value is None else _convert(hint, value) for value in values]


@functools.cache
def _holds_classes(hint: Any) -> bool:
    """Whether a value of type `hint` holds result objects that `from_dict` builds."""
    hint = _not_none(hint)
    return dataclasses.is_dataclass(hint) or any(_holds_classes(a) for a in typing.get_args(hint)
                                                 if a is not Ellipsis and a is not type(None))


def _table(cls: type, column: dict[str, Any]) -> list[Any]:
    fields, hints = _fields(cls)
    keys = {key: (encoded, has) for key, encoded, has in column["obj"]}
    if any(has is not None for key, (_, has) in keys.items() if key in hints):
        return [None if row is None else from_dict(cls, row) for row in decode(column)]
    count, columns = column["n"], []
    for field in fields:
        if field.name in keys:
            columns.append(build(hints[field.name], keys[field.name][0]))
        elif field.default is not dataclasses.MISSING:
            columns.append([field.default] * count)
        elif field.default_factory is not dataclasses.MISSING:
            columns.append([field.default_factory() for _ in range(count)])
        else:  # a required field missing: from_dict says which
            return [None if row is None else from_dict(cls, row) for row in decode(column)]
    return _with_nones([cls(*values) for values in zip(*columns)] if columns else [cls() for _ in range(count)],
                       column)


def _convert(hint: Any, value: Any) -> Any:
    """`value` as `from_dict` makes a field of type `hint` (not None) from it."""
    if dataclasses.is_dataclass(hint) and isinstance(value, dict):
        return from_dict(typing.cast(type, hint), value)
    origin = typing.get_origin(hint)
    if origin is list and _is_class(typing.get_args(hint)[0]):
        return [None if v is None else _convert(typing.get_args(hint)[0], v) for v in value]
    if origin is dict and _is_class(typing.get_args(hint)[1]):
        return {k: None if v is None else _convert(typing.get_args(hint)[1], v) for k, v in value.items()}
    return value


def _with_nones(rows: list[Any], column: dict[str, Any]) -> list[Any]:
    if column.get("none") is None:
        return rows
    it = iter(rows)
    return [None if none else next(it) for none in decode(column["none"])]


def _not_none(hint: Any) -> Any:
    """X of `X | None` (the first member that is not None)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(hint) if a is not type(None)]
        classes = [a for a in members if dataclasses.is_dataclass(a)]
        return classes[0] if classes else members[0]
    return hint


def _is_class(hint: Any) -> bool:
    return dataclasses.is_dataclass(_not_none(hint))


@functools.cache
def _fields(cls: type) -> tuple[tuple[dataclasses.Field[Any], ...], dict[str, Any]]:
    return dataclasses.fields(cls), typing.get_type_hints(cls)
