"""Deprecated: reading a JSON report moved to `ckptscan.document.reading`.

`ckptscan.schema.load.read_json_file` (docs/json-schema.md before the move)
and its neighbours still work, with a DeprecationWarning naming the new
home; `ckptscan.load_report` is the public entry point. The module named is
imported only when an old name is asked for: the schema stays below the
format, which builds on it. Removed at the next major version of the JSON
schema.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

_NEW = "ckptscan.document.reading"
_MOVED = ("GZIP_MAGIC", "READS", "REQUIRED", "as_json_values", "check_report", "load_report", "read_json_file",
          "read_report", "report_from_dict")

__all__ = list(_MOVED)


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module 'ckptscan.schema.load' has no attribute {name!r}")
    warnings.warn(f"ckptscan.schema.load.{name} is deprecated: use {_NEW}.{name} (ckptscan.schema.load is "
                  "removed at the next major version of the JSON schema)", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(_NEW), name)


def __dir__() -> list[str]:
    return __all__
