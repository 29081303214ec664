"""Benchmark: the output family's compute on one pair of LM heads, this tree
against another revision, side by side in one run.

A 32,000 × 2,048 head (the Llama-3.2-1B shape) stored in bfloat16, a random
update of ≈1% relative size and a final-norm gain; `output_values` of the
pair (every output monitor, as a scan computes them), on one thread. Each
revision runs in a fresh child process, so its peak memory is its own: the
figure is the growth of the process's peak RSS over its RSS with both heads
in memory (2 × 131 MB). The values both revisions report are compared.

    .venv/bin/python bench/output_head.py [--before 2d305f8] [--vocab 32000] [--width 2048]

About 15 s for this tree alone (the fastest of --reps 5); a revision that
forms the float64 d × d Gram of the update (V·d² multiply-adds) adds ~20 s
on one core, run once.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def child(vocab: int, width: int, spectrum: bool, reps: int) -> None:
    """In a fresh process whose path starts with the source tree: one pair, the fastest of reps."""
    import torch

    from ckptscan.layouts import LayerWeights
    from ckptscan.monitors.output_family import output_values

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    a = torch.empty(vocab, width, dtype=torch.bfloat16)
    b = torch.empty(vocab, width, dtype=torch.bfloat16)
    for lo in range(0, vocab, 1024):  # built a block at a time: no float32 copy raises the peak before the timing
        rows = torch.randn(min(1024, vocab - lo), width, generator=gen) * 0.02
        a[lo:lo + 1024] = rows
        b[lo:lo + 1024] = rows + torch.randn(rows.shape, generator=gen) * 2e-4
    gain = 1.0 + 0.1 * torch.rand(width, generator=gen)
    older, newer = LayerWeights(head=a, final_gain=gain), LayerWeights(head=b, final_gain=gain)
    before = _rss_mb()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        values = output_values(older, newer, spectrum=True) if spectrum else output_values(older, newer)
        times.append(time.perf_counter() - start)
    seconds = min(times)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "peak_extra_mb": peak - before, "values": values}))


def run(source: Path, vocab: int, width: int, reps: int = 1, spectrum: bool = False) -> dict:
    env = {**os.environ, "PYTHONPATH": str(source), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, __file__, "--child", "--vocab", str(vocab), "--width", str(width),
                           "--reps", str(reps), *(["--spectrum"] if spectrum else [])],
                          env=env, capture_output=True, text=True, cwd=source, check=False)
    if proc.returncode:
        raise SystemExit(f"{source}: {proc.stderr.strip().splitlines()[-1]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def export(revision: str, into: Path) -> Path:
    """The revision's ckptscan package, from `git archive` (the working tree untouched)."""
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", revision, "ckptscan"], capture_output=True, check=True)
    with tarfile.open(fileobj=BytesIO(tar.stdout)) as archive:
        archive.extractall(into, filter="data")
    return into


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", help="a git revision to compare with, e.g. 2d305f8")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--reps", type=int, default=5, help="runs of this tree, the fastest counted (the "
                        "revision before runs once: at tens of seconds, load matters less)")
    parser.add_argument("--spectrum", action="store_true", help="this tree also with the update spectrum asked for")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        sys.path.insert(0, os.getcwd())
        child(args.vocab, args.width, args.spectrum, args.reps)
        return
    print(f"output family, head {args.vocab} × {args.width} bfloat16, one thread, load {os.getloadavg()[0]:.2f}")
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        if args.before:
            rows[f"{args.before} (before)"] = run(export(args.before, Path(tmp)), args.vocab, args.width)
        rows["this tree"] = run(ROOT, args.vocab, args.width, args.reps)
        if args.spectrum:
            rows["this tree, spectrum=True"] = run(ROOT, args.vocab, args.width, spectrum=True)
    print(f"load after: {os.getloadavg()[0]:.2f}")
    print(f"{'':<28}{'seconds':>10}{'peak extra MB':>16}")
    for name, row in rows.items():
        print(f"{name:<28}{row['seconds']:>10.2f}{row['peak_extra_mb']:>16.0f}")
    now = rows["this tree"]
    for name, row in rows.items():
        shared = [k for k, v in now["values"].items() if v is not None and row["values"].get(k) is not None]
        if row is not now and shared:
            worst = max(abs(row["values"][k] - now["values"][k]) / abs(now["values"][k]) for k in shared)
            print(f"{name} / this tree: time {row['seconds'] / now['seconds']:.1f}x, largest relative difference "
                  f"over the {len(shared)} values both report {worst:.1e}")
    print("values (this tree):", {k: None if v is None else float(f"{v:.6g}") for k, v in
                                  rows["this tree"]["values"].items() if v is None or math.isfinite(v)})


if __name__ == "__main__":
    main()
