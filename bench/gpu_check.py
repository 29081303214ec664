"""GPU check (issue 30): ckptscan's CUDA path on one GPU, measured, in one table.

    PYTHONPATH=$PWD python bench/gpu_check.py                              # on a GPU machine, ~5 min
    PYTHONPATH=$PWD taskset -c 0 python bench/gpu_check.py --device cpu --shape tiny   # dry run, ~1 min

Every figure is taken in this one run, side by side, and printed as one
Markdown table with a PASS/FAIL per row that has a target:

(a) `ckptscan diff` of a 1B-shaped bf16 pair: the first two checkpoints of
    trend_run.py's TinyLlama-1.1B-shaped run (synthetic.ensure_run). Whole
    `ckptscan diff --json` processes with --device DEVICE and --device cpu
    (warm page cache, as diff_overhead.py times them); their JSON reports'
    per-head entropies compared. In this process (the library,
    `ckptscan.pipeline.api.scan_pair`, where the GPU memory can be read): the scan's
    time cold and warm next to the I/O floor of the same bytes
    (measure.read_ranges), and its peak GPU memory. And the diff once more
    under torch.set_float32_matmul_precision("high"), which training scripts
    often set and a live monitor inherits.
(b) `ckptscan trend` of --checkpoints such checkpoints with --device DEVICE:
    in this process, cold and warm, against the I/O floor; and as a whole
    `ckptscan trend --no-cache` process.
(c) live mode in a training loop: a Llama model from transformers
    (live_overhead.llama_1b: Llama-3.2-1B's shape, ~1.2B parameters; random
    init, bf16, AdamW, no download) trained on generated tokens. A baseline
    phase without a monitor, then --steps steps with two monitors attached
    (every=200 and every=50), each training step and each monitor step
    timed on its own, CUDA-synchronised. A monitor costs one step in
    `every`, which a median of step times cannot see, so the overhead is
    the median monitored step (one that hands a pair to the monitor's
    scan thread: its snapshot, and any wait for the previous scan) over
    `every` median training steps; the medians with and without the
    monitors are shown too (the monitors must not slow the training steps
    themselves). Extra GPU memory of a monitor: the part of its held
    snapshot in GPU memory plus the peak above the allocation before its
    step; the background scan's own is in the run's peak, with the
    monitors against without. The reports are read after `Monitor.close()`
    (the last scans done). The monitored tensors are saved at the same
    steps (the state_dict's monitored tensors and config.json, the bytes
    `trend` reads) and each live report is compared with `trend` on them.
(d) the device, torch and CUDA versions.
(e) the CPU proxies of what a diff costs a GPU (issue 50): bench/op_budget.py
    --json, run as a process of its own, counts kernel-launching ops, scalar
    reads (host synchronisations) and linalg solver calls a layer of one
    1B-shaped diff; targets ≤ 100, ≤ 2 and ≤ 2. They need no GPU.

A `ckptscan` process that crashes (an exit code other than 0 and 1, or no
JSON report) is a FAIL row naming its exit code and its last stderr line,
never an error about the report it did not write.

Targets (on the GPU): results equal within 1e-5; diff and trend within
1.1x the I/O floor (cold page cache); live overhead <= 0.5% at every=200 and
<= 2% at every=50; extra GPU memory <= 2x the monitored tensors. With
--device cpu the same rows are printed as a dry run of the script (the
targets are GPU targets). Parts run in the order c, a, b, e, so that a
--timeout cuts the slowest to generate first; a part that fails is an
ERROR row and the others still run. Exit status: 0 all rows pass, 1 some
row fails or did not run, 2 no CUDA device for --device cuda.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT), str(ROOT / "tests")]

from live.helpers import comparable  # noqa: E402  (what differs between a live and an offline report by construction)
from live_overhead import llama_1b  # noqa: E402
from measure import evict, machine, monitored_entries, read_ranges, symlink_run  # noqa: E402
from synthetic import LLAMA_1B, ModelSpec, ensure_run  # noqa: E402

from ckptscan.pipeline.api import scan, scan_pair, scan_run  # noqa: E402
from ckptscan.detection.rules import Thresholds  # noqa: E402
from ckptscan.document.plain import report_dict  # noqa: E402
from ckptscan.pipeline.run import resolve_run  # noqa: E402
from ckptscan.scan import ScanOptions  # noqa: E402

EQUAL_WITHIN = 1e-5
FLOOR_RATIO = 1.1
OVERHEAD_TARGETS = {200: 0.005, 50: 0.02}  # every -> largest share of training time
MEMORY_RATIO = 2.0  # extra GPU memory / monitored tensors' bytes
ROUNDS = 2  # in-process timings, interleaved with the I/O floor; the minimum counts
OP_BUDGET = HERE / "op_budget.py"  # the CPU proxies (part e)
PROXY_TARGETS = {  # op_budget.py's JSON key -> (what it counts, the most a layer may take)
    "kernel_ops_per_layer": ("kernel-launching ops a layer", 100.0),
    "scalar_reads_per_layer": ("scalar reads (host synchronisations) a layer", 2.0),
    "solver_calls_per_layer": ("linalg solver calls a layer", 2.0),
}
HEAD_ENTROPIES = ("delta1_entropy", "delta2_entropy", "delta3_entropy", "dwq_entropy", "dwk_entropy",
                  "delta2_entropy_norm")


def tiny_llama() -> tuple[torch.nn.Module, dict, int, int]:
    import transformers

    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=256,
                                      max_position_embeddings=64, tie_word_embeddings=True)
    return transformers.LlamaForCausalLM(config), config.to_dict(), config.vocab_size, 32


@dataclass(frozen=True)
class Shape:
    spec: ModelSpec  # the checkpoints of (a) and (b)
    live_model: Callable[[], tuple[torch.nn.Module, dict, int, int]]  # (model, config, vocab, seq), as live_overhead's
    batch: int
    seq: int
    warmup_steps: int
    baseline_steps: int


SHAPES = {
    "1b": Shape(LLAMA_1B, llama_1b, batch=8, seq=1024, warmup_steps=10, baseline_steps=100),
    # A dry run anywhere: the same code on a few MB.
    "tiny": Shape(ModelSpec("llama-tiny", "llama", 4, 256, 4, 2, 512, 1024), tiny_llama, batch=2, seq=32,
                  warmup_steps=3, baseline_steps=50),
}


@dataclass
class Row:
    part: str  # a, b, c, d
    check: str
    figure: str
    target: str = ""
    result: str = ""  # PASS, FAIL, ERROR, NOT RUN, or "" for a figure without a target


def verdict(value: float, limit: float) -> str:
    return "PASS" if value <= limit else "FAIL"  # NaN fails


def table(rows: list[Row], title: str) -> str:
    lines = [title, "", "| part | check | figure | target | result |", "|---|---|---|---|---|"]
    order = {part: i for i, part in enumerate("abcde")}
    for row in sorted(rows, key=lambda r: order.get(r.part, len(order))):  # stable: a part's rows keep their order
        cells = (row.part, row.check, row.figure, row.target, row.result)
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines)


def exit_status(rows: list[Row]) -> int:
    return 1 if any(row.result in ("FAIL", "ERROR", "NOT RUN") for row in rows) else 0


def head_entropy_difference(report: dict, reference: dict) -> tuple[float, int]:
    """The largest |difference| of the per-head entropies of two JSON reports
    of the same checkpoints, and how many values were compared. Different
    pairs, layers or heads, or a value on one side and null on the other,
    is an infinite difference."""
    worst, count = 0.0, 0
    if len(report["pairs"]) != len(reference["pairs"]):
        return math.inf, count
    for pair, pair_ref in zip(report["pairs"], reference["pairs"]):
        if len(pair["layers"]) != len(pair_ref["layers"]):
            return math.inf, count
        for layer, layer_ref in zip(pair["layers"], pair_ref["layers"]):
            heads = (layer.get("attention") or {}).get("heads", [])
            heads_ref = (layer_ref.get("attention") or {}).get("heads", [])
            if [h["head"] for h in heads] != [h["head"] for h in heads_ref]:
                return math.inf, count
            for head, head_ref in zip(heads, heads_ref):
                for key in HEAD_ENTROPIES:
                    value, expected = head.get(key), head_ref.get(key)
                    if value is None or expected is None:
                        if (value is None) != (expected is None):
                            return math.inf, count
                        continue
                    worst, count = max(worst, abs(value - expected)), count + 1
    return worst, count


def report_difference(report: Any, reference: Any) -> tuple[float, int, list[str]]:
    """Two reports of the same structure: the largest relative difference
    |a − b| / max(1, |b|) of their floats, how many floats were compared, and
    where anything else differs (a key, a length, a status, a null)."""
    worst, count, mismatches = 0.0, 0, []

    def walk(a: Any, b: Any, where: str) -> None:
        nonlocal worst, count
        if isinstance(b, dict):
            if not isinstance(a, dict) or a.keys() != b.keys():
                mismatches.append(f"{where}: keys")
                return
            for key in b:
                walk(a[key], b[key], f"{where}.{key}")
        elif isinstance(b, list):
            if not isinstance(a, list) or len(a) != len(b):
                mismatches.append(f"{where}: length")
                return
            for i, (x, y) in enumerate(zip(a, b)):
                walk(x, y, f"{where}[{i}]")
        elif isinstance(b, float) and isinstance(a, (int, float)) and not isinstance(a, bool):
            worst, count = max(worst, abs(a - b) / max(1.0, abs(b))), count + 1
        elif a != b:
            mismatches.append(f"{where}: {a!r} != {b!r}")

    walk(report, reference, "report")
    return worst, count, mismatches


def equality_row(part: str, check: str, difference: tuple[float, int, list[str]]) -> Row:
    worst, count, mismatches = difference
    figure = f"max rel. Δ {worst:.1e} over {count} numbers; " + (
        "statuses, findings and verdict equal" if not mismatches else
        f"{len(mismatches)} other difference(s), first: {mismatches[0]}")
    return Row(part, check, figure, f"≤ {EQUAL_WITHIN:g}, rest equal",
               "PASS" if worst <= EQUAL_WITHIN and not mismatches else "FAIL")


@dataclass
class CliRun:
    """A whole `ckptscan` process: its wall time, exit code and stderr (stdout is not kept)."""

    wall_s: float
    returncode: int
    stderr: str

    def crashed(self, report: Path) -> bool:
        """Neither a verdict (0, 1) nor its JSON report: the process did not do its work."""
        return self.returncode not in (0, 1) or not report.exists()

    def last_line(self) -> str:
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        return lines[-1].strip() if lines else "(nothing on stderr)"


def crash_row(part: str, what: str, run: CliRun) -> Row:
    """The row of a `ckptscan` process that crashed: its exit code and the last line it printed on stderr."""
    return Row(part, f"{what}: runs and writes its report", f"crashed: exit {run.returncode}, {run.last_line()}",
               "runs (exit 0 or 1, a JSON report)", "FAIL")


def run_ckptscan(*args: str) -> CliRun:
    """A whole `ckptscan` process, on this checkout's package."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "ckptscan", *args], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, errors="replace")
    return CliRun(time.perf_counter() - started, done.returncode, done.stderr)


