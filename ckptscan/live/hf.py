"""Live mode for the Hugging Face `transformers.Trainer` (extra: ckptscan[hf]).

    callback = ckptscan.live.TrainerCallback(every=200, out="runs/main/ckptscan")
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    callback.attach(trainer)   # optional: the metrics also go to trainer.log (TensorBoard, W&B, MLflow …)
    trainer.train()

With `every` equal to `save_steps`, the report equals `ckptscan trend` on
the checkpoints the Trainer saves. Without `attach`, the report, the alerts
and the on_alert actions work the same; only the trainer's loggers do not
see the metrics (a callback has no handle on the trainer, and the Trainer
calls its logging integrations before user callbacks).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import transformers

from ckptscan.live.monitor import Monitor, OnAlert


class TrainerCallback(transformers.TrainerCallback):
    """ckptscan's monitors every `every` optimizer steps of a `Trainer`.

    `out`: where `report.json` (and a captured probe) go; default
    `OUTPUT_DIR/ckptscan`. `on_alert`: "log", "save" (the Trainer saves a
    checkpoint at the alerting step), "stop" (training stops cleanly after
    this step), or a callable given each `ckptscan.live.Alert`. Other
    keyword arguments go to `ckptscan.live.Monitor` (probe, thresholds,
    options, config).
    """

    def __init__(self, every: int = 100, out: str | Path | None = None, on_alert: OnAlert = "log",
                 **monitor: Any):
        self.every, self.out, self.on_alert, self.monitor_kwargs = every, out, on_alert, monitor
        self.monitor: Monitor | None = None
        self._trainer: transformers.Trainer | None = None

    def attach(self, trainer: transformers.Trainer) -> TrainerCallback:
        """Send the metrics through `trainer.log` too, so every logging
        integration of the trainer records them next to the loss."""
        self._trainer = trainer
        if self not in trainer.callback_handler.callbacks:
            trainer.add_callback(self)
        return self

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.monitor is None:
            out = self.out if self.out is not None else Path(args.output_dir) / "ckptscan"
            self.monitor = Monitor(model, every=self.every, out=out, on_alert=self.on_alert, **self.monitor_kwargs)

    def on_step_end(self, args, state, control, **kwargs):
        monitor = self.monitor
        if monitor is None or not monitor.due(state.global_step):
            return control
        monitor.step(state.global_step)
        if self._trainer is not None and monitor.latest and state.is_world_process_zero:
            self._trainer.log(dict(monitor.latest))
        if monitor.should_save:
            control.should_save = True  # the Trainer saves right after this step
            monitor.should_save = False
        if monitor.should_stop:
            control.should_training_stop = True
        return control

    def on_train_end(self, args, state, control, **kwargs):
        # The report file is written at spaced steps; its last pairs now.
        if self.monitor is not None:
            self.monitor.close()
        return control
