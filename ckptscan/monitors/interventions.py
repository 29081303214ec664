"""What training teams do about each alert family, from the literature.

An alert says what failed (family, layers, heads, the rollback candidate);
these say what is usually done about that mechanism, each with the paper
that reports it. They are pointers for the person deciding, not
prescriptions: ckptscan does not know the model's recipe. Each source was
checked for the action attributed to it (arXiv ids;
docs/guides/alert-destinations.md, "What to do about an alert").

Each family declares its own (`FamilySpec.interventions`, beside its
monitors); these functions read them from the registry. The judged
report's summary lists them for its alerting families
(`summary.interventions`, filled by `interventions_for` at the end of
`judge`); the terminal table, the HTML report and `--notify` show them
after the rollback line. `INTERVENTIONS` ({family: its interventions}) is
read from the registry when asked for.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ckptscan.monitors import registry
from ckptscan.monitors.spec import RESTART
from ckptscan.schema.results import Summary

__all__ = ["RESTART", "Intervention", "family_lines", "intervention_lines", "interventions_for", "interventions_of"]


@dataclass(frozen=True)
class Intervention:
    family: str  # the family's name (registry.finding_families())
    short: str  # a few words, for one terminal line per family
    action: str
    source: str  # authors, year and arXiv id


def interventions_of(family: str) -> tuple[Intervention, ...]:
    """What is done about an alert of `family`, as its declaration lists it
    (`FamilySpec.interventions`); () for a family nobody declared."""
    spec = registry.finding_spec(family)
    return tuple(Intervention(family, *action) for action in spec.interventions) if spec is not None else ()


def __getattr__(name: str) -> Any:
    # INTERVENTIONS, {family: its interventions} for every family a finding may name, read from the
    # registry when asked for (a family registered later is in it).
    if name == "INTERVENTIONS":
        return {family: interventions_of(family) for family in registry.finding_families()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def interventions_for(summary: Summary) -> list[dict[str, str]]:
    """The interventions of the families that alerted, the first family to
    alert first (then by first alert step); an action shared by several
    families (the restart) is listed once, under the first."""
    if summary.first_family is None:  # no alert, or the input is not an update of one run: nothing to train differently
        return []
    alerted: list[tuple[int | None, str]] = [(step, family) for family, step in summary.first_alert_step.items()
                                             if step is not None]
    if summary.first_family not in {family for _, family in alerted}:  # named as the cause without alerting itself
        alerted.append((None, summary.first_family))
    order = sorted(alerted, key=lambda sf: (sf[1] != summary.first_family, sf[0] or 0))
    listed: list[dict[str, str]] = []
    seen: set[str] = set()
    for _, family in order:
        for intervention in interventions_of(family):
            if intervention.action not in seen:
                seen.add(intervention.action)
                listed.append(asdict(intervention))
    return listed


def intervention_lines(summary: Summary) -> list[str]:
    """One line per intervention, with its source: the HTML report and notifications."""
    return [f"{i['family']}: {i['action']} [{i['source']}]" for i in summary.interventions]


def family_lines(summary: Summary) -> list[str]:
    """One short line per alerting family, for the terminal; the actions in
    full, with their sources, are in the JSON and the HTML report."""
    by_family: dict[str, list[str]] = {}
    for i in summary.interventions:
        by_family.setdefault(i["family"], []).append(i.get("short") or i["action"])
    return [f"{family}: {' · '.join(shorts)}" for family, shorts in by_family.items()]
