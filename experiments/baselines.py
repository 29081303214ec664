"""The detectors users already have, computed from a run's train_log.jsonl.

Both are the spike detectors training frameworks ship: a z-score of a
smoothed signal against its own recent history.

- loss spike: m(t) = mean loss over the last `smooth` logged steps; z(t) =
  (m(t) - mean(H)) / std(H), H = the `history` values of m before the
  smoothing window (so the spike is not part of its own baseline).
- grad-norm spike: the same on log(grad_norm) (a norm is scale-dependent,
  and spikes are multiplicative).

A non-finite logged value is an immediate alarm (a NaN loss is not subtle).
An alarm is the first logged step with z ≥ threshold, after `start` steps.
The thresholds are not chosen here: experiments/calibrate.py sets them from
the healthy calibration runs to the same false-alarm rate as ckptscan's.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SpikeDetector:
    name: str
    field: str  # the train_log.jsonl key
    log: bool  # judge log(value)
    smooth: int = 10
    history: int = 200
    start: int = 100  # the LR warm-up: no alarm before

    def scores(self, steps: list[int], values: list[float | None]) -> list[tuple[int, float]]:
        """(step, z) for every step with a full history; z is +inf at a non-finite value."""
        judged = [_judged(v, self.log) for v in values]
        smoothed: list[float] = []
        out = []
        for i, step in enumerate(steps):
            window = judged[max(0, i - self.smooth + 1): i + 1]
            smoothed.append(sum(window) / len(window))
            if any(math.isinf(v) for v in window) and step >= self.start:
                out.append((step, math.inf))
                continue
            lo = i - self.smooth - self.history + 1
            if lo < 0 or step < self.start:
                continue
            past = smoothed[lo: i - self.smooth + 1]
            spread = statistics.pstdev(past)
            centre = sum(past) / len(past)
            out.append((step, (smoothed[-1] - centre) / spread if spread > 0 else 0.0))
        return out

    def first_alarm(self, steps: list[int], values: list[float | None], threshold: float,
                    after: int | None = None) -> int | None:
        """First step with z ≥ threshold (and > `after`, when given)."""
        for step, z in self.scores(steps, values):
            if z >= threshold and (after is None or step > after):
                return step
        return None


def _judged(value: float | None, log: bool) -> float:
    if value is None or not math.isfinite(value) or (log and value <= 0):
        return math.inf
    return math.log(value) if log else value


LOSS_SPIKE = SpikeDetector("loss_spike", "loss", log=False)
GRAD_SPIKE = SpikeDetector("grad_spike", "grad_norm", log=True)
BASELINES = (LOSS_SPIKE, GRAD_SPIKE)


def read_log(run_dir: Path) -> dict[str, list]:
    """{"step": [...], "loss": [...], "grad_norm": [...]} from RUN/train_log.jsonl."""
    columns: dict[str, list] = {"step": [], "loss": [], "grad_norm": []}
    with open(run_dir / "train_log.jsonl") as fh:
        for line in fh:
            record = json.loads(line)
            for key in columns:
                columns[key].append(record.get(key))
    return columns
