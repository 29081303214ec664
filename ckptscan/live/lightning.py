"""Live mode for PyTorch Lightning (extra: ckptscan[lightning]).

    trainer = L.Trainer(max_steps=10_000, callbacks=[ckptscan.live.LightningCallback(every=200)])

The metrics go to every logger of the trainer (TensorBoard, W&B, MLflow,
CSV …) at the monitored steps; the report is `ROOT/ckptscan/report.json`
(ROOT: the trainer's `default_root_dir`) unless `out` says otherwise.
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
    `OUT/alert-step-{step}.ckpt`, on every rank), "stop"
    (`trainer.should_stop`: training ends cleanly after this step), or a
    callable given each `ckptscan.live.Alert`. Other keyword arguments go to
    `ckptscan.live.Monitor` (probe, thresholds, options, config).
    """

    def __init__(self, every: int = 100, out: str | Path | None = None, on_alert: OnAlert = "log", **monitor: Any):
        self.every, self.out, self.on_alert, self.monitor_kwargs = every, out, on_alert, monitor
        self.monitor: Monitor | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.monitor is None:
            out = self.out if self.out is not None else Path(trainer.default_root_dir) / "ckptscan"
            self.monitor = Monitor(pl_module, every=self.every, out=out, on_alert=self.on_alert,
                                   **self.monitor_kwargs)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        # global_step counts optimizer steps: with gradient accumulation several
        # batches end on one step, and `due` lets only the first through.
        monitor, step = self.monitor, trainer.global_step
        if monitor is None or not monitor.due(step):
            return
        monitor.step(step)
        if monitor.latest and trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(dict(monitor.latest), step=step)
        if monitor.should_save:
            monitor.should_save = False
            trainer.save_checkpoint(str(monitor.out / f"alert-step-{step}.ckpt"))
        if monitor.should_stop:
            trainer.should_stop = True

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # The report file is written at spaced steps; its last pairs now.
        if self.monitor is not None:
            self.monitor.close()
