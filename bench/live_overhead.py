"""Benchmark: what live mode costs a training run.

    .venv/bin/python bench/live_overhead.py                    # sample model and a 1B-shaped Llama
    .venv/bin/python bench/live_overhead.py --models sample    # quick

For each model, in one process and side by side:

* the training step: forward + backward + optimizer step on one batch
  (the minimum over --train-steps steps after one warm-up step);
* one monitored step of `ckptscan.live.Monitor`, two ways: scanning inside
  the step (`background=False`: snapshot, the pair's scan on the scan core,
  judging the series, writing the report; what every monitored step cost
  before live mode scanned in the background) and as a training loop sees
  it (the default: the snapshot, handed to the scan's thread, the previous
  scan having ended). The minimum over --rounds monitored steps, each after
  a training step, so every pair is a real update;
* the amortised overhead at every=50 and every=200 of each: monitored
  step / (every × training step);
* peak extra memory of a monitored step: the two snapshots held (exact
  bytes) and the peak resident-set (CPU, sampled every 2 ms) or the peak
  allocated CUDA memory above what training holds (GPU).

With --loop, the whole cost in a training loop, which a monitored step's
time alone does not show on a CPU (the background scan shares the cores
and the GIL with training): for each `every` of --every, blocks of
4 × every training steps without a monitor and with one (its `close()`, the
last scan waited for, inside the timed block), alternated --repeats times;
the overhead is the median block with the monitor over the median without.
Also reported: the monitored steps' own time (snapshot + any wait for the
previous scan) and the training steps' median with and without. Works on a
Monitor without `background` / `waited` too (an older checkout, for a
before/after pair of runs).

Models: "sample" is the shipped sample runs' tiny Mixtral (experiments/);
"1b" is a Llama with Llama-3.2-1B's shape (hidden 2048, 16 layers, 32 query /
8 KV heads of 64, FFN 8192, vocab 32000; ~1.1B parameters), trained with
plain SGD to keep its memory down (AdamW would only make the training step
slower, and the overhead smaller). The device is the GPU when there is one
(--device). The machine may be shared: the load average is printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch

from ckptscan.pipeline.metrics import Metrics
from ckptscan.detection.judge import judge
from ckptscan.detection.rules import Thresholds
from ckptscan.live import Monitor
from ckptscan.live.report_file import ReportFile
from ckptscan.schema.results import CheckpointRef


def sample_model() -> tuple[torch.nn.Module, dict, int, int]:
    from experiments.model import MixtralConfig, MixtralForCausalLM

    cfg = MixtralConfig()
    model = MixtralForCausalLM(cfg)
    return model, cfg.to_hf("float32"), cfg.vocab_size, 64


def llama_1b() -> tuple[torch.nn.Module, dict, int, int]:
    import transformers

    config = transformers.LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                      num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                                      vocab_size=32000, max_position_embeddings=2048, tie_word_embeddings=True)
    return transformers.LlamaForCausalLM(config), config.to_dict(), config.vocab_size, 128


MODELS = {"sample": sample_model, "1b": llama_1b}


def logits_of(output) -> torch.Tensor:
    return output[0] if isinstance(output, tuple) else output.logits


class PeakRss:
    """Peak resident set of this process while the block runs (sampled)."""

    def __enter__(self) -> "PeakRss":
        self.start = self.peak = rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, rss())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss())


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(name: str, device: str, args: argparse.Namespace) -> dict:
    torch.manual_seed(0)
    model, config, vocab, seq = MODELS[name]()
    model.to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4) if name == "1b" else torch.optim.AdamW(model.parameters())
    gen = torch.Generator().manual_seed(0)

    def train_step() -> float:
        x = torch.randint(0, vocab, (args.batch, seq), generator=gen).to(device)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        started = time.perf_counter()
        logits = logits_of(model(x))
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, vocab).float(), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - started

    train_step()  # warm-up: allocator, optimizer state
    train = min(train_step() for _ in range(args.train_steps))
    with tempfile.TemporaryDirectory() as out:
        inline = Monitor(model, every=1, out=f"{out}/inline", config=config, thresholds=Thresholds(),
                         background=False)
        monitor = Monitor(model, every=1, out=f"{out}/background", config=config, thresholds=Thresholds())
        inline.step(1)  # the first snapshots (no pair yet)
        monitor.step(1)
        seconds, snapshot_seconds, peaks = [], [], []
        for step in range(2, args.rounds + 2):
            train_step()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            with PeakRss() as rss_peak:
                seconds.append(timed(inline, step, device))
            peaks.append(torch.cuda.max_memory_allocated() - base if device.startswith("cuda")
                         else rss_peak.peak - rss_peak.start)
            monitor.wait()  # the previous scan has ended: the step itself, as a training loop sees it
            snapshot_seconds.append(timed(monitor, step, device))
        monitor.close()
        snapshot_bytes = sum(t.numel() * t.element_size() for t in inline.previous.tensors._tensors.values())
        history = {n: judge_and_write(inline, n, out) for n in args.history}
    monitored, snapshot = min(seconds), min(snapshot_seconds)
    return {
        "model": name, "device": device, "params": sum(p.numel() for p in model.parameters()),
        "monitored_tensors": len(inline.view.monitored), "train_step_s": train, "monitor_step_s": monitored,
        "monitor_spread_s": (min(seconds), max(seconds)), "snapshot_step_s": snapshot,
        "overhead_50": monitored / (50 * train), "overhead_200": monitored / (200 * train),
        "snapshot_overhead_50": snapshot / (50 * train), "snapshot_overhead_200": snapshot / (200 * train),
        "snapshots_held_bytes": 2 * snapshot_bytes, "peak_extra_bytes": max(peaks), "history": history,
    }


def timed(monitor: Monitor, step: int, device: str) -> float:
    started = time.perf_counter()
    monitor.step(step)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - started


def loop(name: str, device: str, args: argparse.Namespace) -> list[dict]:
    """The --loop measurement (module docstring): one row per `every`."""
    torch.manual_seed(0)
    model, config, vocab, seq = MODELS[name]()
    model.to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4) if name == "1b" else torch.optim.AdamW(model.parameters())
    gen = torch.Generator().manual_seed(0)

    def train_step() -> float:
        x = torch.randint(0, vocab, (args.batch, seq), generator=gen).to(device)
        started = time.perf_counter()
        logits = logits_of(model(x))
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, vocab).float(), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - started

    def block(steps: int, monitor: Monitor | None) -> tuple[float, list[float]]:
        started, times = time.perf_counter(), []
        for step in range(1, steps + 1):
            times.append(train_step())
            if monitor is not None:
                monitor.step(step)
        if monitor is not None:
            monitor.close()
        return time.perf_counter() - started, times

    for _ in range(3):
        train_step()  # warm-up
    rows = []
    with tempfile.TemporaryDirectory() as out:
        for every in args.every:
            steps = 4 * every
            plain, with_monitor, plain_steps, monitored_steps, step_seconds, waits = [], [], [], [], [], []
            for repeat in range(args.repeats):
                seconds, times = block(steps, None)
                plain.append(seconds)
                plain_steps += times
                monitor = Monitor(model, every=every, out=f"{out}/{every}-{repeat}", config=config,
                                  thresholds=Thresholds())
                seconds, times = block(steps, monitor)
                with_monitor.append(seconds)
                monitored_steps += times
                step_seconds += monitor.seconds
                waits += getattr(monitor, "waited", [])
            rows.append({"every": every, "steps": steps, "plain_s": statistics.median(plain),
                         "monitor_s": statistics.median(with_monitor),
                         "overhead": statistics.median(with_monitor) / statistics.median(plain) - 1,
                         "spread": (min(with_monitor) / max(plain) - 1, max(with_monitor) / min(plain) - 1),
                         "train_step_plain_s": statistics.median(plain_steps),
                         "train_step_monitored_s": statistics.median(monitored_steps),
                         "monitored_step_s": statistics.median(step_seconds),
                         "waited_s": sum(waits), "waits": sum(w > 0 for w in waits)})
    return rows


def judge_and_write(monitor: Monitor, pairs: int, out: str) -> float:
    """Seconds to judge a series of `pairs` intervals and rewrite its report
    as a monitored step does, the report of the first pairs - 1 having been
    written at the step before: the part of a monitored step that grows with
    the run (the newest real pair repeated, at later steps)."""
    newest = monitor.pairs[-1]
    series = [dataclasses.replace(newest, from_step=i * monitor.every, to_step=(i + 1) * monitor.every)
              for i in range(pairs)]
    refs = [CheckpointRef(f"live:step-{i}", i) for i in range(pairs + 1)]
    file = ReportFile(Path(out) / "history.json")

    def step(n: int) -> None:
        metrics = Metrics(kind="run", model=monitor.report.model, checkpoints=refs[:n + 1], pairs=series[:n])
        file.write(judge(metrics, monitor.thresholds))

    step(pairs - 1)
    started = time.perf_counter()
    step(pairs)
    return time.perf_counter() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="sample,1b")
    p.add_argument("--device", default="auto", help="cpu, cuda, or auto (cuda when there is one)")
    p.add_argument("--rounds", type=int, default=3, help="monitored steps timed (the minimum counts)")
    p.add_argument("--train-steps", type=int, default=2, help="training steps timed (the minimum counts)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--history", type=lambda v: [int(x) for x in v.split(",")], default=[10, 100, 500],
                   help="series lengths (pairs) at which to time judging + rewriting the report")
    p.add_argument("--loop", action="store_true", help="only the training-loop measurement (module docstring)")
    p.add_argument("--every", type=lambda v: [int(x) for x in v.split(",")], default=[50, 200],
                   help="--loop: the monitors' `every`")
    p.add_argument("--repeats", type=int, default=3, help="--loop: blocks with and without a monitor, alternated")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {device}, "
          f"load average {os.getloadavg()[0]:.1f}")
    for name in args.models.split(","):
        if args.loop:
            for r in loop(name, device, args):
                print(f"{name:6s} every={r['every']:<4d} {r['steps']} steps x {args.repeats}: "
                      f"{r['plain_s']:.2f} s without, {r['monitor_s']:.2f} s with the monitor (close included): "
                      f"overhead {r['overhead']:+.2%} (blocks' spread {r['spread'][0]:+.1%} … {r['spread'][1]:+.1%}) "
                      f"| training step median {r['train_step_plain_s'] * 1e3:.2f} ms without, "
                      f"{r['train_step_monitored_s'] * 1e3:.2f} ms with | monitored step median "
                      f"{r['monitored_step_s'] * 1e3:.2f} ms | waited {r['waited_s']:.2f} s at {r['waits']} steps")
            continue
        r = measure(name, device, args)
        print(f"{r['model']:6s} {r['params'] / 1e6:8.1f}M params, {r['monitored_tensors']} monitored tensors | "
              f"train step {r['train_step_s'] * 1e3:9.1f} ms | monitored step {r['monitor_step_s'] * 1e3:8.1f} ms "
              f"(spread {r['monitor_spread_s'][0] * 1e3:.1f}–{r['monitor_spread_s'][1] * 1e3:.1f}) | "
              f"overhead every=50 {r['overhead_50']:.3%}, every=200 {r['overhead_200']:.3%} | "
              f"in the background: step {r['snapshot_step_s'] * 1e3:.2f} ms, every=50 "
              f"{r['snapshot_overhead_50']:.3%}, every=200 {r['snapshot_overhead_200']:.3%} | "
              f"snapshots held {r['snapshots_held_bytes'] / 2**20:.1f} MiB, "
              f"peak extra {r['peak_extra_bytes'] / 2**20:.1f} MiB")
        print("       judge + rewrite the report at " + ", ".join(
            f"{n} pairs: {t * 1e3:.0f} ms" for n, t in r["history"].items()))
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
