"""Benchmark: `ckptscan watch`, from a checkpoint becoming complete to its row printed.

    .venv/bin/python bench/watch_latency.py            # 6 checkpoints of a ~100M-parameter model

A writer (this process) saves checkpoints into a run directory the way a
trainer does (config, then each shard written in 16 MB blocks, the index
last) while `ckptscan watch` runs as a child process; this process reads the
child's stdout and notes when each row arrives. Measured side by side in one
run, for each way of waiting:

* inotify: watchdog events, the default (`--settle 0.5`: a checkpoint without
  a pointer file counts as complete once its files stayed unchanged 0.5 s);
* inotify + pointer file: the writer also writes Megatron's
  latest_checkpointed_iteration.txt after the last shard, as Megatron and
  DeepSpeed do: complete at once, no settling;
* polling: `--poll --interval 2` (the default interval).

The delay counts from the moment the last byte of the checkpoint is written
(the index closed, or the pointer written). The goal (issue #19): with
inotify, at most one scan of that pair + 1 s, where "one scan" is measured
here too: `compute` of that pair alone, in this process, files in the page
cache (as they are for the watcher, which reads what was just written).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import load_average, machine  # noqa: E402
from synthetic import ModelSpec, ensure_run  # noqa: E402

from ckptscan.pipeline.metrics import compute  # noqa: E402
from ckptscan.pipeline.run import resolve_pair  # noqa: E402
from ckptscan.scan import ScanOptions  # noqa: E402

# 8 layers, hidden 1024, 16 heads / 4 KV heads, MLP 2816, vocab 8000: ~106M
# parameters, ~210 MB per checkpoint in bf16 (every tensor present).
MODEL = ModelSpec("watch-bench-100m", "llama", 8, 1024, 16, 4, 2816, 8000)
BLOCK = 16 << 20
MODES = {
    "inotify": [],
    "inotify + pointer file": [],
    "polling (--interval 2)": ["--poll", "--interval", "2"],
}
POINTER = "latest_checkpointed_iteration.txt"


class Rows(threading.Thread):
    """The child's stdout: for each row, the monotonic time it arrived."""

    def __init__(self, stream):
        super().__init__(daemon=True)
        self.stream, self.arrived, self.changed = stream, {}, threading.Condition()

    def run(self) -> None:
        for line in self.stream:
            match = re.match(r"^\s*(\d+) \d+→\d+\s", line)
            with self.changed:
                if match:
                    self.arrived[int(match.group(1))] = time.monotonic()
                self.changed.notify_all()

    def wait_for(self, step: int, guard: float = 600) -> float:
        with self.changed:
            if not self.changed.wait_for(lambda: step in self.arrived, guard):
                raise SystemExit(f"no row for step {step} within {guard} s")
            return self.arrived[step]


def save(source: Path, target: Path) -> None:
    """Write a checkpoint as a trainer does: config first, shards in blocks, the index last."""
    target.mkdir(parents=True)
    files = sorted(source.iterdir(), key=lambda f: (f.name.endswith(".index.json"), f.name))
    for file in files:
        with file.open("rb") as src, (target / file.name).open("wb") as dst:
            while block := src.read(BLOCK):
                dst.write(block)


def scan_seconds(older: Path, newer: Path, rounds: int = 3) -> float:
    """One pair computed alone (no cache), best of `rounds`."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        compute(resolve_pair(older, newer, config=None), ScanOptions())
        best = min(best, time.perf_counter() - start)
    return best


def follow(mode: str, flags: list[str], checkpoints: list[Path], workdir: Path) -> list[float]:
    """Delays (s) from each new checkpoint's completion to its row, after the first pair."""
    run = workdir / mode.split()[0]
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    pointer = "pointer" in mode
    for path in checkpoints[:2]:
        save(path, run / path.name)
    if pointer:
        (run / POINTER).write_text(checkpoints[1].name.split("-")[1])
    child = subprocess.Popen([sys.executable, "-m", "ckptscan", "watch", str(run), "--no-cache", *flags],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    rows = Rows(child.stdout)
    rows.start()
    try:
        step = lambda path: int(path.name.split("-")[1])  # noqa: E731
        rows.wait_for(step(checkpoints[1]))
        delays = []
        for path in checkpoints[2:]:
            save(path, run / path.name)
            if pointer:
                (run / POINTER).write_text(str(step(path)))
            complete = time.monotonic()
            delays.append(rows.wait_for(step(path)) - complete)
        return delays
    finally:
        child.terminate()
        child.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/ckptscan-bench"))
    parser.add_argument("-n", type=int, default=6, help="checkpoints per mode (the first two are there at start)")
    args = parser.parse_args()
    checkpoints = ensure_run(MODEL, args.cache / "watch-source", [100 * k for k in range(args.n)])
    print(f"machine: {machine()}; load average {load_average()}")
    print(f"model: {MODEL.name}, {MODEL.total_bytes() / 1e6:.0f} MB per checkpoint; "
          f"{args.n - 2} checkpoints saved while watching, per mode")
    scan = scan_seconds(checkpoints[-2], checkpoints[-1])
    print(f"one scan of a pair (compute, warm page cache, best of 3): {scan:.2f} s")
    with tempfile.TemporaryDirectory(dir=args.cache) as workdir:
        for mode, flags in MODES.items():
            delays = follow(mode, flags, checkpoints, Path(workdir))
            print(f"{mode:24s} completion → row: median {statistics.median(delays):.2f} s, max {max(delays):.2f} s; "
                  f"minus one scan: median {statistics.median(delays) - scan:.2f} s, max {max(delays) - scan:.2f} s  "
                  f"({', '.join(f'{d:.2f}' for d in delays)})")
    print("goal with inotify: ≤ one scan + 1 s")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONPATH", str(Path(__file__).resolve().parent.parent))
    main()
