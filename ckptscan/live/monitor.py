"""Live mode: the offline monitors inside a training loop, every N steps.

    monitor = ckptscan.live.Monitor(model, every=200, out="runs/main/ckptscan")
    for step in range(steps):
        loss.backward(); optimizer.step(); optimizer.zero_grad()
        monitor.step(step + 1)          # the step count after this update
        if monitor.should_stop:
            break

Every `every` steps the monitored tensors (q/k projections, routers; found
by the same layout resolvers as a checkpoint's, from the model's own
state_dict names) are copied to host memory (`snapshot.HostBuffers`): that
copy is all a monitored step costs the training loop. A background thread
(`background.Background`) then pairs the copy with the previous one and
scans the pair with the same core as `ckptscan diff` (`scan_layers`, on
the CPU, changing no setting of the trainer: `pair_scan`); judges the
growing series with the same judge as `ckptscan trend`, one new pair at a
time from the state the last one left (`SeriesJudge`: the cost per step
does not grow with the run); and writes the report (atomically) as
`OUT/report.json` in the `trend --json` schema. A live run with checkpoints
saved at the same steps therefore gives the same numbers and the same
verdict as `ckptscan trend` on those checkpoints.

Back-pressure: one scan at a time. A monitored step whose previous scan is
still running waits for it before taking its snapshot (`waited` records each
wait; `close` logs their sum): memory stays at two snapshots, and no pair is
skipped, which would break the equality with `trend`. A wait means a scan
takes longer than `every` training steps: monitor less often.

The scan reports later than its step: its alerts are acted on (on_alert,
`should_stop`, `should_save`) and `report`, `latest` updated at the first
`step()` call after it finishes, at the latest at the next monitored step
(which waits for it), or at `wait()` / `close()`. Under torch.distributed
they are acted on at the next monitored step on every rank alike (the
decision is broadcast there). An exception in the scan is raised in the
training thread at the next `step()`, `wait()` or `close()`, and again at
every later call. `background=False` runs the scan inside `step()` instead
(acting at the step itself, as before live mode scanned in the background).

Once the report alerts, its resume plan (`summary.resume` in the report
file, detection/resume.py) is also written as text, `OUT/resume.txt`: the
rollback candidate that holds on its own (live mode's snapshot of step N
stands for the trainer's own checkpoint of step N) or that none does, the
steps to skip, the learning rate to go back to, as `ckptscan trend` prints
them; and "log", "save" and "stop" log it with their alert. A job that
stops on an alert (`on_alert="stop"`) leaves the plan beside its report.

The report file holds every pair, so writing it costs O(pairs): it is
written for each of the first REPORT_SPACING × 2 pairs, then once the
pairs not yet in it are 1/REPORT_SPACING of those that are (so writing costs
a bounded amount per step, and the file is at most ~3% of the run behind),
and always when the verdict changes or the newest interval alerts. `close()`
(at the end of training) waits for the last scan and writes what is left:
the final file is the report.

The series rules judge each point from earlier points only, so a pair's
verdict does not change as the run grows. One exception, as in `trend`: a
series of a single pair is judged like `diff` (the cross-layer rule), while
in a longer series the first pairs are warm-up. The first interval therefore
acts (`on_alert`) only on non-finite values, the verdict it keeps later.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from ckptscan.pipeline.metrics import Metrics
from ckptscan.pipeline.config import load_config
from ckptscan.detection.judge import SeriesJudge
from ckptscan.errors import CkptScanError
from ckptscan.live.background import Background
from ckptscan.live.alerts import Alert, alerts_of
from ckptscan.live.monitor_options import ON_ALERT, MonitorOptions, OnAlert
from ckptscan.live.pair_scan import scan_pair
from ckptscan.live.report_file import ReportFile, report_due
from ckptscan.live.resume_file import ResumePlanFile
from ckptscan.live.snapshot import HostBuffers, ModelView, Snapshot, model_config
from ckptscan.live.tensorboard_scalars import METRIC_PREFIX, TensorBoardScalars, interval_metrics
from ckptscan.inputs.loss_log import LossLog
from ckptscan.monitors import registry
from ckptscan.system.paths import expand_path
from ckptscan.inputs.probe import Probe, capture_probe, load_probe
from ckptscan.readers import Checkpoint
from ckptscan.readers.trainer_state import interval_lr
from ckptscan.document.plain import keeps_heads
from ckptscan.report.destinations import Delivery, Destination
from ckptscan.report.resume import terminal_lines
from ckptscan.schema.results import CheckpointRef, PairResult, ScanReport
from ckptscan.scan import ScanOptions

log = logging.getLogger("ckptscan.live")

__all__ = ["Alert", "METRIC_PREFIX", "Monitor", "MonitorOptions", "ON_ALERT", "OnAlert", "interval_metrics"]

REPORT_FILE = "report.json"
# The resume plan as text, beside the report file, once the report alerts (module docstring).
RESUME_FILE = "resume.txt"
# The report file is rewritten once the pairs not in it are 1/REPORT_SPACING of those that are (module docstring).
REPORT_SPACING = 32
PROBE_FILE = "probe.safetensors"
# Live mode snapshots the parameters only; the optimizer family reads a saved
# optimizer state, which a snapshot does not hold.
LIVE_OPTIMIZER_NOT_READ = "not read: live mode snapshots the parameters, not the optimizer"


@dataclass(frozen=True)
class Reported:
    """What one background scan hands back to the training thread."""

    report: ScanReport
    alerts: list[Alert]
    latest: dict[str, float]  # the newest interval's metrics, as logged
    step: int  # the newer step of the newest interval


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
    (set `should_save`, and call `save(step)` when given, `step` being the
    step the model is at when the alert is acted on; under
    torch.distributed act on `should_save`, which every rank sees), "stop"
    (set `should_stop`), or a callable given each `Alert` (on rank 0, on
    the training thread). Alerts are acted on when the background scan
    reports (module docstring): a step or more after the interval's step.
    `config`: the model's config.json as a dict (default: the model's
    `config`, e.g. a Hugging Face `PretrainedConfig`). `thresholds`:
    default, the nearest ckptscan.toml / pyproject.toml's, as `trend` uses.
    `tensorboard`: a log directory or a `SummaryWriter` for the metrics
    (written from the scan's thread, at each interval's step).
    `per_head`: which intervals keep their per-head results, in the report
    file and in memory, as `trend --per-head`: "all" (the default, the
    report `trend --json` writes), "flagged" (layers at warn or alert) or
    "newest" (the newest interval). Over a long run the per-head results are
    most of what live mode holds: about 1 MB an interval at 1B shape.
    `background`: False scans inside `step()` (module docstring).

    Under torch.distributed every rank calls `step`; sharded (DTensor,
    FSDP2) monitored tensors are gathered to rank 0, which alone computes,
    judges and writes; `should_stop` / `should_save` are broadcast so that
    every rank acts alike.

    `report`, `latest`, `pairs`, `checkpoints` and `loss_log` are complete
    up to the last scan collected: read them after `wait()` or `close()`.
    Also a context manager: leaving the block calls `close()`.

    The options are one value, `MonitorOptions` (`Monitor(model,
    MonitorOptions(every=200, out=...))`), or its fields as keyword arguments
    (`Monitor(model, every=200, out=...)`; `every`, `probe`, `out` and
    `on_alert` also positionally, in that order): both make the same
    monitor. Keyword arguments beside a `MonitorOptions` replace its fields.
    `settings` holds the monitor's options.
    """

    def __init__(self, model: torch.nn.Module, settings: MonitorOptions | int | None = None, *args: Any,
                 **kwargs: Any) -> None:
        if not isinstance(settings, MonitorOptions):  # the old keyword arguments, `every` perhaps positional
            settings = MonitorOptions(*(() if settings is None else (settings,)), *args, **kwargs)
        elif args or kwargs:
            if args:
                raise TypeError("Monitor(model, MonitorOptions(...)) takes its other options by keyword")
            settings = replace(settings, **kwargs)
        self.settings = settings
        config, options, probe = settings.config, settings.options, settings.probe
        self.model, self.every, self.out = model, settings.every, expand_path(settings.out)
        self.on_alert, self.save = settings.on_alert, settings.save
        self.rank, self.world = _rank_world()
        options = options or ScanOptions()
        self.view = ModelView(model, config if config is not None else model_config(model), options.overrides,
                              options.tensor_map, options.layers)
        if not self.view.monitored:
            raise CkptScanError("the layout resolver found no monitored tensor in this model")
        # The trainer owns the thread count: never changed inside its process (`pair_scan`: the scan's
        # thread starts from it). Snapshots are host copies: the scan runs on the CPU.
        self.options = replace(options, threads=torch.get_num_threads(), workers=1, device="cpu")
        self.thresholds = settings.thresholds or load_config(None, ()).thresholds
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
        # Where each judged interval also goes, after the report file (the destinations' protocol):
        # the resume plan once the report alerts, the metrics as TensorBoard scalars.
        self.destinations: list[Destination] = [ResumePlanFile(self.resume_path)]
        if settings.tensorboard is not None:
            self.destinations.append(TensorBoardScalars(settings.tensorboard))
        self._buffers = HostBuffers(self.view)
        self.previous: Checkpoint | None = None  # the newest snapshot (the next pair's older side)
        self._thread = Background(inline=not settings.background)
        # Owned by the scan's thread while a scan runs:
        self.checkpoints: list[CheckpointRef] = []
        self.pairs: list[PairResult] = []
        self._judging = SeriesJudge(self.thresholds)  # the judge state, carried from step to step
        self.per_head = settings.per_head
        self._file = ReportFile(self.out / REPORT_FILE, self.per_head)
        self._written: tuple[int, str] | None = None  # (pairs, verdict) of the report file
        self._plan_logged: list[str] = []  # the plan's lines as last logged (training thread)
        self.float64_pairs = 0  # pairs whose Grams were computed in float64 (`pair_scan`)
        # The training loss (and LR) per update, when the loop records them: the
        # loss log `trend` reads from train_log.jsonl (LR warm-up, lead time).
        self.loss_log: LossLog | None = None
        # Owned by the training thread:
        self.report: ScanReport | None = None
        self.latest: dict[str, float] = {}  # the newest interval's metrics, as logged
        self.latest_step: int | None = None  # the newer step of the interval `latest` is of
        self.should_stop = False
        self.should_save = False
        self.seconds: list[float] = []  # wall time of each monitored step, waits included (benchmarks)
        self.waited: list[float] = []  # of which waiting for the previous scan (back-pressure; 0: it had ended)
        self._records: list[tuple[int, float | None, float | None]] = []  # recorded, not yet handed to a scan
        self._logged_lrs: list[tuple[int, float]] = []  # `logged_lr`'s (step, rate), in step order
        self._last_recorded: int | None = None
        self._last_step: int | None = None
        self._now: int | None = None  # the newest step passed to `step`
        # A test's handle on the scan's thread: called there with the newer step before each pair is scanned.
        self._before_scan: Callable[[int], None] | None = None

    def record(self, step: int, loss: float | None, lr: float | None = None) -> None:
        """Log the loss (and learning rate) of update `step`, the update that
        turns step `step` into `step + 1`, as train_log.jsonl has it. Optional:
        with it, judging starts after the LR warm-up and the report carries
        each interval's mean loss and the loss divergence step, as `trend`
        does with a loss log."""
        if self._last_recorded is not None and step <= self._last_recorded:
            raise CkptScanError(f"loss recorded for step {step} after step {self._last_recorded}: steps must increase")
        self._last_recorded = step
        self._records.append((step, loss, lr))

    def logged_lr(self, step: int, lr: float) -> None:
        """The learning rate the trainer logged for the update that made step
        `step` (a Hugging Face trainer_state.json's `log_history` numbering;
        the Trainer callback calls it at the Trainer's logging steps). A pair
        that `record` gives no LR takes the mean of those logged within it,
        as `trend` reads them from the checkpoints' trainer_state.json."""
        self._logged_lrs.append((step, float(lr)))

    @property
    def report_path(self) -> Path:
        return self.out / REPORT_FILE

    @property
    def resume_path(self) -> Path:
        """The resume plan as text (`OUT/resume.txt`), written once the report alerts."""
        return self.out / RESUME_FILE

    @property
    def resume_plan(self) -> list[str]:
        """The rollback candidate and the resume plan of `report`, as `trend` prints them; [] before an alert."""
        return terminal_lines(self.report.summary) if self.report is not None and self.report.summary.resume \
            else []

    def due(self, step: int) -> bool:
        return step % self.every == 0 and (self._last_step is None or step > self._last_step)

    def step(self, step: int) -> list[Alert]:
        """Call after each optimizer step with the number of updates done so
        far. Every `every` steps it takes a snapshot and hands it to the
        scan's thread; at every call it acts on a scan that has reported
        since. Returns the alerts acted on in this call (on rank 0; []
        elsewhere), each naming the interval it was raised on."""
        self._now = step
        if not self.due(step):
            # Under torch.distributed, only at monitored steps: every rank must act alike.
            return self._collect(wait=False) if self.world == 1 else []
        started = time.perf_counter()
        running = self._thread.running()
        alerts = self._collect(wait=True)  # back-pressure: the previous scan's buffers are the next snapshot's
        self.waited.append(time.perf_counter() - started if running else 0.0)
        self._last_step = step
        if self._probe_batch is not None:
            self.probe = self._capture_probe()
            self._probe_batch = None
        sharded = self.world > 1 and self.view.sharded
        if self.rank == 0 or sharded:
            snapshot = self._buffers.take(step, keep=self.rank == 0)
            if snapshot is not None:
                previous, self.previous = self.previous, snapshot.checkpoint
                records, self._records = self._records, []
                self._thread.run(functools.partial(self._advance, previous, snapshot, step, records,
                                                   list(self._logged_lrs)))
                if self._thread.inline:
                    alerts += self._collect(wait=True)
        if self.world > 1:
            self._agree()
        self.seconds.append(time.perf_counter() - started)
        return alerts

    def wait(self) -> list[Alert]:
        """Wait for the scan in flight and act on what it reports; returns
        its alerts. Under torch.distributed every rank must call it (the
        decisions are broadcast)."""
        alerts = self._collect(wait=True)
        if self.world > 1:
            self._agree()
        return alerts

    def close(self) -> None:
        """Wait for the last scan, act on it, and write the report file if
        its last pairs are not in it yet (the file is written at spaced
        steps, see the module docstring): call once training ends. The
        scan's thread ends (a later `step` starts another). Not a collective."""
        try:
            self._collect(wait=True)
            if self.report is not None and self._written != (len(self.report.pairs), self.report.summary.status):
                self._write(self.report)
        finally:
            self._thread.close()
        waits = [w for w in self.waited if w > 0]
        if waits:
            log.info("ckptscan: training waited %.3f s in all for the background scan, at %d of %d monitored steps "
                     "(the longest %.3f s): a scan takes longer than `every` steps", sum(waits), len(waits),
                     len(self.seconds), max(waits))

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _collect(self, wait: bool) -> list[Alert]:
        """On the training thread: take what a finished scan reported and act on it."""
        if self.rank != 0:
            return []
        done, reported = self._thread.collect(wait)
        if not done or reported is None:
            return []
        self.report, self.latest, self.latest_step = reported.report, reported.latest, reported.step
        if reported.alerts:
            self._act(reported.alerts)
        return list(reported.alerts)

    def _advance(self, previous: Checkpoint | None, snapshot: Snapshot, step: int,
                 records: list[tuple[int, float | None, float | None]],
                 logged_lrs: list[tuple[int, float]]) -> Reported | None:
        """On the scan's thread: the snapshot of `step` into the series."""
        snapshot.wait()
        for record in records:
            self._log_loss(*record)
        newest = snapshot.checkpoint
        self.checkpoints.append(CheckpointRef(str(newest.path), step))
        if previous is None:
            return None
        if self._before_scan is not None:
            self._before_scan(step)
        model, layers, widened = scan_pair(previous, newest, self.options, self.probe)
        self.float64_pairs += widened
        pair = PairResult(previous.step, newest.step, layers, str(previous.path), str(newest.path))
        self.pairs.append(pair)
        # A snapshot holds the model, never its optimizer: said once, as compute() says why of checkpoints.
        settings = {"run": str(self.out), "pairing": "previous", "stride": 1, "pending_steps": [],
                    "live": {"every": self.every, "float64_pairs": self.float64_pairs},
                    "optimizer_state": LIVE_OPTIMIZER_NOT_READ}
        if self.loss_log is not None:  # as compute() does with a loss log
            self.loss_log.annotate(pair)
            settings.update(loss_log=str(self.loss_log.path), lr_warmup_end_step=self.loss_log.warmup_end())
        if pair.lr is None and logged_lrs:  # as compute()'s stated_lr does with trainer_state.json
            pair.lr = interval_lr(logged_lrs, pair.from_step, pair.to_step)
        registry.fill(pair)
        metrics = Metrics(kind="run", model=model, checkpoints=self.checkpoints, pairs=self.pairs,
                          settings=settings, probe=str(self.probe.path) if self.probe is not None else None,
                          loss_log=self.loss_log)
        report = self._judging.report(metrics)
        if self.per_head != "all" and len(self.pairs) >= 2:
            self._drop_heads(report, len(self.pairs) - 2)
        alerts = alerts_of(report, self.thresholds)
        if report_due(self._written, len(report.pairs), report.summary.status, bool(alerts), REPORT_SPACING):
            self._write(report)
        delivery = Delivery(report, "alert", quiet=True, new=(len(report.pairs) - 1,))
        for destination in self.destinations:
            destination.write(delivery)
        return Reported(report, alerts, interval_metrics(report.pairs[-1]), step)

    def _log_loss(self, step: int, loss: float | None, lr: float | None) -> None:
        """One `record` into the loss log (on the scan's thread, which reads it)."""
        if self.loss_log is None:
            self.loss_log = LossLog(Path(f"live:{self.out}"), [], [], [] if lr is not None else None)
        history = self.loss_log
        history.steps.append(step)
        history.losses.append(math.nan if loss is None or not math.isfinite(loss) else float(loss))
        if history.lrs is not None:
            if lr is None:
                history.lrs = None  # as a file: the LR counts only when every record carries one
            else:
                history.lrs.append(float(lr))

    def _drop_heads(self, report: ScanReport, index: int) -> None:
        """Drop from memory the per-head results that `per_head` leaves out of
        the report, of the pair before the newest: its layers' statuses are
        final (each pair is judged from earlier ones only; a lone first pair
        is judged again as warm-up when the second comes). Only a change of
        basis (a loss log whose LR warm-up end moves) judges every pair again:
        a layer flagged then keeps no heads it had dropped. At 10,000 pairs of
        a 1B model the per-head results are most of the 11 GiB live mode
        holds. The judged copy shares the raw pair's attention results."""
        for raw, judged in zip(self.pairs[index].layers, report.pairs[index].layers):
            if raw.attention is not None and raw.attention.heads and \
                    not keeps_heads(self.per_head, judged.status, newest=False):
                raw.attention.heads = []

    def _write(self, report: ScanReport) -> None:
        try:
            self._file.write(report)
        except CkptScanError as e:  # a full disk must not end the training run
            log.warning("ckptscan: %s", e)
            return
        self._written = (len(report.pairs), report.summary.status)

    def _alerts(self) -> list[Alert]:
        """The alerts of the newest interval of `report`."""
        return alerts_of(self.report, self.thresholds) if self.report is not None else []

    def _act(self, alerts: list[Alert]) -> None:
        """A callable hears of each alert; "save" and "stop" act once per step."""
        if callable(self.on_alert):
            for alert in alerts:
                self.on_alert(alert)
            return
        for alert in alerts:
            log.warning("ckptscan: ALERT at step %d, layer %d: %s (%s)", alert.step, alert.layer,
                        alert.finding.message, self.report_path)
        plan = self.resume_plan
        if plan and plan != self._plan_logged:
            log.warning("ckptscan: resume plan (%s):\n%s", self.resume_path, "\n".join(plan))
            self._plan_logged = plan
        if self.on_alert == "save":
            self.should_save = True
            if self.save is not None:
                self.save(self._now if self._now is not None else alerts[0].step)
        elif self.on_alert == "stop":
            self.should_stop = True

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
        device = self.view.tensors[self.view.monitored[0]].device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            return capture_probe(self.model, _to(self._probe_batch, device), self.out / PROBE_FILE)


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

