"""Pinned held-out results: what a release said of each run, so that a change
of rules or calibration shows which runs it moved.

    python -m experiments.evaluate --pin experiments/pinned/NAME.json   # record
    python -m experiments.evaluate                                      # compare

A pin file holds, per run, the first own-family alarm, the first false alarm
(an alert at or before onset; any alert on a healthy run), the family named
first and the lead; with the commit and the options that produced it. A
comparison lists every run whose figures moved and says which moves are for
the worse: an alarm later or lost, a false alarm gained, the primary family
changed away from the right one. Summaries hide such moves — a median can
stay put while one run alerts 500 steps later — so each run is compared.

A move for the worse needs a stated reason in the commit that causes it.

A pin also records a digest of each run's training log: the corpus is
regenerated, not stored, and training is bit-reproducible only on one
machine (another CPU's floating point takes a high-LR run elsewhere). A run
trained differently from the pinned one moved with its data, not with the
rules, so its moves are listed apart and never counted as worse.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
from pathlib import Path
from typing import Iterable

PINNED = Path(__file__).resolve().parent / "pinned"


@dataclasses.dataclass(frozen=True)
class Held:
    """One run's verdict as a release gave it."""
    alarm: int | None  # first own-family alarm after onset (the first alert, where no family is the truth)
    false: int | None  # first alarm at or before onset, or any alarm on a healthy run
    family: str | None  # the family named first (primary, else first alerting)
    lead: float | None  # fraction of the onset→divergence window; None when the run did not diverge
    right_family: bool = True  # the family named is the right one (or nothing is named)
    trained: str | None = None  # digest of the training log judged (training_digest); None: not recorded


@dataclasses.dataclass(frozen=True)
class Move:
    run: str
    what: str  # "earlier", "later", "gained alarm", "lost alarm", "gained false alarm", "lost false alarm", "family"
    was: object
    now: object
    worse: bool
    retrained: bool = False  # the run was trained differently from the pinned one: the data moved

    def __str__(self) -> str:
        if self.retrained:
            mark = "trained differently: the data moved, not the rules"
        else:
            mark = "worse" if self.worse else "better" if self.what != "family" else "changed"
        return f"{self.run}: {self.what} ({self.was} → {self.now}) [{mark}]"


def training_digest(corpus: Path, run: dict) -> str | None:
    """The digest of the training log behind `run`'s verdict (a view's is its source run's);
    None when the log is missing."""
    log = corpus / (run.get("view_of") or run["name"]) / "train_log.jsonl"
    try:
        return hashlib.sha256(log.read_bytes()).hexdigest()[:16]
    except OSError:
        return None


def with_training(held: dict[str, Held], corpus: Path, runs: Iterable[dict]) -> dict[str, Held]:
    """`held` with each run's training digest recorded."""
    by_name = {r["name"]: r for r in runs}
    return {name: dataclasses.replace(h, trained=training_digest(corpus, by_name[name])) for name, h in held.items()}


def trained_differently(was: Held, now: Held) -> bool:
    """Both verdicts record their training log, and the logs differ."""
    return was.trained is not None and now.trained is not None and was.trained != now.trained


def moves(pinned: dict[str, Held], current: dict[str, Held]) -> list[Move]:
    """Every change from `pinned` to `current`, for the runs both hold."""
    out: list[Move] = []
    for run in sorted(pinned.keys() & current.keys()):
        was, now = pinned[run], current[run]
        start = len(out)
        if was.alarm is None and now.alarm is not None:
            out.append(Move(run, "gained alarm", None, now.alarm, False))
        elif was.alarm is not None and now.alarm is None:
            out.append(Move(run, "lost alarm", was.alarm, None, True))
        elif was.alarm is not None and now.alarm is not None and was.alarm != now.alarm:
            later = now.alarm > was.alarm
            out.append(Move(run, "later" if later else "earlier", was.alarm, now.alarm, later))
        if was.false is None and now.false is not None:
            out.append(Move(run, "gained false alarm", None, now.false, True))
        elif was.false is not None and now.false is None:
            out.append(Move(run, "lost false alarm", was.false, None, False))
        if was.family != now.family:
            out.append(Move(run, "family", was.family, now.family, was.right_family and not now.right_family))
        if trained_differently(was, now):
            out[start:] = [dataclasses.replace(m, worse=False, retrained=True) for m in out[start:]]
    return out


def save(path: Path, held: dict[str, Held], options: dict) -> None:
    """Write a pin file: the runs' verdicts, the options and the commit that gave them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"commit": _commit(), "options": options,
            "runs": {run: dataclasses.asdict(h) for run, h in sorted(held.items())}}
    path.write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")


def load(path: Path) -> tuple[dict, dict[str, Held]]:
    body = json.loads(path.read_text())
    return body, {run: Held(**fields) for run, fields in body["runs"].items()}


def report(path: Path, current: dict[str, Held], options: dict) -> int:
    """Print the moves against the pin at `path`; return how many are for the worse."""
    body, pinned = load(path)
    if body["options"] != options:
        print(f"\n{path.name}: pinned with other options ({body['options']}), not compared")
        return 0
    found = moves(pinned, current)
    missing = sorted(pinned.keys() - current.keys())
    common = pinned.keys() & current.keys()
    retrained = [run for run in common if trained_differently(pinned[run], current[run])]
    print(f"\nagainst the results pinned at {body['commit'][:10]} ({path.name}): "
          f"{len(found)} move(s) over {len(common)} run(s)"
          + (f"; {len(missing)} pinned run(s) not evaluated now" if missing else ""))
    if retrained:
        print(f"  {len(retrained)} of them trained differently from the pinned corpus (their training logs "
              "differ): their moves are the data's, not the rules'")
    for move in found:
        print(f"  {move}")
    worse = sum(m.worse for m in found)
    if worse:
        print(f"{worse} move(s) for the worse: the commit that causes them must say why")
    return worse


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
