"""Configuration: thresholds from a file, overridden by flags.

Where: `--config PATH` when given; otherwise, from the current directory
upwards (stopping at a repository root, the directory holding `.git`), the
first `ckptscan.toml`, or `pyproject.toml` with a `[tool.ckptscan]` table; a
`ckptscan.toml` wins over a `pyproject.toml` in the same directory.

What: every threshold by its flat name (`Thresholds.field_names()`: the
general rules' and each registered family's section's; see
`ckptscan/detection/rules.py` and docs/detection.md), plus `fail_on`
("warn" | "not_judged" | "alert", the CI gate's default level; default
"alert": an alerting run fails; "not_judged" also fails a run none of whose
pairs could be judged yet). In a `ckptscan.toml` the keys sit at the top level (or under `[tool.ckptscan]`).
`--set KEY=VALUE` (repeatable) overrides any of them; VALUE is a TOML value
(`--set alert_sigma=5`, `--set 'disabled_monitors=["epsilon"]'`) or, for
`disabled_monitors`, a comma-separated list. Unknown keys are errors: a typo
must not silently leave a default in force.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ckptscan.detection.rules import Thresholds
from ckptscan.errors import CkptScanError
from ckptscan.system.paths import expand_path
from ckptscan.schema.results import DEFAULT_FAIL_ON, FAIL_ON_LEVELS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

FAIL_ON = FAIL_ON_LEVELS


@dataclass(frozen=True)
class Config:
    thresholds: Thresholds = field(default_factory=Thresholds)
    fail_on: str = DEFAULT_FAIL_ON
    source: str | None = None  # the file the values came from, if any


def find_config(start: Path) -> Path | None:
    """The config file that applies in `start` (see the module docstring)."""
    for directory in [start, *start.parents]:
        own = directory / "ckptscan.toml"
        if own.is_file():
            return own
        pyproject = directory / "pyproject.toml"
        if pyproject.is_file() and "ckptscan" in _read_toml(pyproject).get("tool", {}):
            return pyproject
        if (directory / ".git").exists():
            return None
    return None


def load_config(path: Path | None = None, overrides: Sequence[str] = (), start: Path | None = None,
                search: bool = True) -> Config:
    """Defaults, then the config file (`path`, or with `search` the one found
    from `start`, default the current directory), then `overrides` ("KEY=VALUE")."""
    source = expand_path(path) if path is not None else None
    if source is None and search:
        source = find_config((start or Path.cwd()).resolve())
    values: dict[str, Any] = {}
    if source is not None:
        if not source.is_file():
            raise CkptScanError("no such config file", path=source)
        values.update(_file_values(source))
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise CkptScanError(f"--set {item!r}: expected KEY=VALUE, e.g. --set alert_sigma=5")
        values[key.strip()] = _parse_value(raw.strip())
    where = f"{source}" if source is not None else "--set"
    fail_on = values.pop("fail_on", DEFAULT_FAIL_ON)
    if fail_on not in FAIL_ON:
        raise CkptScanError(f"{where}: fail_on must be one of {list(FAIL_ON)}, not {fail_on!r}")
    thresholds = _thresholds(values, where)
    return Config(thresholds, fail_on, str(source) if source is not None else None)


def _file_values(path: Path) -> dict[str, Any]:
    data = _read_toml(path)
    table = data.get("tool", {}).get("ckptscan")
    if table is None:
        if path.name == "pyproject.toml":
            raise CkptScanError("has no [tool.ckptscan] table", path=path)
        table = data
    if not isinstance(table, dict):
        raise CkptScanError("[tool.ckptscan] is not a table", path=path)
    return dict(table)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise CkptScanError(f"cannot read: {e.strerror or e}", path=path) from None
    except tomllib.TOMLDecodeError as e:
        raise CkptScanError(f"invalid TOML ({e})", path=path) from None


def _parse_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"value = {raw}")["value"]
    except tomllib.TOMLDecodeError:
        return raw  # a bare word, e.g. a monitor name


def _thresholds(values: dict[str, Any], where: str) -> Thresholds:
    defaults = Thresholds()
    known = {name: getattr(defaults, name) for name in Thresholds.field_names()}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise CkptScanError(f"{where}: unknown setting(s) {unknown}; known: {sorted([*known, 'fail_on'])}")
    coerced = {key: _coerce(key, value, known[key], where) for key, value in values.items()}
    try:
        return Thresholds(**coerced)
    except CkptScanError as e:
        raise CkptScanError(f"{where}: {e}") from None


def _coerce(key: str, value: Any, default: Any, where: str) -> Any:
    if isinstance(default, tuple):
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
    elif isinstance(default, int) and not isinstance(value, bool):
        if isinstance(value, int):
            return value
    elif isinstance(default, float) and not isinstance(value, bool):
        if isinstance(value, (int, float)):
            return float(value)
    raise CkptScanError(f"{where}: {key} = {value!r} is not a valid {type(default).__name__}")
