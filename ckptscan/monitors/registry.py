"""The registry of monitor families: every consumer (detection, the reports,
live mode, the scan) asks it, at use time, which families and monitors
there are, so that a family registered later is seen everywhere.

A family is declared beside its math (`FamilySpec`, ckptscan/monitors/spec.py)
and registered here with one line; `registered` adds one for a while (a test's).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

from ckptscan.monitors.attention_family import ATTENTION
from ckptscan.monitors.router_family import ROUTER
from ckptscan.monitors.spec import FamilySpec, MonitorSpec

# What a finding names as its family beside the registered ones: a
# non-finite value in a monitored tensor (detection/numerics.py).
NUMERIC = "numeric"

_families: list[FamilySpec] = []
# Monitors by name, rebuilt on every change: looked up once per (layer, monitor) judged.
_by_name: dict[str, MonitorSpec] = {}


def register(family: FamilySpec) -> None:
    """Add a family after those registered; its monitors' names must be new."""
    taken = [m.name for m in family.monitors if m.name in _by_name]
    if family.name in family_names() or taken:
        raise ValueError(f"family {family.name!r}: already registered, or monitors {taken} of another family")
    _families.append(family)
    _by_name.update((m.name, m) for m in family.monitors)


def unregister(family: FamilySpec) -> None:
    _families.remove(family)
    for monitor in family.monitors:
        del _by_name[monitor.name]


@contextmanager
def registered(family: FamilySpec) -> Iterator[FamilySpec]:
    """The registry with `family` added while the block runs."""
    register(family)
    try:
        yield family
    finally:
        unregister(family)


def families() -> tuple[FamilySpec, ...]:
    return tuple(_families)


def family_names() -> tuple[str, ...]:
    return tuple(f.name for f in _families)


def finding_families() -> tuple[str, ...]:
    """The families a finding may name, in the order reports list them."""
    return (*family_names(), NUMERIC)


def monitors() -> tuple[MonitorSpec, ...]:
    """Every monitor, family by family, in the order detection judges them and reports list them."""
    return tuple(m for f in _families for m in f.monitors)


def judged() -> tuple[MonitorSpec, ...]:
    """The monitors detection judges (those with a `judging`), in that order."""
    return tuple(m for m in monitors() if m.judging is not None)


def spec(name: str) -> MonitorSpec:
    """The monitor named `name` (KeyError if none is)."""
    return _by_name[name]


def find(name: str) -> MonitorSpec | None:
    """The monitor named `name`, or None (a finding's monitor may be no monitor's: "nonfinite")."""
    return _by_name.get(name)


def headlines(has_values: Callable[[MonitorSpec], bool]) -> list[MonitorSpec]:
    """Per family, the first of its headline monitors that `has_values`
    (families with none are left out), in family order."""
    found = []
    for family in _families:
        shown = next((spec(name) for name in family.headline if has_values(spec(name))), None)
        if shown is not None:
            found.append(shown)
    return found


register(ATTENTION)
register(ROUTER)