def proxy_rows(script: Path = OP_BUDGET, timeout: float = 600) -> list[Row]:
    """(e) The CPU proxies: `python SCRIPT --json` from the repository root,
    its last line a JSON object of PROXY_TARGETS' keys, one row each with its
    target. A script that is missing, fails or prints no such line is a row
    that says so."""
    what = f"`python {script.relative_to(ROOT) if script.is_relative_to(ROOT) else script} --json`"
    if not script.exists():
        return [Row("e", f"CPU proxies, {what}", f"{script.name} is missing", "runs", "NOT RUN")]
    try:
        done = subprocess.run([sys.executable, str(script), "--json"], cwd=ROOT, capture_output=True, text=True,
                              errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired:
        return [Row("e", f"CPU proxies, {what}", f"still running after {timeout:g} s", "runs", "ERROR")]
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    if done.returncode != 0:
        last = [line for line in done.stderr.splitlines() if line.strip()][-1:] or lines[-1:] or ["(no output)"]
        return [Row("e", f"CPU proxies, {what}", f"exit {done.returncode}, {last[0].strip()}", "runs", "ERROR")]
    try:
        figures: Any = json.loads(lines[-1]) if lines else None
        values = {key: float(figures[key]) for key in PROXY_TARGETS}
        layers = int(figures["layers"])
    except (ValueError, TypeError, KeyError) as e:
        return [Row("e", f"CPU proxies, {what}", f"no figures in its last line ({type(e).__name__}: {e})", "runs",
                    "ERROR")]
    return [Row("e", f"{label}, one diff of {layers} layers of the 1B shape (CPU count, {what})", f"{values[key]:.1f}",
                f"≤ {target:g}", verdict(values[key], target)) for key, (label, target) in PROXY_TARGETS.items()]


class OutOfTime(BaseException):
    """--timeout was reached (a BaseException: library code catching Exception must not swallow it)."""


@dataclass
class Check:
    device: str
    shape: Shape
    steps: int
    workdir: Path
    checkpoints: int
    rows: list[Row] = field(default_factory=list)

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def timed(self, work: Callable[[], Any], cold_files: list[Path] | None = None) -> tuple[float, int | None, Any]:
        """Seconds of `work` here, and the peak GPU memory it allocated above
        what was allocated before (None on the CPU); cold: files evicted first."""
        if cold_files is not None:
            evict(cold_files)
        self.sync()
        base = 0
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        start = time.perf_counter()
        result = work()
        self.sync()
        seconds = time.perf_counter() - start
        return seconds, (torch.cuda.max_memory_allocated() - base if self.cuda else None), result

    def run_checkpoints(self, count: int) -> list[Path]:
        spec = self.shape.spec
        started = time.perf_counter()
        try:
            paths = ensure_run(spec, self.workdir / f"{spec.name}-run", [100 * (i + 1) for i in range(count)])
        except SystemExit as e:  # the generator's "not enough disk": this part's ERROR row, not the end of the run
            raise RuntimeError(str(e)) from None
        print(f"{count} checkpoints of {spec.name} ready in {time.perf_counter() - started:.0f} s", flush=True)
        return paths

    def floor_and_scan(self, paths: list[Path], work: Callable[[], Any]) -> dict[str, float]:
        """The I/O floor of these checkpoints' monitored bytes and the
        in-process scan, cold and warm, ROUNDS times interleaved; minimum of
        each, the scan's peak GPU memory, and the bytes."""
        spec = self.shape.spec
        monitored = {name for name, _, is_monitored in spec.tensors() if is_monitored}
        ranges = [r for p in paths for r in monitored_entries(p, monitored)]
        files = [f for p in paths for f in sorted(p.glob("*.safetensors"))]
        timed: dict[str, list[float]] = {}
        peak, nbytes = 0, 0
        for _ in range(ROUNDS):
            for state in ("cold", "warm"):
                if state == "cold":
                    evict(files)
                seconds, nbytes = read_ranges(ranges)
                timed.setdefault(f"floor_{state}", []).append(seconds)
                seconds, used, _ = self.timed(work, files if state == "cold" else None)
                timed.setdefault(f"scan_{state}", []).append(seconds)
                peak = max(peak, used or 0)
        figures = {key: min(values) for key, values in timed.items()}
        figures.update(peak=peak, bytes=nbytes)
        return figures

    def floor_rows(self, part: str, what: str, f: dict[str, float]) -> list[Row]:
        cold = f["scan_cold"] / f["floor_cold"]
        return [
            Row(part, f"{what}, in process, cold page cache",
                f"{f['scan_cold']:.2f} s = {cold:.2f}x the I/O floor ({f['floor_cold']:.2f} s for "
                f"{_megabytes(f['bytes'])})", f"≤ {FLOOR_RATIO}x", verdict(cold, FLOOR_RATIO)),
            Row(part, f"{what}, in process, warm page cache",
                f"{f['scan_warm']:.2f} s = {f['scan_warm'] / f['floor_warm']:.2f}x the I/O floor "
                f"({f['floor_warm']:.2f} s)"),
            Row(part, f"{what}, peak GPU memory (max_memory_allocated, in process)",
                _mib(f["peak"]) if self.cuda else "n/a on the CPU"),
        ]


def diff_part(check: Check) -> None:
    """(a) The 1B-shaped pair: device vs CPU reports, time vs the I/O floor, GPU memory."""
    a, b = check.run_checkpoints(2)
    rows, part = check.rows, "a"
    reports, walls = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, device in (("device", check.device), ("cpu", "cpu")):
            path = Path(f"{tmp}/{label}.json")
            run = run_ckptscan("diff", str(a), str(b), "--device", device, "--json", str(path))
            print(f"ckptscan diff --device {device}: {run.wall_s:.1f} s, exit {run.returncode}", flush=True)
            if run.crashed(path):
                rows.append(crash_row(part, f"`ckptscan diff --device {device}`", run))
                continue
            reports[label] = json.loads(path.read_text())
            walls[label] = run.wall_s
    if len(reports) == 2:
        worst, count = head_entropy_difference(reports["device"], reports["cpu"])
        same = reports["device"]["summary"]["status"] == reports["cpu"]["summary"]["status"]
        rows.append(Row(part, f"per-head entropies, `diff --device {check.device}` vs `--device cpu` (JSON reports)",
                        f"max |Δ| {worst:.1e} over {count} values; verdicts {'equal' if same else 'DIFFER'}",
                        f"≤ {EQUAL_WITHIN:g}", verdict(worst, EQUAL_WITHIN) if same else "FAIL"))

    options = ScanOptions(device=check.device)

    def pair() -> Any:
        return scan_pair(a, b, options, thresholds=Thresholds())

    pair()  # warm-up: CUDA context, cuBLAS/cuSOLVER handles
    figures = check.floor_and_scan([a, b], pair)
    rows.extend(check.floor_rows(part, f"`diff --device {check.device}`", figures))
    if len(walls) == 2:
        rows.append(Row(part, f"whole `ckptscan diff` processes, warm: --device {check.device} / --device cpu",
                        f"{walls['device']:.1f} s / {walls['cpu']:.1f} s (in process, warm: "
                        f"{figures['scan_warm']:.2f} s; the rest is start-up: interpreter, imports, CUDA context)"))

    if check.cuda:
        count, sites = sync_sites(pair)
        layers = check.shape.spec.layers
        rows.append(Row(part, "host synchronisations in one in-process `diff` (torch.cuda.set_sync_debug_mode)",
                        f"{count} in {layers} layers ({count / layers:.0f} per layer); most: "
                        + ", ".join(f"{site} x{n}" for site, n in sites)))
    else:
        rows.append(Row(part, "host synchronisations in one in-process `diff`", "n/a on the CPU"))

    # A training script's TF32 setting (nanoGPT and others set it) reaches a
    # live monitor's float32 Grams: the same pair computed under it.
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        high = report_dict(pair())
    finally:
        torch.set_float32_matmul_precision(previous)
    worst, count = head_entropy_difference(high, reports.get("cpu") or report_dict(scan_pair(
        a, b, ScanOptions(device="cpu"), thresholds=Thresholds())))
    rows.append(Row(part, f"per-head entropies, --device {check.device} under "
                    "torch.set_float32_matmul_precision('high') vs cpu",
                    f"max |Δ| {worst:.1e} over {count} values", f"≤ {EQUAL_WITHIN:g}", verdict(worst, EQUAL_WITHIN)))


def sync_sites(work: Callable[[], Any], top: int = 6) -> tuple[int, list[tuple[str, int]]]:
    """The synchronising CUDA operations of `work` (.item(), .cpu(), bool()
    of a device tensor, …: what torch's sync debug mode flags; a solver's own
    syncs are not), counted by the source line that made them."""
    sites: Counter[str] = Counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            work()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    for w in caught:
        if "synchroniz" in str(w.message):
            path = Path(w.filename)
            sites[f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name}:{w.lineno}"] += 1
    return sum(sites.values()), sites.most_common(top)


def trend_part(check: Check) -> None:
    """(b) trend of --checkpoints checkpoints vs the I/O floor."""
    paths = check.run_checkpoints(check.checkpoints)
    run = symlink_run(check.workdir / f"{check.shape.spec.name}-trend-{len(paths)}", paths)
    options = ScanOptions(device=check.device)

    def work() -> Any:
        return scan_run(run, options, thresholds=Thresholds())

    what = f"`trend --device {check.device}` of {len(paths)} checkpoints"
    check.rows.extend(check.floor_rows("b", what, check.floor_and_scan(paths, work)))
    evict([f for p in paths for f in p.glob("*.safetensors")])
    with tempfile.TemporaryDirectory() as tmp:
        whole = run_ckptscan("trend", str(run), "--device", check.device, "--no-cache", "--json", f"{tmp}/r.json")
        crashed = whole.crashed(Path(f"{tmp}/r.json"))
    if crashed:
        check.rows.append(crash_row("b", f"`ckptscan trend --device {check.device} --no-cache`", whole))
        return
    check.rows.append(Row("b", "whole `ckptscan trend --no-cache` process, cold", f"{whole.wall_s:.1f} s "
                          "(start-up included)"))


@dataclass
class MonitorStep:
    step: int
    seconds: float
    extra_bytes: int | None  # held snapshot + peak above the allocation before the step (GPU only)
    scanned: bool  # the step handed a pair to the scan (the first only takes a snapshot)


def live_part(check: Check) -> None:
    """(c) Live mode in a training loop: overhead, extra GPU memory, report equal to trend."""
    from safetensors.torch import save_file

    from ckptscan.live import Monitor

    shape, device, part = check.shape, check.device, "c"
    torch.manual_seed(0)
    with torch.device(device):  # initialised on the device: a CPU init of 1B parameters takes minutes
        model, config, vocab, _ = shape.live_model()
    model.to(torch.bfloat16).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    tokens = torch.Generator().manual_seed(0)

    def train_step() -> float:
        x = torch.randint(0, vocab, (shape.batch, shape.seq), generator=tokens).to(device)
        check.sync()
        started = time.perf_counter()
        model(input_ids=x, labels=x).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        check.sync()
        return time.perf_counter() - started

    def peak_since_reset() -> tuple[int, int]:
        return (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()) if check.cuda else (0, 0)

    for _ in range(shape.warmup_steps):
        train_step()
    if check.cuda:
        torch.cuda.reset_peak_memory_stats()
    baseline = [train_step() for _ in range(shape.baseline_steps)]
    baseline_peak = peak_since_reset()

    live_dir = check.workdir / "live"
    shutil.rmtree(live_dir, ignore_errors=True)  # a previous run's saves and reports
    saved = live_dir / "saved"
    monitors = {every: Monitor(model, every=every, out=live_dir / f"every-{every}", config=config,
                               thresholds=Thresholds()) for every in OVERHEAD_TARGETS}
    names = monitors[min(monitors)].view.monitored
    records: dict[int, list[MonitorStep]] = {every: [] for every in monitors}
    with_monitors, run_peak = [], (0, 0)
    for step in range(1, check.steps + 1):
        with_monitors.append(train_step())
        run_peak = tuple(map(max, run_peak, peak_since_reset()))
        for every, monitor in monitors.items():
            if not monitor.due(step):
                continue
            held = _snapshot_bytes(monitor, on_gpu=True)
            # A step after the first hands a pair to the monitor's scan thread; the step itself costs the
            # snapshot (and a wait, when the previous scan is still running): what training pays.
            hands_a_pair = monitor.previous is not None
            check.sync()
            before = 0
            if check.cuda:
                run_peak = tuple(map(max, run_peak, peak_since_reset()))
                torch.cuda.reset_peak_memory_stats()
                before = torch.cuda.memory_allocated()
            started = time.perf_counter()
            monitor.step(step)
            check.sync()
            seconds = time.perf_counter() - started
            extra = held + torch.cuda.max_memory_allocated() - before if check.cuda else None
            records[every].append(MonitorStep(step, seconds, extra, hands_a_pair))
        if step % min(monitors) == 0:  # outside the timed steps: the bytes trend reads, at the same steps
            folder = saved / f"checkpoint-{step}"
            folder.mkdir(parents=True, exist_ok=True)
            state = model.state_dict()
            save_file({n: state[n].detach().to("cpu").contiguous() for n in names}, str(folder / "model.safetensors"))
            (folder / "config.json").write_text(json.dumps(config))
    run_peak = tuple(map(max, run_peak, peak_since_reset()))
    monitored_bytes = _snapshot_bytes(monitors[min(monitors)])

    step_time = statistics.median(baseline)
    params = sum(p.numel() for p in model.parameters())
    check.rows.append(Row(part, f"training step, median ({params / 1e6:,.1f}M params, bf16, "
                          f"batch {shape.batch} x {shape.seq} tokens)",
                          f"{step_time * 1e3:.1f} ms without a monitor ({len(baseline)} steps); "
                          f"{statistics.median(with_monitors) * 1e3:.1f} ms with two attached "
                          f"({len(with_monitors)} steps, their own steps timed apart)"))
    for every, steps in records.items():
        scans = [s.seconds for s in steps if s.scanned]
        if not scans:
            check.rows.append(Row(part, f"live every={every}: overhead", f"no pair in {check.steps} steps",
                                  f"≤ {OVERHEAD_TARGETS[every]:.1%}", "NOT RUN"))
            continue
        cost = statistics.median(scans)
        share = cost / (every * step_time)
        first = next(s.seconds for s in steps if not s.scanned)
        check.rows.append(Row(part, f"live every={every}: monitored step / {every} training steps",
                              f"{cost * 1e3:.1f} ms (median of {len(scans)}; snapshot-only first step "
                              f"{first * 1e3:.1f} ms) = {share:.2%}", f"≤ {OVERHEAD_TARGETS[every]:.1%}",
                              verdict(share, OVERHEAD_TARGETS[every])))
        if check.cuda:
            extra = max(s.extra_bytes for s in steps)
            check.rows.append(Row(part, f"live every={every}: extra GPU memory (snapshot held on the GPU + step peak; "
                                  "a background scan's own shows in the run's peak below)",
                                  f"{_mib(extra)} = {extra / monitored_bytes:.2f}x the monitored tensors "
                                  f"({_mib(monitored_bytes)})", f"≤ {MEMORY_RATIO:g}x",
                                  verdict(extra / monitored_bytes, MEMORY_RATIO)))
        else:
            check.rows.append(Row(part, f"live every={every}: extra GPU memory", "n/a on the CPU"))
    if check.cuda:
        check.rows.append(Row(part, "peak GPU memory of the training run, with the monitors / without",
                              f"allocated {_mib(run_peak[0])} / {_mib(baseline_peak[0])}, "
                              f"reserved {_mib(run_peak[1])} / {_mib(baseline_peak[1])}"))

    for monitor in monitors.values():
        monitor.close()  # the last scans finish and the report files hold every pair
    for every, monitor in monitors.items():
        at_its_steps = [saved / f"checkpoint-{step}" for step in range(every, check.steps + 1, every)]
        run = symlink_run(live_dir / f"trend-{every}", at_its_steps)
        spec = resolve_run(run, probe=None, loss_log=None, config=None)
        offline = report_dict(scan(spec, ScanOptions(device=device), thresholds=Thresholds()))
        live = json.loads(monitor.report_path.read_text())
        check.rows.append(equality_row(part, f"live every={every} report vs `trend --device {device}` on the "
                                       f"{len(spec.checkpoints)} checkpoints saved at its steps",
                                       report_difference(comparable(live), comparable(offline))))


def _snapshot_bytes(monitor, on_gpu: bool = False) -> int:
    """The bytes of the snapshot a monitor holds; `on_gpu`: of those in GPU
    memory only (a snapshot in pinned host buffers holds none)."""
    if monitor.previous is None:
        return 0
    return sum(t.numel() * t.element_size() for t in monitor.previous.tensors._tensors.values()
               if not on_gpu or t.is_cuda)


def device_rows(device: str) -> list[Row]:
    """(d) What ran it."""
    rows = [Row("d", "machine", machine())]
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        rows.append(Row("d", "device", f"{props.name}, {props.total_memory / 2**30:.0f} GiB, "
                        f"compute capability {props.major}.{props.minor}"))
        rows.append(Row("d", "torch / CUDA / cuDNN", f"{torch.__version__} / {torch.version.cuda} / "
                        f"{torch.backends.cudnn.version()}"))
    else:
        rows.append(Row("d", "device", f"cpu ({torch.get_num_threads()} torch threads)"))
        rows.append(Row("d", "torch / CUDA", f"{torch.__version__} / {torch.version.cuda or 'none'}"))
    return rows


def _megabytes(nbytes: float) -> str:
    return f"{nbytes / 1e6:,.1f} MB"


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:,.0f} MiB"


