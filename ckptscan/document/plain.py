"""A report as plain JSON values: the dict schema 1 of the JSON report holds
(`report_dict`), one pair of it (`plain_pair`), built field by field.
`writing.py` writes it as one document, `parts.py` as schema 2.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from typing import Any

from ckptscan import __version__
from ckptscan.errors import CkptScanError
from ckptscan.schema.results import (SCHEMA_VERSION, WRITTEN_WITHOUT, AttentionResult, LayerResult, PairResult,
                                     ScanReport)

# --per-head: which layers keep their per-head results in the report; "all"
# (the library's default) writes every one. The others leave `heads` empty
# elsewhere and say so in settings.per_head; the CLI's default
# (`cli.options.DEFAULT_PER_HEAD`, "flagged+newest") keeps per-head results
# where they explain a verdict, and the newest pair's.
PER_HEAD = ("all", "flagged", "newest", "flagged+newest")


def report_dict(report: ScanReport, per_head: str = "all") -> dict[str, Any]:
    """The report as its JSON file holds it. `per_head` ("all", "flagged":
    only layers at warn or alert, "newest": only the newest pair's,
    "flagged+newest": both): which layers keep their per-head results, 86 %
    of a long report's bytes. Built field by field (`plain`), never through
    `dataclasses.asdict`, whose deep copy of every per-head result, kept or
    not, was half of a long trend's `--json` time."""
    check_per_head(per_head)
    newest = len(report.pairs) - 1
    body: dict[str, Any] = {}
    for name in _field_names(ScanReport):
        value = getattr(report, name)
        body[name] = ([plain_pair(pair, per_head, index == newest) for index, pair in enumerate(value)]
                      if name == "pairs" else plain(value))
    if per_head != "all":
        body["settings"]["per_head"] = per_head
    for key in getattr(report.summary, WRITTEN_WITHOUT, ()):
        # A report loaded from a file written before the key existed: still without it, unless set since.
        if body["summary"].get(key) is None:
            del body["summary"][key]
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "ckptscan", "version": __version__},
        "command": body.pop("command"),
        **body,
    }


def plain_pair(pair: PairResult, per_head: str, newest: bool) -> dict[str, Any]:
    """One pair as the report's `pairs` list holds it (`newest`: it is the
    report's newest pair), each layer's per-head results left out
    (`heads: []`, never serialised) where `per_head` does not keep them."""
    data = {}
    for name in _field_names(PairResult):
        value = getattr(pair, name)
        data[name] = [_plain_layer(layer, per_head, newest) for layer in value] if name == "layers" else plain(value)
    return data


def _plain_layer(layer: LayerResult, per_head: str, newest: bool) -> dict[str, Any]:
    data = {}
    for name in _field_names(LayerResult):
        value = getattr(layer, name)
        if name == "families" and not value:
            # Written only when a registered family computed values: without one
            # the layer is what it was before the field existed.
            continue
        if name == "attention" and value is not None and not keeps_heads(per_head, layer.status, newest):
            data[name] = {field: [] if field == "heads" else plain(getattr(value, field))
                          for field in _field_names(AttentionResult)}
        else:
            data[name] = plain(value)
    return data


def keeps_heads(per_head: str, layer_status: str, newest: bool) -> bool:
    """Whether a layer keeps its per-head results under `per_head` (`newest`:
    the layer is in the report's newest pair)."""
    if per_head == "all" or (newest and per_head in ("newest", "flagged+newest")):
        return True
    return per_head in ("flagged", "flagged+newest") and layer_status in ("warn", "alert")


def check_per_head(per_head: str) -> None:
    if per_head not in PER_HEAD:
        raise CkptScanError(f"--per-head must be one of {', '.join(PER_HEAD)}, not {per_head!r}")


def plain(value: Any) -> Any:
    """`value` as JSON holds it: dataclasses as dicts of their fields, tuples
    as lists, dict keys as strings, numpy numbers as Python's, non-finite
    floats as None (what `dataclasses.asdict` then a walk over its copy gave,
    in one walk). The exact built-in types come first: they are nearly every
    value of a report."""
    kind: type = type(value)
    if kind is float:
        return value if math.isfinite(value) else None
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is list or kind is tuple:
        return [plain(v) for v in value]
    if kind is dict:
        return {k if type(k) is str else str(k): plain(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain_fields(value, _field_names(kind))
    if isinstance(value, bool) or isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral):  # numpy integers too
        return int(value)
    if isinstance(value, numbers.Real):  # numpy floats too, which json cannot encode
        value = float(value)
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def _plain_fields(value: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """A dataclass's fields, `plain`; its float, string and None fields (most
    of a report's ~10⁶ values) without a call each."""
    data = {}
    for name in names:
        field_value = getattr(value, name)
        kind = type(field_value)
        if kind is float:
            data[name] = field_value if math.isfinite(field_value) else None
        elif kind is str or field_value is None or kind is int or kind is bool:
            data[name] = field_value
        else:
            data[name] = plain(field_value)
    return data


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))
