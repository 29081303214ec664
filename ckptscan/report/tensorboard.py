"""TensorBoard event files of a report, for people who watch runs there.

What is written, per pair of the report, at the pair's newer step:

- one scalar per (layer, monitor): tag `{monitor}/layer_{i}` (the registry's
  monitors, grouped by monitor so a chart section compares the layers);
- per family, the worst severity of its findings over the layers
  (`ckptscan/{family}_severity`: 0 ok, 1 info, 2 warn, 3 alert) and how many
  layers it flags at warn or above (`ckptscan/{family}_flagged_layers`);
  the pair's status (-1 not judged, else as the severities) and its mean
  training loss when known;
- the findings as Markdown text (`ckptscan/findings`), and the run's verdict
  at the newest step (`ckptscan/verdict`).

Scalars are float32 (TensorBoard's scalar plugin stores them so); a value
the report has as null is not written.

Re-running over a grown run appends only what is new: the event files that
ckptscan wrote into DIR (named `*.ckptscan`, so a training job's own event
files in the same directory are neither read nor touched) are read back with
TensorBoard's reader, and a point is written only when its step is newer than
the newest step already there for its tag. Existing files are never
rewritten (an event file is append-only by design); each run that has
something new adds one file. The newest step of each tag is also kept in
DIR/.ckptscan-newest.json with the names and sizes of the event files it
describes: a re-run reads that instead of every point back, and reads the
files again whenever they are not exactly those. So a step shows what the scan that first wrote
it said: should a later scan judge an old pair differently (the summary's
verdict can change as a run grows), the new verdict is at the newest step.
A tag that first appears later (say a probe is added) is written from its
first step, which TensorBoard accepts: files of format version 2 are never
purged for out-of-order steps (event_accumulator purges only on a restart
marker, which ckptscan never writes).

Needs the `tensorboard` package (`pip install 'ckptscan[tensorboard]'`).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptscan.system.atomic import write_atomic
from ckptscan.errors import CkptScanError
from ckptscan.monitors import registry
from ckptscan.report.destinations import require_package
from ckptscan.schema.results import NOT_JUDGED, PairResult, ScanReport, status_word, worst

EVENT_SUFFIX = ".ckptscan"
# Per tag the newest step written, and the event files (names, sizes) that says it of: a re-run
# reads this instead of every event point back (18 s at 2,000 pairs × 16 layers; bench/long_run.py).
INDEX = ".ckptscan-newest.json"
SEVERITY_LEVEL = {"ok": 0, "unchanged": 0, "info": 1, "warn": 2, "alert": 3}
# A pair no rule of its position could judge (warm-up, no baseline yet): below ok, never drawn as it.
STATUS_LEVEL = {**SEVERITY_LEVEL, NOT_JUDGED: -1}


@dataclass(frozen=True)
class Point:
    step: int
    tag: str
    value: float | str  # str: Markdown, written as a text summary
    description: str = ""


def require_tensorboard() -> None:
    """Before any long scan: --tensorboard needs the package (exit 2 with the fix)."""
    require_package("tensorboard", "--tensorboard", "tensorboard", "tensorboard")


def pair_step(index: int, pair: PairResult) -> int:
    """The pair's newer step; a pair whose checkpoints carry no step (two
    loose files given to diff) is placed at its position in the report."""
    return pair.to_step if pair.to_step is not None else index


def report_points(report: ScanReport) -> list[Point]:
    """Everything the event files show, in step order."""
    families = [f.name for f in registry.finding_specs()
                if f.always_listed or any(f.has(layer) for pair in report.pairs for layer in pair.layers)]
    points: list[Point] = []
    for index, pair in enumerate(report.pairs):
        step = pair_step(index, pair)
        for layer in pair.layers:
            for monitor in registry.monitors():
                value = monitor.read(layer)
                if value is not None and math.isfinite(value):
                    points.append(Point(step, f"{monitor.name}/layer_{layer.layer}", float(value),
                                        f"{monitor.label} ({monitor.family}) of layer {layer.layer}"))
        for family in families:
            found = [[f.severity for f in layer.findings if f.family == family] for layer in pair.layers]
            points.append(Point(step, f"ckptscan/{family}_severity", float(SEVERITY_LEVEL[worst(sum(found, []))]),
                                f"worst {family} finding over the layers: 0 ok, 1 info, 2 warn, 3 alert"))
            flagged = sum(worst(severities) in ("warn", "alert") for severities in found)
            points.append(Point(step, f"ckptscan/{family}_flagged_layers", float(flagged),
                                f"layers with a {family} finding at warn or above"))
        points.append(Point(step, "ckptscan/status", float(STATUS_LEVEL.get(pair.status, 0)),
                            "the pair's status: -1 not judged, 0 ok, 1 info, 2 warn, 3 alert"))
        if pair.loss is not None and math.isfinite(pair.loss):
            points.append(Point(step, "ckptscan/loss", float(pair.loss), "mean training loss over the pair's updates"))
        points.append(Point(step, "ckptscan/findings", _findings_text(pair)))
    if report.pairs:
        last = pair_step(len(report.pairs) - 1, report.pairs[-1])
        points.append(Point(last, "ckptscan/verdict", _verdict_text(report)))
    return points


def newest_steps(directory: Path) -> dict[str, int]:
    """Per tag, the newest step in the event files ckptscan wrote into
    `directory`: from the index (INDEX) when it describes exactly the event
    files there (their names and sizes), else read back from them all."""
    files = _event_files(directory)
    index = _read_index(directory)
    if index is not None and index["files"] == files:
        return index["newest"]
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    newest: dict[str, int] = {}
    for name in sorted(files):
        for event in EventFileLoader(str(directory / name)).Load():
            for value in event.summary.value:
                newest[value.tag] = max(newest.get(value.tag, event.step), event.step)
    return newest


def _event_files(directory: Path) -> dict[str, int]:
    return {path.name: path.stat().st_size for path in directory.glob(f"*tfevents*{EVENT_SUFFIX}")}


def _read_index(directory: Path) -> dict[str, Any] | None:
    try:
        index = json.loads((directory / INDEX).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(index, dict) or not isinstance(index.get("files"), dict) \
            or not isinstance(index.get("newest"), dict):
        return None
    return index


def _write_index(directory: Path, newest: dict[str, int]) -> None:
    """Best effort: without it the next run reads the event files back."""
    try:
        write_atomic(directory / INDEX, json.dumps({"files": _event_files(directory), "newest": newest},
                                                   sort_keys=True))
    except OSError:
        (directory / INDEX).unlink(missing_ok=True)


def write_tensorboard(report: ScanReport, directory: str | Path) -> tuple[int, int]:
    """Append the report's new points to event files in `directory`.
    Returns (steps written, steps that were already there)."""
    require_tensorboard()
    from tensorboard.compat.proto import event_pb2
    from tensorboard.plugins.scalar.summary_v2 import scalar_pb
    from tensorboard.plugins.text.summary_v2 import text_pb
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        newest = newest_steps(directory)
        points = report_points(report)
        new = [p for p in points if p.step > newest.get(p.tag, -1)]
        steps = {p.step for p in points}
        new_steps = {p.step for p in new}
        if new:
            writer = EventFileWriter(str(directory), filename_suffix=EVENT_SUFFIX)
            try:
                wall_time = time.time()
                for point in sorted(new, key=lambda p: p.step):  # stable: tags keep their order within a step
                    summary = (text_pb(point.tag, point.value) if isinstance(point.value, str)
                               else scalar_pb(point.tag, point.value, point.description or None))
                    writer.add_event(event_pb2.Event(step=point.step, wall_time=wall_time, summary=summary))
            finally:
                writer.close()
            for point in new:
                newest[point.tag] = max(newest.get(point.tag, point.step), point.step)
            _write_index(directory, newest)
    except OSError as e:
        raise CkptScanError(f"cannot write the TensorBoard events: {e.strerror or e}", path=directory) from None
    return len(new_steps), len(steps - new_steps)




def _findings_text(pair: PairResult) -> str:
    lines = [f"- layer {layer.layer} · {f.family} · **{f.severity}** · `{f.monitor}`: {f.message}"
             for layer in pair.layers for f in layer.findings]
    return "\n".join(lines) if lines else "no findings"


def _verdict_text(report: ScanReport) -> str:
    s = report.summary
    text = f"**{status_word(s.status)}**: {s.message}"
    if s.rollback_candidate is not None:
        text += f"\n\nrollback candidate: `{s.rollback_candidate.path}` (step {s.rollback_candidate.step})"
    return text
