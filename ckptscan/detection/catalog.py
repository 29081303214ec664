"""How each monitored series is judged: its resolution, whether its baseline
follows a trend, how far it may be trusted on its own and whether a
reference run may judge it. Which number it is, its family and its alarm
side are the vocabulary's (ckptscan/vocabulary.py), shared with the reports.

Why these settings (measured on healthy and fault-injected runs of the
experiments' trainer; docs/detection.md and docs/calibration.md have the numbers):

- Normalised entropies are scale-free, so learning-rate warm-up and decay do
  not move them; in healthy runs the Δ2 and ΔW entropies rise after warm-up
  and then stay flat. Their baseline never follows a falling trend, and a
  frozen post-warm-up level is checked too (a slow fault is still a fault).
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
- Norms (the logit bound ‖Q_hᵀK_g‖₂) grow with the learning rate in healthy
  runs: judged on a log scale, following the trend, upward only.
- Router monitors are never compared with a reference run, only with their
  own history. Router ε is a ratio over the mean router row, a
  near-cancellation whose level differs by 20–30 % between seeds of one
  recipe; routing entropy, load and row similarity depend on which experts
  specialise in what, which the seed decides: against the healthy run of
  the other seed, they raised router alerts on 2 of the 12 healthy
  calibration runs at the calibrated reference scale (experiments/evaluate.py
  --reference-seed). Router faults are seen by the self-baseline at once.
- Not judged: update sizes (they follow the learning-rate schedule) and the
  router update's entropy ΔWr (flat in router faults, moved by attention
  faults: no information about the router's mechanism).
- "alone": the most severe finding a monitor may raise by itself. The
  specific monitors (Δ2 entropy for attention, routing entropy for the
  router: they never came near their alarm levels in healthy runs or in the
  other family's faults) may alert alone; the others may warn alone and reach
  alert only when a specific monitor of the same family in the same layer is
  at least at warn on the same pair. Without a probe the router family has
  no specific monitor: weight-only router findings then warn, and only the
  hard floors alert.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ckptscan import vocabulary
from ckptscan.detection.series import SeriesSpec
from ckptscan.results import LayerResult


@dataclass(frozen=True)
class Monitor:
    name: str  # the field name in the JSON report
    family: str  # "attention" | "router"
    label: str  # short name for tables and messages
    spec: SeriesSpec
    alone: str  # "alert" | "warn"
    read: Callable[[LayerResult], float | None]
    # Is the level comparable between two runs of one recipe (a reference run)?
    across_runs: bool = True
    # Is it a property of the update between two checkpoints (so its level
    # depends on how many steps apart they are), not of one checkpoint?
    per_update: bool = False


def _judged(name: str, min_scale: float, alone: str, follow_trend: bool = False, sequential: bool = True,
            across_runs: bool = True, per_update: bool = False) -> Monitor:
    """A monitor of the vocabulary with how it is judged; its alarm side and scale are the vocabulary's."""
    info = vocabulary.BY_NAME[name]
    spec = SeriesSpec(info.bad, min_scale, follow_trend=follow_trend, log=info.log, sequential=sequential)
    return Monitor(info.name, info.family, info.label, spec, alone, info.read, across_runs, per_update)


MONITORS: tuple[Monitor, ...] = (
    _judged("delta2_entropy_norm", 0.01, "alert", per_update=True),
    _judged("delta2_entropy_norm_min", 0.02, "warn", per_update=True),
    _judged("dwq_entropy_norm", 0.01, "warn", per_update=True),
    _judged("dwk_entropy_norm", 0.01, "warn", per_update=True),
    _judged("qk_logit_bound", 0.05, "alert", follow_trend=True),
    _judged("routing_entropy_norm", 0.01, "alert", follow_trend=True, across_runs=False),
    _judged("load_cv", 0.05, "warn", follow_trend=True, across_runs=False),
    _judged("cosine_similarity", 0.01, "warn", sequential=False, across_runs=False),
    _judged("epsilon", 0.02, "warn", follow_trend=True, across_runs=False),
)

BY_NAME = {m.name: m for m in MONITORS}
