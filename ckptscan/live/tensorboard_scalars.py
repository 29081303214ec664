"""Live mode's TensorBoard destination (`Monitor(..., tensorboard=DIR or a
SummaryWriter)`): each judged interval's metrics as scalars at its step, on
the destinations' protocol (`report.destinations`), written from the scan's
thread."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckptscan.monitors import registry
from ckptscan.report.destinations import Delivery, Destination
from ckptscan.schema.results import NOT_JUDGED, SEVERITIES

if TYPE_CHECKING:
    from ckptscan.schema.results import PairResult, ScanReport

# Prefix of the metric names handed to the trainer's loggers and TensorBoard.
METRIC_PREFIX = "ckptscan"


class TensorBoardScalars(Destination):
    """The newest interval's metrics (`interval_metrics`) added as scalars at
    its newer step, then flushed. `target`: a log directory, opened as a
    `SummaryWriter` at the first write, or a writer of the caller's (never
    closed here: the caller owns it)."""

    flag = "tensorboard"

    def __init__(self, target: str | Path | Any) -> None:
        self.writer: Any = target  # a directory until first written to, then its SummaryWriter

    def write(self, delivery: Delivery[ScanReport]) -> None:
        newest = delivery.report.pairs[-1]
        if newest.to_step is None:  # a live pair always has its steps
            return
        if isinstance(self.writer, (str, Path)):
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.writer))
        for name, value in interval_metrics(newest).items():
            self.writer.add_scalar(name, value, newest.to_step)
        self.writer.flush()


def interval_metrics(pair: PairResult) -> dict[str, float]:
    """One interval's judged monitors, flat, for a trainer's loggers:
    `ckptscan/L{layer}/{monitor}`, and `ckptscan/status` (-1 not judged, 0 ok … 3 alert)."""
    found: dict[str, float] = {}
    for layer in pair.layers:
        for monitor in registry.monitors():
            value = monitor.read(layer)
            if value is not None:
                found[f"{METRIC_PREFIX}/L{layer.layer}/{monitor.name}"] = float(value)
    found[f"{METRIC_PREFIX}/status"] = float(-1 if pair.status == NOT_JUDGED else
                                             SEVERITIES.index(pair.status) if pair.status in SEVERITIES else 0)
    return found
