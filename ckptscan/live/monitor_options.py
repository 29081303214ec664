"""What a `Monitor` is asked to do, as one value (`MonitorOptions`), and what
it hands an `on_alert` callable (`Alert`, from `live/alerts.py`).

    options = MonitorOptions(every=200, out="runs/main/ckptscan", on_alert="stop", tensorboard="runs/main/tb")
    monitor = Monitor(model, options)

The same fields are `Monitor`'s keyword arguments, which it still takes
(`Monitor(model, every=200, out=...)`, the first four positionally too): both
make the same monitor. A frozen value: one set of options can start several
monitors, and `dataclasses.replace` makes a variant of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Union

from ckptscan.document.plain import PER_HEAD
from ckptscan.errors import CkptScanError
from ckptscan.live.alerts import Alert

if TYPE_CHECKING:
    from ckptscan.detection.rules import Thresholds
    from ckptscan.inputs.probe import Probe
    from ckptscan.scan import ScanOptions

ON_ALERT = ("log", "save", "stop")


OnAlert = Union[str, Callable[[Alert], Any]]


@dataclass(frozen=True)
class MonitorOptions:
    """A `Monitor`'s options (each described in `Monitor`'s docstring):
    `every` optimizer steps a snapshot; `probe` a probe file, a `Probe` or a
    batch to capture one from; `out` the folder of the report file; `on_alert`
    "log", "save", "stop" or a callable; `config` the model's config.json as a
    dict; `options` the `ScanOptions`; `thresholds`; `tensorboard` a log
    directory or a `SummaryWriter`; `save` called by on_alert="save";
    `per_head` which intervals keep their per-head results; `background`
    False: scan inside `step()`. Checked when made (a bad value: `CkptScanError`)."""

    every: int = 100
    probe: str | Path | Probe | Any | None = None
    out: str | Path = "ckptscan-live"
    on_alert: OnAlert = "log"
    config: Mapping[str, Any] | None = None
    options: ScanOptions | None = None
    thresholds: Thresholds | None = None
    tensorboard: str | Path | Any | None = None
    save: Callable[[int], None] | None = None
    per_head: str = "all"
    background: bool = True

    def __post_init__(self) -> None:
        if self.every < 1:
            raise CkptScanError(f"every must be ≥ 1, not {self.every}")
        if self.per_head not in PER_HEAD:
            raise CkptScanError(f"per_head must be one of {list(PER_HEAD)}, not {self.per_head!r}")
        if not callable(self.on_alert) and self.on_alert not in ON_ALERT:
            raise CkptScanError(f"on_alert must be one of {list(ON_ALERT)} or a callable, not {self.on_alert!r}")
