"""Benchmark 2: `ckptscan trend` over a run of 2N checkpoints of a ~1B model.

    .venv/bin/python bench/trend_run.py        # N = 10: runs of 10 and 20 checkpoints

Generates (once, cached under --cache) 2N checkpoints of a TinyLlama-1.1B-
shaped model (22 layers, hidden 2048, 32 heads / 4 KV heads, intermediate
5632, vocab 32000; every tensor present, bf16, ~2.2 GB each) whose monitored
tensors follow a random walk, then measures side by side in one run:

* reads per checkpoint: an in-process scan with every checkpoint's tensor
  source wrapped in a counter, and every `os.preadv` byte counted: each
  monitored tensor must be read exactly once, and the bytes must equal the
  monitored bytes;
* time per checkpoint and N -> 2N scaling: `ckptscan trend --no-cache` on a
  run directory of the first N checkpoints and on all 2N (cold: files evicted
  from the page cache first; and warm), --rounds times interleaved, the
  minimum counting (the machine is shared);
* the cache: `ckptscan trend --cache-dir` on N, then on 2N (only the new
  pairs should cost), then on 2N again (nothing new).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import evict, load_average, machine, run_child, startup_seconds, symlink_run  # noqa: E402
from synthetic import LLAMA_1B, ensure_run  # noqa: E402

from ckptscan.readers import open_checkpoint  # noqa: E402
from ckptscan.scan import ScanOptions, scan_layers  # noqa: E402


class CountingSource:
    """Counts `get` calls per tensor on one checkpoint's tensor source."""

    def __init__(self, inner):
        self.inner, self.reads = inner, Counter()

    def get(self, name, rows=None):
        self.reads[name] += 1
        return self.inner.get(name, rows=rows)

    def __getattr__(self, attr):
        return getattr(self.inner, attr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/ckptscan-bench"))
    parser.add_argument("-n", type=int, default=10, help="N: the runs have N and 2N checkpoints")
    parser.add_argument("--rounds", type=int, default=2, help="repeat the uncached runs; the minimum counts")
    parser.add_argument("--delete-after", action="store_true")
    args = parser.parse_args()
    spec = LLAMA_1B
    print(f"machine: {machine()}")
    print(f"load average before: {load_average()}")
    steps = [100 * (i + 1) for i in range(2 * args.n)]
    t0 = time.perf_counter()
    paths = ensure_run(spec, args.cache / f"{spec.name}-run", steps)
    print(f"{len(paths)} checkpoints ready in {time.perf_counter() - t0:.0f} s ({spec.total_bytes() / 1e9:.2f} GB each)",
          flush=True)
    runs = {count: symlink_run(args.cache / f"{spec.name}-run-{count}", paths[:count]) for count in (args.n, 2 * args.n)}
    files = [f for p in paths for f in p.glob("*.safetensors")]
    figures, notes = {}, []

    reads = count_reads(paths)
    notes.append(reads)
    print(reads, flush=True)

    # Interleaved rounds on a shared machine; the minimum of each figure counts.
    timed: dict[str, list[float]] = {}
    for round_ in range(args.rounds):
        for state in ("cold", "warm"):
            for count, run_dir in runs.items():
                if state == "cold":
                    evict(files)
                timed.setdefault(f"trend_{count}_{state}_s", []).append(_trend(run_dir, ["--no-cache"]).wall_s)
                print(f"round {round_ + 1}: trend {count} checkpoints {state}: "
                      f"{timed[f'trend_{count}_{state}_s'][-1]:.1f} s", flush=True)
    figures.update({key: min(values) for key, values in timed.items()})
    notes.append(f"{args.rounds} rounds, min used; per round (s): " + "; ".join(
        f"{key.removeprefix('trend_').removesuffix('_s')} " + "/".join(f"{x:.1f}" for x in values)
        for key, values in timed.items()))

    with tempfile.TemporaryDirectory() as cache_dir:
        for label, count in (("cache_first_n", args.n), ("cache_then_2n", 2 * args.n), ("cache_again_2n", 2 * args.n)):
            run = _trend(runs[count], ["--cache-dir", cache_dir])
            figures[label + "_s"] = run.wall_s
            hits = [line for line in run.output.splitlines() if line.startswith("cache:")]
            notes.append(f"{label}: {run.wall_s:.1f} s, {hits[0] if hits else 'no cache line'}")
            print(notes[-1], flush=True)

    print(f"load average after: {load_average()}")
    notes.append(f"start-up of the ckptscan command (`ckptscan --help`), inside every trend time above: "
                 f"{startup_seconds(sys.executable):.1f} s")
    print()
    print(table(figures, notes, args.n, spec))
    if args.delete_after:
        for run_dir in runs.values():
            shutil.rmtree(run_dir)
        shutil.rmtree(args.cache / f"{spec.name}-run")


def _trend(run_dir: Path, extra: list[str]):
    with tempfile.TemporaryDirectory() as tmp:
        run = run_child([sys.executable, "-m", "ckptscan", "trend", str(run_dir), "--json", f"{tmp}/r.json", *extra])
    if run.returncode not in (0, 1):
        raise SystemExit(f"ckptscan trend failed ({run.returncode}):\n{run.output[-3000:]}")
    return run


def count_reads(paths: list[Path]) -> str:
    """Scan the whole run in-process, counting gets per tensor and preadv bytes."""
    checkpoints = [open_checkpoint(p) for p in paths]
    for ckpt in checkpoints:
        ckpt.tensors = CountingSource(ckpt.tensors)
    read_bytes = [0]
    real_preadv = os.preadv

    def counting_preadv(fd, buffers, offset, *rest):
        got = real_preadv(fd, buffers, offset, *rest)
        read_bytes[0] += got
        return got

    os.preadv = counting_preadv
    try:
        start = time.perf_counter()
        scan_layers(checkpoints, [(i, i + 1) for i in range(len(checkpoints) - 1)], ScanOptions())
        seconds = time.perf_counter() - start
    finally:
        os.preadv = real_preadv
    monitored = {name for name, _, m in LLAMA_1B.tensors() if m}
    per_tensor = Counter(n for c in checkpoints for n in c.tensors.reads.values())
    unmonitored = sum(1 for c in checkpoints for name in c.tensors.reads if name not in monitored)
    expected = LLAMA_1B.monitored_bytes() * len(paths)
    return (f"reads: {len(paths)} checkpoints, {len(monitored)} monitored tensors each; reads per (checkpoint, "
            f"tensor): {dict(per_tensor)}; unmonitored tensors read: {unmonitored}; bytes read {read_bytes[0]:,} "
            f"= {read_bytes[0] / expected:.4f} x the monitored bytes ({expected:,}); in-process scan {seconds:.1f} s")


def table(f: dict[str, float], notes: list[str], n: int, spec) -> str:
    lines = [f"| {spec.name}, {spec.total_bytes() / 1e9:.1f} GB/checkpoint | cold page cache | warm page cache |",
             "|---|---|---|"]
    for label, key in ((f"`trend` of {n} checkpoints", n), (f"`trend` of {2 * n} checkpoints", 2 * n)):
        lines.append(f"| {label} | {f[f'trend_{key}_cold_s']:.1f} s | {f[f'trend_{key}_warm_s']:.1f} s |")
    lines.append(f"| time per checkpoint ({2 * n}-run) | {f[f'trend_{2 * n}_cold_s'] / (2 * n):.2f} s "
                 f"| {f[f'trend_{2 * n}_warm_s'] / (2 * n):.2f} s |")
    lines.append(f"| scaling {n} -> {2 * n} checkpoints | {f[f'trend_{2 * n}_cold_s'] / f[f'trend_{n}_cold_s']:.2f}x "
                 f"| {f[f'trend_{2 * n}_warm_s'] / f[f'trend_{n}_warm_s']:.2f}x |")
    lines += ["", "| cached runs (warm page cache) | wall | vs uncached 2N |", "|---|---|---|"]
    uncached = f[f"trend_{2 * n}_warm_s"]
    for label, key in ((f"first {n} checkpoints, empty cache", "cache_first_n"),
                       (f"all {2 * n}, first {n} cached", "cache_then_2n"),
                       (f"all {2 * n} again, all cached", "cache_again_2n")):
        lines.append(f"| {label} | {f[key + '_s']:.1f} s | {f[key + '_s'] / uncached:.2f}x |")
    lines.append("")
    lines.extend(f"- {note}" for note in notes)
    return "\n".join(lines)


if __name__ == "__main__":
    main()
