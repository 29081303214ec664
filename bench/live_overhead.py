"""Benchmark: what live mode costs a training run.

    .venv/bin/python bench/live_overhead.py                    # sample model and a 1B-shaped Llama
    .venv/bin/python bench/live_overhead.py --models sample    # quick

For each model, in one process and side by side:

* the training step: forward + backward + optimizer step on one batch
  (the minimum over --train-steps steps after one warm-up step);
* one monitored step of `ckptscan.live.Monitor`: snapshot of the monitored
  tensors, the pair's scan on the scan core, judging the series, writing the
  report (the minimum over --rounds monitored steps, each after a training
  step, so every pair is a real update);
* the amortised overhead at every=50 and every=200: monitored step /
  (every × training step);
* peak extra memory of a monitored step: the two snapshots held (exact
  bytes) and the peak resident-set (CPU, sampled every 2 ms) or the peak
  allocated CUDA memory above what training holds (GPU).

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
        monitor = Monitor(model, every=1, out=out, config=config, thresholds=Thresholds())
        monitor.step(1)  # the first snapshot (no pair yet)
        seconds, peaks = [], []
        for step in range(2, args.rounds + 2):
            train_step()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            with PeakRss() as rss_peak:
                started = time.perf_counter()
                monitor.step(step)
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
                seconds.append(time.perf_counter() - started)
            peaks.append(torch.cuda.max_memory_allocated() - base if device.startswith("cuda")
                         else rss_peak.peak - rss_peak.start)
        snapshot_bytes = sum(t.numel() * t.element_size() for t in monitor.previous.tensors._tensors.values())
        history = {n: judge_and_write(monitor, n, out) for n in args.history}
    monitored = min(seconds)
    return {
        "model": name, "device": device, "params": sum(p.numel() for p in model.parameters()),
        "monitored_tensors": len(monitor.view.monitored), "train_step_s": train, "monitor_step_s": monitored,
        "monitor_spread_s": (min(seconds), max(seconds)),
        "overhead_50": monitored / (50 * train), "overhead_200": monitored / (200 * train),
        "snapshots_held_bytes": 2 * snapshot_bytes, "peak_extra_bytes": max(peaks), "history": history,
    }


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
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {device}, "
          f"load average {os.getloadavg()[0]:.1f}")
    for name in args.models.split(","):
        r = measure(name, device, args)
        print(f"{r['model']:6s} {r['params'] / 1e6:8.1f}M params, {r['monitored_tensors']} monitored tensors | "
              f"train step {r['train_step_s'] * 1e3:9.1f} ms | monitored step {r['monitor_step_s'] * 1e3:8.1f} ms "
              f"(spread {r['monitor_spread_s'][0] * 1e3:.1f}–{r['monitor_spread_s'][1] * 1e3:.1f}) | "
              f"overhead every=50 {r['overhead_50']:.3%}, every=200 {r['overhead_200']:.3%} | "
              f"snapshots held {r['snapshots_held_bytes'] / 2**20:.1f} MiB, "
              f"peak extra {r['peak_extra_bytes'] / 2**20:.1f} MiB")
        print("       judge + rewrite the report at " + ", ".join(
            f"{n} pairs: {t * 1e3:.0f} ms" for n, t in r["history"].items()))
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
