"""The router family's monitors: which numbers of a layer's `RouterResult`
(ckptscan/monitors/router.py from the router weights, routing.py from a
probe's routing) are monitored, in which words, and how detection judges each.

Why these settings (measured on healthy and fault-injected runs of the
experiments' trainer; docs/detection.md and docs/calibration.md have the numbers):

- Routing entropy falls for hundreds of steps in healthy MoE runs as experts
  specialise, and router ε keeps rising: their baselines follow the trend
  (Theil–Sen slope) and only a departure from it counts.
- Router ε and row cosine similarity move either way in router faults (rows
  diverge in a stable-winner collapse; the paper's collapse makes them
  alike), so both sides are judged. Cosine similarity drifts in early
  healthy training and is then nearly constant.
- Sequential rule (CUSUM, detection/changepoint.py): every judged monitor
  but router cosine similarity. Its healthy series creeps away from its
  post-warm-up level by a fraction of a sigma per pair for the whole run, which
  a CUSUM accumulates into 13–36 σ on every healthy calibration run of the
  corpus (experiments/); no other monitor's healthy CUSUM exceeded 5.
- Router monitors are never compared with a reference run, only with their
  own history. Router ε is a ratio over the mean router row, a
  near-cancellation whose level differs by 20–30 % between seeds of one
  recipe; routing entropy, load and row similarity depend on which experts
  specialise in what, which the seed decides: against the healthy run of
  the other seed, they raised router alerts on 2 of the 12 healthy
  calibration runs at the calibrated reference scale (experiments/evaluate.py
  --reference-seed). Router faults are seen by the self-baseline at once.
- Not judged: the router update's entropy ΔWr (flat in router faults, moved
  by attention faults: no information about the router's mechanism).
- "alone": routing entropy is the family's specific monitor (it never came
  near its alarm levels in healthy runs or in attention faults) and may
  alert alone; the others may warn alone and reach alert only when it is at
  least at warn in the same layer on the same pair. Without a probe the
  family has no specific monitor: weight-only router findings then warn,
  and only the hard floors alert.
- Headline: routing entropy when a probe gave it, else router ε.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ckptscan.monitors.spec import RESTART, FamilySpec, Judging, MonitorSpec
from ckptscan.schema.results import Finding, LayerResult


def _router(field: str) -> Callable[[LayerResult], float | None]:
    def read(layer: LayerResult) -> float | None:
        value = getattr(layer.router, field) if layer.router is not None else None
        return None if value is None else float(value)

    return read


def _monitor(name: str, label: str, unit: str | None, bad: str, log: bool, judging: Judging) -> MonitorSpec:
    return MonitorSpec(name, "router", label, unit, bad, log, _router(name), judging)


@dataclass(frozen=True)
class RouterThresholds:
    """The router family's thresholds (its section of `Thresholds`; flat names in ckptscan.toml): hard floors,
    alerts whatever the history. ("after": where the JSON report's "thresholds" lists the key.)"""

    # ε this small bounds every pair of router rows to cosine ≥ ~0.65.
    epsilon_floor: float = field(default=0.1, metadata={"after": "run_band_alert"})
    # Mean normalised routing entropy this low: tokens go to about one expert.
    routing_entropy_norm_floor: float = 0.1

    def problems(self) -> list[str]:
        return []


def floor_findings(layer: LayerResult, t: Any) -> list[Finding]:
    """Router ε or the routing entropy under its hard floor: an alert whatever the history (after the warm-up)."""
    findings = []
    router = layer.router
    if router is not None and router.epsilon is not None and router.epsilon < t.epsilon_floor:
        findings.append(Finding(
            "epsilon", "router", "alert", router.epsilon,
            f"router ε {router.epsilon:.3f} below the floor {t.epsilon_floor}: router rows are nearly identical",
            threshold=t.epsilon_floor, rule="floor",
        ))
    entropy = router.routing_entropy_norm if router is not None else None
    if entropy is not None and entropy < t.routing_entropy_norm_floor:
        findings.append(Finding(
            "routing_entropy_norm", "router", "alert", entropy,
            f"normalised routing entropy {entropy:.3f} below the floor {t.routing_entropy_norm_floor}: "
            "probe tokens are routed to about one expert",
            threshold=t.routing_entropy_norm_floor, rule="floor",
        ))
    return findings


# What training teams do about an alert of the family, from the literature (ckptscan/monitors/interventions.py).
INTERVENTIONS = (
    ("router z-loss", "add the router z-loss, which penalizes large router logits (ST-MoE: coefficient "
     "1e-3)",
     "Zoph et al. 2022 (ST-MoE), arXiv:2202.08906"),
    ("float32 router, smaller init", "compute the router in float32 (selective precision) and initialize "
     "it smaller",
     "Fedus et al. 2021 (Switch Transformer), arXiv:2101.03961"),
    ("larger load-balancing coefficient", "raise the load-balancing loss coefficient (Switch Transformer: 1e-2)",
     "Fedus et al. 2021 (Switch Transformer), arXiv:2101.03961"),
    ("expert choice or capacity factor", "route by expert choice (balanced by construction, not causal) or "
     "change the capacity factor",
     "Zhou et al. 2022, arXiv:2202.09368"),
    RESTART,
)


ROUTER = FamilySpec(
    "router",
    (
        _monitor("routing_entropy_norm", "routing H/ln E", "H(p) / ln E", "low", False,
                 Judging(0.01, "alert", follow_trend=True, across_runs=False)),
        _monitor("load_cv", "load CV", None, "high", False,
                 Judging(0.05, "warn", follow_trend=True, across_runs=False)),
        _monitor("cosine_similarity", "router cos", None, "both", False,
                 Judging(0.01, "warn", sequential=False, across_runs=False)),
        _monitor("epsilon", "router ε", "ε", "both", True,
                 Judging(0.02, "warn", follow_trend=True, across_runs=False)),
    ),
    headline=("routing_entropy_norm", "epsilon"),
    interventions=INTERVENTIONS,
    mechanism_rank=2,
    present=lambda layer: layer.router is not None,
    always_listed=False,  # plotted only for a run with a MoE layer
    thresholds=RouterThresholds,
    floors=floor_findings,
    why=("a router fault grows attention logits through the inputs it routes, while an attention fault "
         "barely moves the router weights"),
)
