"""Deprecated: the JSON report's format moved to `ckptscan.document`.

`from ckptscan.report.json import write_json` (docs/python-api.md before
the move) still works, with a DeprecationWarning naming the new home:
`ckptscan.write_json`, or the module in `ckptscan.document` that defines the
name. This module is removed at the next major version of the JSON schema;
it is the one module of the package named like a standard-library module,
kept only so that the old import path warns instead of breaking.
"""

from __future__ import annotations

import warnings
from typing import Any

# Under private names: `plain` is also one of the names this module offered (a function).
from ckptscan.document import plain as _plain
from ckptscan.document import sweep as _sweep
from ckptscan.document import writing as _writing

# What this module offered, and where each name lives now.
_MOVED = {
    **{name: _plain for name in ("PER_HEAD", "check_per_head", "keeps_heads", "plain", "plain_pair", "report_dict")},
    **{name: _writing for name in ("COMPACT_RESULTS", "compact", "report_json", "write_json")},
    **{name: _sweep for name in ("sweep_dict", "sweep_message", "write_sweep_json")},
}

__all__ = sorted(_MOVED)


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module 'ckptscan.report.json' has no attribute {name!r}")
    module = _MOVED[name]
    new = "ckptscan.write_json" if name == "write_json" else f"{module.__name__}.{name}"
    warnings.warn(f"ckptscan.report.json.{name} is deprecated: use {new} (ckptscan.report.json is removed at the "
                  "next major version of the JSON schema)", DeprecationWarning, stacklevel=2)
    return getattr(module, name)


def __dir__() -> list[str]:
    return __all__