def proxy_part(check: Check) -> None:
    """(e) The CPU proxies (bench/op_budget.py), whatever the device."""
    check.rows.extend(proxy_rows())


# Run order: live first, trend's 20 checkpoints after the diff, the CPU proxies (no GPU time) last.
PARTS = {"c": live_part, "a": diff_part, "b": trend_part, "e": proxy_part}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--shape", choices=tuple(SHAPES), default="1b", help="1b: the targets' shape; tiny: a dry run")
    parser.add_argument("--steps", type=int, default=400, help="training steps with the monitors attached")
    parser.add_argument("--checkpoints", type=int, default=20, help="checkpoints in the trend of part (b)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/ckptscan-gpu-check"),
                        help="generated checkpoints (kept and reused) and live-mode output")
    parser.add_argument("--timeout", type=int, default=540, help="seconds; parts not finished by then are NOT RUN")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"gpu_check: --device cuda, but torch {torch.__version__} sees no CUDA device here "
              "(a dry run: --device cpu --shape tiny)", file=sys.stderr)
        return 2
    if args.steps < max(OVERHEAD_TARGETS) * 2 or args.checkpoints < 2:
        print(f"gpu_check: need --steps ≥ {max(OVERHEAD_TARGETS) * 2} (a pair at every={max(OVERHEAD_TARGETS)}) "
              "and --checkpoints ≥ 2", file=sys.stderr)
        return 2
    check = Check(args.device, SHAPES[args.shape], args.steps, args.workdir, args.checkpoints)
    started = time.perf_counter()

    def out_of_time(*_: object) -> None:
        raise OutOfTime

    signal.signal(signal.SIGALRM, out_of_time)
    signal.alarm(args.timeout)
    try:
        for position, (part, run) in enumerate(PARTS.items()):
            print(f"part ({part}) ...", flush=True)
            try:
                run(check)
            except OutOfTime:
                for late in list(PARTS)[position:]:
                    check.rows.append(Row(late, "not finished", f"--timeout {args.timeout} s reached", "",
                                          "NOT RUN"))
                break
            except Exception as e:  # noqa: BLE001  one part's failure must not cost the GPU time of the others
                traceback.print_exc()
                check.rows.append(Row(part, "error", f"{type(e).__name__}: {e}".splitlines()[0], "", "ERROR"))
            gc.collect()  # the live part's model and optimizer, before the scans measure GPU memory
            if check.cuda:
                torch.cuda.empty_cache()
    finally:
        signal.alarm(0)
    check.rows.extend(device_rows(args.device))
    title = (f"ckptscan GPU check: --device {args.device} --shape {args.shape} --steps {args.steps}, "
             f"{time.perf_counter() - started:.0f} s")
    if args.device == "cpu":
        title += ("\n\nDRY RUN on the CPU: the targets are GPU targets; these figures only show that "
                  "the script runs end to end.")
    print()
    print(table(check.rows, title))
    return exit_status(check.rows)


if __name__ == "__main__":
    sys.exit(main())
