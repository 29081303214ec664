"""Live mode: the offline monitors inside a training loop, every N steps.

    monitor = ckptscan.live.Monitor(model, every=200, out="runs/main/ckptscan")
    for step in range(steps):
        loss.backward(); optimizer.step(); optimizer.zero_grad()
        monitor.step(step + 1)          # the step count after this update
        if monitor.should_stop:
            break

Every `every` steps the monitored tensors (q/k projections, routers; found
by the same layout resolvers as a checkpoint's, from the model's own
state_dict names) are copied on the model's device. Each copy is paired
with the previous one and scanned by the same core as `ckptscan diff`
(`scan_layers`); the growing series of pairs is judged by the same
judge as `ckptscan trend`, one new pair at a time from the state the last
one left (`SeriesJudge`: the cost per step does not grow with the run), and
the report is written (atomically) as `OUT/report.json` in the `trend
--json` schema. A live run with checkpoints saved at the same steps
therefore gives the same numbers and the same verdict as `ckptscan trend`
on those checkpoints.

The report file holds every pair, so writing it costs O(pairs): it is
written at every step for the first REPORT_SPACING × 2 pairs, then once the
pairs not yet in it are 1/REPORT_SPACING of those that are (so writing costs
a bounded amount per step, and the file is at most ~3% of the run behind),
and always when the verdict changes or the newest interval alerts. `close()`
(at the end of training) writes what is left: the final file is the report.

The series rules judge each point from earlier points only, so a pair's
verdict does not change as the run grows. One exception, as in `trend`: a
series of a single pair is judged like `diff` (the cross-layer rule), while
in a longer series the first pairs are warm-up. The first interval therefore
acts (`on_alert`) only on non-finite values, the verdict it keeps later.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Union

import torch

from ckptscan.pipeline.metrics import Metrics
from ckptscan.pipeline.config import load_config
from ckptscan.detection.judge import SeriesJudge
from ckptscan.detection.rules import Thresholds
from ckptscan.errors import CkptScanError
from ckptscan.live.report_file import ReportFile
from ckptscan.live.snapshot import ModelView, model_config
from ckptscan.inputs.loss_log import LossLog
from ckptscan.monitors.update_family import fill_update_per_lr
from ckptscan.monitors import registry
from ckptscan.system.paths import expand_path
from ckptscan.inputs.probe import Probe, capture_probe, load_probe
from ckptscan.readers import Checkpoint
from ckptscan.report.json import PER_HEAD, keeps_heads
from ckptscan.schema.results import NOT_JUDGED, SEVERITIES, CheckpointRef, Finding, PairResult, ScanReport
from ckptscan.scan import ScanOptions, scan_layers

log = logging.getLogger("ckptscan.live")

ON_ALERT = ("log", "save", "stop")
REPORT_FILE = "report.json"
# The report file is rewritten once the pairs not in it are 1/REPORT_SPACING of those that are (module docstring).
REPORT_SPACING = 32
PROBE_FILE = "probe.safetensors"
# Prefix of the metric names handed to the trainer's loggers and TensorBoard.
METRIC_PREFIX = "ckptscan"
# Live mode snapshots the parameters only; the optimizer family reads a saved
# optimizer state, which a snapshot does not hold.
LIVE_OPTIMIZER_NOT_READ = "not read: live mode snapshots the parameters, not the optimizer"


@dataclass(frozen=True)
class Alert:
    """One alert finding at a monitored step: what a user `on_alert` callable receives."""

    step: int  # the newer step of the interval it was raised on
    layer: int
    finding: Finding


OnAlert = Union[str, Callable[[Alert], Any]]


class Monitor:
    """ckptscan's monitors on a live model, every `every` optimizer steps.

    `probe`: a probe file (router inputs, see `ckptscan.inputs.probe`), or a batch
    for the model (a tensor, a tuple, or a mapping of keyword arguments): it
    is run once, at the first monitored step, with no grad, in eval mode,
    with the RNG state restored, to capture the router inputs into
    `OUT/probe.safetensors`; every later step routes those same inputs, as
    `trend` does with a probe file (so routing changes come from the
    weights alone, and `trend --probe OUT/probe.safetensors` on saved
    checkpoints gives the same numbers).

    `on_alert`: "log" (a warning on the `ckptscan.live` logger), "save"
    (set `should_save`, and call `save(step)` when given; under
    torch.distributed act on `should_save`, which every rank sees), "stop"
    (set `should_stop`), or a callable given each `Alert` (on rank 0).
    `config`: the model's config.json as a dict (default: the model's
    `config`, e.g. a Hugging Face `PretrainedConfig`). `thresholds`:
    default, the nearest ckptscan.toml / pyproject.toml's, as `trend` uses.
    `tensorboard`: a log directory or a `SummaryWriter` for the metrics.
    `per_head`: which intervals keep their per-head results, in the report
    file and in memory, as `trend --per-head`: "all" (the default, the
    report `trend --json` writes), "flagged" (layers at warn or alert) or
    "newest" (the newest interval). Over a long run the per-head results are
    most of what live mode holds: about 1 MB an interval at 1B shape.

    Under torch.distributed every rank calls `step`; sharded (DTensor,
    FSDP2) monitored tensors are gathered to rank 0, which alone computes,
    judges and writes; `should_stop` / `should_save` are broadcast so that
    every rank acts alike.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        every: int = 100,
        probe: str | Path | Probe | Any | None = None,
        out: str | Path = "ckptscan-live",
        on_alert: OnAlert = "log",
        *,
        config: Mapping[str, Any] | None = None,
        options: ScanOptions | None = None,
        thresholds: Thresholds | None = None,
        tensorboard: str | Path | Any | None = None,
        save: Callable[[int], None] | None = None,
        per_head: str = "all",
    ):
        if every < 1:
            raise CkptScanError(f"every must be ≥ 1, not {every}")
        if per_head not in PER_HEAD:
            raise CkptScanError(f"per_head must be one of {list(PER_HEAD)}, not {per_head!r}")
        if not callable(on_alert) and on_alert not in ON_ALERT:
            raise CkptScanError(f"on_alert must be one of {list(ON_ALERT)} or a callable, not {on_alert!r}")
        self.model, self.every, self.out, self.on_alert, self.save = model, every, expand_path(out), on_alert, save
        self.rank, self.world = _rank_world()
        options = options or ScanOptions()
        self.view = ModelView(model, config if config is not None else model_config(model), options.overrides,
                              options.tensor_map, options.layers)
        if not self.view.monitored:
            raise CkptScanError("the layout resolver found no monitored tensor in this model")
        # The trainer owns the thread count: never change it inside its process.
        self.options = replace(options, threads=torch.get_num_threads(), workers=1,
                               device=_device_name(self.view.tensors[self.view.monitored[0]]))
        self.thresholds = thresholds or load_config(None, ()).thresholds
        self.probe: Probe | None = None
        self._probe_batch = None
        if isinstance(probe, Probe):
            self.probe = probe
        elif isinstance(probe, (str, Path)):
            self.probe = load_probe(probe)
        elif probe is not None:
            if self.world > 1:
                raise CkptScanError("a probe batch is captured on one process: under torch.distributed, capture "
                                    "a probe file first (ckptscan.inputs.probe.capture_probe) and pass its path")
            self._probe_batch = probe
        self._writer = tensorboard
        self.previous: Checkpoint | None = None  # only the last snapshot is kept
        self.checkpoints: list[CheckpointRef] = []
        self.pairs: list[PairResult] = []
        self.report: ScanReport | None = None
        self._judging = SeriesJudge(self.thresholds)  # the judge state, carried from step to step
        self.per_head = per_head
        self._file = ReportFile(self.out / REPORT_FILE, per_head)
        self._written: tuple[int, str] | None = None  # (pairs, verdict) of the report file
        self.latest: dict[str, float] = {}  # the newest interval's metrics, as logged
        self.should_stop = False
        self.should_save = False
        self.seconds: list[float] = []  # wall time of each monitored step (benchmarks)
        # The training loss (and LR) per update, when the loop records them: the
        # loss log `trend` reads from train_log.jsonl (LR warm-up, lead time).
        self.loss_log: LossLog | None = None
        self._last_step: int | None = None

    def record(self, step: int, loss: float | None, lr: float | None = None) -> None:
        """Log the loss (and learning rate) of update `step`, the update that
        turns step `step` into `step + 1`, as train_log.jsonl has it. Optional:
        with it, judging starts after the LR warm-up and the report carries
        each interval's mean loss and the loss divergence step, as `trend`
        does with a loss log."""
        if self.loss_log is None:
            self.loss_log = LossLog(Path(f"live:{self.out}"), [], [], [] if lr is not None else None)
        history = self.loss_log
        if history.steps and step <= history.steps[-1]:
            raise CkptScanError(f"loss recorded for step {step} after step {history.steps[-1]}: steps must increase")
        history.steps.append(step)
        history.losses.append(math.nan if loss is None or not math.isfinite(loss) else float(loss))
        if history.lrs is not None:
            if lr is None:
                history.lrs = None  # as a file: the LR counts only when every record carries one
            else:
                history.lrs.append(float(lr))

    @property
    def report_path(self) -> Path:
        return self.out / REPORT_FILE

    def due(self, step: int) -> bool:
        return step % self.every == 0 and (self._last_step is None or step > self._last_step)

    def step(self, step: int) -> list[Alert]:
        """Call after each optimizer step with the number of updates done so
        far; does the work only every `every` steps. Returns the alerts raised
        on the interval that ends at `step` (on rank 0; [] elsewhere)."""
        if not self.due(step):
            return []
        started = time.perf_counter()
        self._last_step = step
        if self._probe_batch is not None:
            self.probe = self._capture_probe()
            self._probe_batch = None
        sharded = self.world > 1 and self.view.sharded
        snapshot = None
        if self.rank == 0 or sharded:
            snapshot = self.view.snapshot(step, keep=self.rank == 0)
        alerts: list[Alert] = []
        if self.rank == 0:
            alerts = self._add(snapshot)
        if self.world > 1:
            self._agree()
        self.seconds.append(time.perf_counter() - started)
        return alerts

    def _add(self, snapshot: Checkpoint) -> list[Alert]:
        self.checkpoints.append(CheckpointRef(str(snapshot.path), snapshot.step))
        previous, self.previous = self.previous, snapshot
        if previous is None:
            return []
        model, (layers,) = scan_layers([previous, snapshot], [(0, 1)], self.options, self.probe)
        pair = PairResult(previous.step, snapshot.step, layers, str(previous.path), str(snapshot.path))
        self.pairs.append(pair)
        # A snapshot holds the model, never its optimizer: said once, as compute() says why of checkpoints.
        settings = {"run": str(self.out), "pairing": "previous", "stride": 1, "pending_steps": [],
                    "live": {"every": self.every}, "optimizer_state": LIVE_OPTIMIZER_NOT_READ}
        if self.loss_log is not None:  # as compute() does with a loss log
            self.loss_log.annotate(pair)
            settings.update(loss_log=str(self.loss_log.path), lr_warmup_end_step=self.loss_log.warmup_end())
        fill_update_per_lr(pair)
        metrics = Metrics(kind="run", model=model, checkpoints=self.checkpoints, pairs=self.pairs,
                          settings=settings, probe=str(self.probe.path) if self.probe is not None else None,
                          loss_log=self.loss_log)
        self.report = self._judging.report(metrics)
        if self.per_head != "all" and len(self.pairs) >= 2:
            self._drop_heads(len(self.pairs) - 2)
        alerts = self._alerts()
        if self._write_due(alerts):
            self._write()
        self.latest = interval_metrics(self.report.pairs[-1])
        self._log(snapshot.step)
        if alerts:
            self._act(alerts)
        return alerts

    def _drop_heads(self, index: int) -> None:
        """Drop from memory the per-head results that `per_head` leaves out of
        the report, of the pair before the newest: its layers' statuses are
        final (each pair is judged from earlier ones only; a lone first pair
        is judged again as warm-up when the second comes). Only a change of
        basis (a loss log whose LR warm-up end moves) judges every pair again:
        a layer flagged then keeps no heads it had dropped. At 10,000 pairs of
        a 1B model the per-head results are most of the 11 GiB live mode
        holds. The judged copy shares the raw pair's attention results."""
        for raw, judged in zip(self.pairs[index].layers, self.report.pairs[index].layers):
            if raw.attention is not None and raw.attention.heads and \
                    not keeps_heads(self.per_head, judged.status, newest=False):
                raw.attention.heads = []

    def close(self) -> None:
        """Write the report file if its last pairs are not in it yet (the
        file is written at spaced steps, see the module docstring): call once
        training ends."""
        if self.report is not None and self._written != (len(self.report.pairs), self.report.summary.status):
            self._write()

    def _write_due(self, alerts: list[Alert]) -> bool:
        return report_due(self._written, len(self.report.pairs), self.report.summary.status, bool(alerts))

    def _write(self) -> None:
        try:
            self._file.write(self.report)
        except CkptScanError as e:  # a full disk must not end the training run
            log.warning("ckptscan: %s", e)
            return
        self._written = (len(self.report.pairs), self.report.summary.status)

    def _alerts(self) -> list[Alert]:
        newest = self.report.pairs[-1]
        t = self.thresholds
        # A lone first interval is judged like `diff`; in a longer series it is warm-up (see the module docstring).
        provisional = len(self.report.pairs) == 1 and (t.warmup_pairs > 0 or (newest.from_step or 0) < t.warmup_steps)
        return [Alert(newest.to_step, layer.layer, f) for layer in newest.layers for f in layer.findings
                if f.severity == "alert" and (f.family == "numeric" or not provisional)]

    def _act(self, alerts: list[Alert]) -> None:
        """A callable hears of each alert; "save" and "stop" act once per step."""
        if callable(self.on_alert):
            for alert in alerts:
                self.on_alert(alert)
            return
        for alert in alerts:
            log.warning("ckptscan: ALERT at step %d, layer %d: %s (%s)", alert.step, alert.layer,
                        alert.finding.message, self.report_path)
        if self.on_alert == "save":
            self.should_save = True
            if self.save is not None:
                self.save(alerts[0].step)
        elif self.on_alert == "stop":
            self.should_stop = True

    def _log(self, step: int) -> None:
        if self._writer is None:
            return
        if isinstance(self._writer, (str, Path)):
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(str(self._writer))
        for name, value in self.latest.items():
            self._writer.add_scalar(name, value, step)
        self._writer.flush()

    def _agree(self) -> None:
        """Rank 0's decisions, on every rank."""
        import torch.distributed as dist

        flags = [self.should_stop, self.should_save]
        dist.broadcast_object_list(flags, src=0)
        self.should_stop, self.should_save = flags

    def _capture_probe(self) -> Probe:
        """The probe batch's router inputs, captured once, on the model's
        device. The RNG state is restored afterwards (a forward may draw from
        it), and `capture_probe` restores every module's train/eval mode."""
        device = torch.device(self.options.device)
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            return capture_probe(self.model, _to(self._probe_batch, device), self.out / PROBE_FILE)


def report_due(written: tuple[int, str] | None, pairs: int, verdict: str, alerted: bool) -> bool:
    """Whether the report file is rewritten now (module docstring): `written`,
    the (pairs, verdict) of the file as it is; `pairs` and `verdict`, the
    report's now. Geometric spacing makes the rewrites of a run of N pairs
    cost O(N · REPORT_SPACING) pair texts in all: a constant per pair."""
    if written is None or alerted:
        return True
    in_file, verdict_in_file = written
    return verdict != verdict_in_file or pairs - in_file >= max(1, in_file // REPORT_SPACING)


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


def _to(batch: Any, device: torch.device) -> Any:
    """A batch (tensor, tuple/list or mapping of them) on `device`."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, Mapping):
        return {k: _to(v, device) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(_to(v, device) for v in batch)
    return batch


def _rank_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _device_name(tensor: torch.Tensor) -> str:
    device = tensor.device
    return "cpu" if device.type == "cpu" else str(device)
