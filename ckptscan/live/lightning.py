"""Live mode for PyTorch Lightning (extra: ckptscan[lightning]).

    trainer = L.Trainer(max_steps=10_000, callbacks=[ckptscan.live.LightningCallback(every=200)])

The metrics go to every logger of the trainer (TensorBoard, W&B, MLflow,
CSV …) at the monitored steps; the report is `ROOT/ckptscan/report.json`
(ROOT: the trainer's `default_root_dir`) unless `out` says otherwise.

The monitor scans in the background (`ckptscan.live.monitor`): an
interval's metrics are logged at the interval's own step once its scan
reports, and "save" / "stop" act at the step it reports (a step or more
later; the last interval's when training ends, where "save" still saves).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

try:
    import lightning.pytorch as pl
except ImportError:  # the standalone package
    import pytorch_lightning as pl

from ckptscan.live.monitor import Monitor, OnAlert


class LightningCallback(pl.Callback):
    """ckptscan's monitors every `every` optimizer steps of a Lightning run.

    `on_alert`: "log", "save" (`trainer.save_checkpoint` to
    `OUT/alert-step-{step}.ckpt`, on every rank, `step` the one the alert is
    acted on), "stop" (`trainer.should_stop`: training ends cleanly after
    that step), or a
    callable given each `ckptscan.live.Alert`. Other keyword arguments go to
    `ckptscan.live.Monitor` (probe, thresholds, options, config).
    """

    def __init__(self, every: int = 100, out: str | Path | None = None, on_alert: OnAlert = "log", **monitor: Any):
        self.every, self.out, self.on_alert, self.monitor_kwargs = every, out, on_alert, monitor
        self.monitor: Monitor | None = None
        self._logged: int | None = None  # the interval whose metrics went to the loggers last

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.monitor is None:
            out = self.out if self.out is not None else Path(trainer.default_root_dir) / "ckptscan"
            self.monitor = Monitor(pl_module, every=self.every, out=out, on_alert=self.on_alert,
                                   **self.monitor_kwargs)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        # global_step counts optimizer steps: with gradient accumulation several
        # batches end on one step, and the monitor takes only the first's snapshot.
        if self.monitor is not None:
            self.monitor.step(trainer.global_step)  # every batch: it acts on a scan that has reported since
            self._act(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # The last scan (`wait` agrees on its decisions across ranks), then the report file's last pairs.
        if self.monitor is not None:
            self.monitor.wait()
            self._act(trainer)
            self.monitor.close()

    def _act(self, trainer: pl.Trainer) -> None:
        monitor = self.monitor
        assert monitor is not None
        if monitor.latest and monitor.latest_step != self._logged and trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(dict(monitor.latest), step=monitor.latest_step)
            self._logged = monitor.latest_step
        if monitor.should_save:
            monitor.should_save = False
            trainer.save_checkpoint(str(monitor.out / f"alert-step-{trainer.global_step}.ckpt"))
        if monitor.should_stop:
            trainer.should_stop = True
