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

The monitor scans in the background (`ckptscan.live.monitor`): an
interval's metrics reach `trainer.log` at the step its scan reports (a step
or more after the interval's own step, which `ckptscan/step` names; the
last interval's when training ends), and "save" / "stop" act at that step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import transformers

from ckptscan.live.monitor import METRIC_PREFIX, Monitor, OnAlert


class TrainerCallback(transformers.TrainerCallback):
    """ckptscan's monitors every `every` optimizer steps of a `Trainer`.

    `out`: where `report.json` (and a captured probe) go; default
    `OUTPUT_DIR/ckptscan`. `on_alert`: "log", "save" (the Trainer saves a
    checkpoint at the step the alert is acted on), "stop" (training stops
    cleanly after that step), or a callable given each `ckptscan.live.Alert`. Other
    keyword arguments go to `ckptscan.live.Monitor` (probe, thresholds,
    options, config).
    """

    def __init__(self, every: int = 100, out: str | Path | None = None, on_alert: OnAlert = "log",
                 **monitor: Any):
        self.every, self.out, self.on_alert, self.monitor_kwargs = every, out, on_alert, monitor
        self.monitor: Monitor | None = None
        self._trainer: transformers.Trainer | None = None
        self._logged: int | None = None  # the interval whose metrics went to trainer.log last
        self._lr: float | None = None  # the rate of the update this step made

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

    def on_optimizer_step(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
        # The rate this update used, as the Trainer takes it for its log (after the
        # optimizer's step, before the scheduler's).
        if lr_scheduler is not None and hasattr(lr_scheduler, "get_last_lr"):
            self._lr = float(lr_scheduler.get_last_lr()[0])
        elif optimizer is not None:
            self._lr = float(optimizer.param_groups[0]["lr"])
        return control

    def on_step_end(self, args, state, control, **kwargs):
        monitor = self.monitor
        if monitor is None:
            return control
        if control.should_log and self._lr is not None:  # the Trainer logs this step's rate right after
            monitor.logged_lr(state.global_step, self._lr)
        monitor.step(state.global_step)  # every step: it acts on a scan that has reported since
        self._log(state, control)
        if monitor.should_save:
            control.should_save = True  # the Trainer saves right after this step
            monitor.should_save = False
        if monitor.should_stop:
            control.should_training_stop = True
        return control

    def on_train_end(self, args, state, control, **kwargs):
        # The last scan, and the report file's last pairs (it is written at spaced steps).
        if self.monitor is not None:
            self.monitor.close()
            self._log(state, control)
        return control

    def _log(self, state, control) -> None:
        monitor = self.monitor
        if self._trainer is None or monitor is None or not monitor.latest or monitor.latest_step == self._logged \
                or not state.is_world_process_zero:
            return
        # trainer.log ends the step's logging (the callback handler's on_log clears should_log):
        # the Trainer's own loss and rate must still be logged at this step.
        should_log = control.should_log
        self._trainer.log({**monitor.latest, f"{METRIC_PREFIX}/step": monitor.latest_step})
        control.should_log = should_log
        self._logged = monitor.latest_step
