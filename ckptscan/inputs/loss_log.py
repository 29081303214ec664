"""Training loss logs: when did the loss diverge, and how early did ckptscan see it?

A log is JSON Lines (one object per line with "step" and "loss", optionally
"lr") or CSV (a header row naming "step" and "loss" columns, optionally
"lr"). A loss that is null, empty, NaN or infinite is non-finite.

Loss divergence (one definition everywhere): let S be the loss smoothed by a
trailing mean over `window` logged steps, a non-finite loss counting as +inf
(so one NaN keeps S infinite for `window` entries), and m(t) the running
minimum of S up to t. The divergence step is the first logged step t with

    S(s) > m(t) + margin   for every logged step s ≥ t,

i.e. the smoothed loss has risen `margin` nats above the best it had
reached and never comes back. Only steps followed by at least `window` more
logged steps qualify, so the last steps of a log cannot "stay above" by
default. A spike that recovers is not a divergence; a run with no such step
has not diverged (None). The experiments' trainer uses the same definition
(window 50, margin 0.5 nats).
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptscan.errors import CkptScanError
from ckptscan.schema.results import PairResult
from ckptscan.storage import RemotePath, as_path

# The loss log a run directory may carry, read without being named (`pipeline.run`).
DEFAULT_LOSS_LOG = "train_log.jsonl"


@dataclass
class LossLog:
    path: Path | RemotePath
    steps: list[int]  # increasing
    losses: list[float]  # nan where the logged loss was non-finite
    lrs: list[float] | None = None  # present when every record carried one

    def pair_loss(self, from_step: int | None, to_step: int | None) -> float | None:
        """Mean loss of the updates between two checkpoints: logged steps
        from_step … to_step − 1 (step s is the update that turns checkpoint s
        into checkpoint s + 1). None when none was logged or one was non-finite."""
        if from_step is None or to_step is None:
            return None
        values = [v for s, v in zip(self.steps, self.losses) if from_step <= s < to_step]
        if not values or any(math.isnan(v) for v in values):
            return None
        return sum(values) / len(values)

    def pair_lr(self, from_step: int | None, to_step: int | None) -> float | None:
        """Mean learning rate of the updates between two checkpoints (as
        `pair_loss`); None without an `lr` column or a logged step there."""
        if from_step is None or to_step is None or self.lrs is None:
            return None
        values = [lr for s, lr in zip(self.steps, self.lrs) if from_step <= s < to_step]
        return sum(values) / len(values) if values else None

    def annotate(self, pair: PairResult) -> None:
        """A pair's loss and learning rate from the log."""
        pair.loss = self.pair_loss(pair.from_step, pair.to_step)
        pair.lr = self.pair_lr(pair.from_step, pair.to_step)

    def warmup_end(self) -> int | None:
        """The step at which the learning rate's initial ramp ends: where it
        first reaches the largest value of its leading non-decreasing stretch
        (a ramp may step, flat between its rises). Not where the LR is largest
        over the run: a run whose cosine decay was resumed at 10× its LR would
        otherwise be "warming up" until the resume, and judged only against
        what came after it. (A constant schedule raised at a resume is still
        read as one ramp.)"""
        if not self.lrs:
            return None
        end = next((i for i in range(len(self.lrs) - 1) if self.lrs[i + 1] < self.lrs[i]), len(self.lrs) - 1)
        peak = max(self.lrs[:end + 1])
        return next(s for s, lr in zip(self.steps, self.lrs) if lr >= peak)


def read_loss_log(path: str | Path | RemotePath) -> LossLog:
    """A local file (`~` and $VARs expanded) or a URL (read whole: a log is small)."""
    path = as_path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise CkptScanError(f"cannot read the loss log: {e.strerror or e}", path=path) from None
    except UnicodeDecodeError:
        raise CkptScanError("the loss log is not UTF-8 text (expected JSON Lines or CSV)", path=path) from None
    records = _csv_records(text, path) if path.suffix.lower() == ".csv" else _jsonl_records(text, path)
    if not records:
        raise CkptScanError("the loss log has no records", path=path)
    records.sort(key=lambda r: r[0])
    steps = [r[0] for r in records]
    if len(set(steps)) != len(steps):
        duplicate = next(s for s, t in zip(steps, steps[1:]) if s == t)
        raise CkptScanError(f"step {duplicate} is logged twice (a resumed run? keep one record per step)", path=path)
    lrs = [r[2] for r in records if r[2] is not None]
    return LossLog(path, steps, [r[1] for r in records], lrs if len(lrs) == len(records) else None)


def divergence_step(log: LossLog, window: int = 50, margin: float = 0.5) -> int | None:
    """The loss-divergence step of the module docstring, or None."""
    smoothed, recent = [], []
    for loss in log.losses:
        recent.append(math.inf if math.isnan(loss) else loss)
        if len(recent) > window:
            recent.pop(0)
        smoothed.append(sum(recent) / len(recent))
    # suffix_min[i] = min(smoothed[i:]): "stays above from t on" is one comparison.
    suffix_min = smoothed[:]
    for i in range(len(smoothed) - 2, -1, -1):
        suffix_min[i] = min(smoothed[i], suffix_min[i + 1])
    running_min = math.inf
    qualified = len(log.steps) - window
    for step, s, later in zip(log.steps[:max(qualified, 0)], smoothed, suffix_min):
        running_min = min(running_min, s)
        if later > running_min + margin:
            return step
    return None


def _jsonl_records(text: str, path: Path | RemotePath) -> list[tuple[int, float, float | None]]:
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise CkptScanError(f"line {number}: not JSON ({e.msg}); expected one object per line", path=path) from None
        if not isinstance(obj, dict):
            raise CkptScanError(f"line {number}: expected an object with 'step' and 'loss'", path=path)
        records.append(_record(obj, f"line {number}", path))
    return records


def _csv_records(text: str, path: Path | RemotePath) -> list[tuple[int, float, float | None]]:
    reader = csv.DictReader(text.splitlines())
    if not reader.fieldnames or not {"step", "loss"} <= {f.strip() for f in reader.fieldnames}:
        raise CkptScanError(f"the CSV header {reader.fieldnames} lacks 'step' and 'loss' columns", path=path)
    return [_record({k.strip(): v for k, v in row.items() if k is not None}, f"row {number}", path)
            for number, row in enumerate(reader, 2)]


def _record(obj: dict, where: str, path: Path | RemotePath) -> tuple[int, float, float | None]:
    if "step" not in obj or "loss" not in obj:
        raise CkptScanError(f"{where}: needs 'step' and 'loss'", path=path)
    try:
        step = int(obj["step"])
    except (TypeError, ValueError):
        raise CkptScanError(f"{where}: step {obj['step']!r} is not an integer", path=path) from None
    return step, _number(obj["loss"], where, "loss", path), _optional(obj.get("lr"), where, path)


def _number(value: Any, where: str, name: str, path: Path | RemotePath) -> float:  # any JSON or CSV value
    if value is None or value == "":
        return math.nan
    try:
        number = float(value)  # also parses "nan", "inf" from CSV
    except (TypeError, ValueError):
        raise CkptScanError(f"{where}: {name} {value!r} is not a number", path=path) from None
    return number if math.isfinite(number) else math.nan


def _optional(value: object, where: str, path: Path | RemotePath) -> float | None:
    if value is None or value == "":
        return None
    number = _number(value, where, "lr", path)
    return None if math.isnan(number) else number
