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
from ckptscan.monitors.numeric_family import NUMERIC as NUMERIC_FAMILY
from ckptscan.monitors.output_family import OUTPUT
from ckptscan.monitors.optimizer_family import OPTIMIZER
from ckptscan.monitors.router_family import ROUTER
from ckptscan.monitors.spec import FamilySpec, MonitorSpec
from ckptscan.monitors.update_family import UPDATE
from ckptscan.schema.results import PairResult

# What a finding names as its family beside the registered ones: a
# non-finite value in a monitored tensor (detection/numerics.py); the
# judge's own rules, whatever is registered (monitors/numeric_family.py).
NUMERIC = NUMERIC_FAMILY.name

# The registered families and what is derived from them, rebuilt on every
# change (read per layer and pair judged: a lookup, never a rebuild).
_families: tuple[FamilySpec, ...] = ()
_monitors: tuple[MonitorSpec, ...] = ()
_judged: tuple[MonitorSpec, ...] = ()
_by_name: dict[str, MonitorSpec] = {}


def register(family: FamilySpec) -> None:
    """Add a family after those registered; its monitors' names must be new,
    and at most one family sets `banded` (the band thresholds are one
    family's calibration, detection/layer_band.py)."""
    taken = [m.name for m in family.monitors if m.name in _by_name]
    if family.name in finding_families() or taken:
        raise ValueError(f"family {family.name!r}: already registered, or monitors {taken} of another family")
    if family.banded and any(f.banded for f in _families):
        raise ValueError(f"family {family.name!r} sets banded, as a registered family does: the band rules "
                         "judge one family's update monitors")
    _set((*_families, family))


def unregister(family: FamilySpec) -> None:
    if family not in _families:
        raise ValueError(f"family {family.name!r} is not registered")
    _set(tuple(f for f in _families if f is not family))


def _set(families: tuple[FamilySpec, ...]) -> None:
    global _families, _monitors, _judged, _by_name
    monitors = tuple(m for f in families for m in f.monitors)
    _families, _monitors = families, monitors
    _judged = tuple(m for m in monitors if m.judging is not None)
    _by_name = {m.name: m for m in monitors}


@contextmanager
def registered(family: FamilySpec) -> Iterator[FamilySpec]:
    """The registry with `family` added while the block runs."""
    register(family)
    try:
        yield family
    finally:
        unregister(family)


def families() -> tuple[FamilySpec, ...]:
    return _families


def family_names() -> tuple[str, ...]:
    return tuple(f.name for f in _families)


def finding_families() -> tuple[str, ...]:
    """The families a finding may name, in the order reports list them."""
    return (*family_names(), NUMERIC)


def finding_specs() -> tuple[FamilySpec, ...]:
    """The families a finding may name, declared: the registered ones, then the numeric family."""
    return (*_families, NUMERIC_FAMILY)


def finding_spec(name: str) -> FamilySpec | None:
    """The family a finding names, declared; None for a name no family has."""
    return next((family for family in finding_specs() if family.name == name), None)


def fill(pair: PairResult) -> None:
    """What every family fills in a computed pair once its learning rate is known (`FamilySpec.fill`: the
    update family's RMS(ΔW)/Ση), in place; call it whenever `pair.lr` is set or changes."""
    for family in _families:
        if family.fill is not None:
            family.fill(pair)


def monitors() -> tuple[MonitorSpec, ...]:
    """Every monitor, family by family, in the order detection judges them and reports list them."""
    return _monitors


def judged() -> tuple[MonitorSpec, ...]:
    """The monitors detection judges (those with a `judging`), in that order;
    the same tuple until the registry changes."""
    return _judged


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
register(UPDATE)
register(OUTPUT)
register(OPTIMIZER)
