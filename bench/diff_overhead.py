"""Benchmark: `ckptscan diff` on a 1B-shaped bf16 pair against the floor a
user could write by hand, the start-up cost, and whether the two layer
workers' eigensolves overlap.

Measured side by side in one run, in interleaved rounds (the minimum of each
figure counts), on this shared machine:

* `ckptscan diff A B --json F` as a whole process, and a minimal script
  (`bench/minimal_diff.py`: Python + torch + safetensors reading the same
  q/k bytes and the LM head's, solving the same per-head cores and the
  head's one pass with ckptscan's monitor functions, one plain loop) as a
  whole process. Both include start-up; each one's peak RSS is reported.
  Target (issue #50): ckptscan ≤ 1.2× the minimal script, ≤ 600 MB.
* the same diff of another revision (`--before REV`, e.g. the commit before
  the run-spec redesign), checked out into a temporary worktree and run with
  the same interpreter: the before/after ratio.
* the worker overlap: one layer's cores solved on one thread (t1), then two
  layers on two threads at once (t2). t2/t1 ≈ 1 means the two solves ran
  side by side; ≈ 2 means they were serialised (a lock held across them).
* `ckptscan --help` and `--version` wall time (target ≤ 0.3 s).

    python bench/diff_overhead.py [--before 2ac9f66] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from measure import load_average, machine, run_child  # noqa: E402
from synthetic import LLAMA_1B, ensure_run  # noqa: E402

OVERLAP = """
import sys, threading, time, torch
torch.set_num_threads(1)
from ckptscan.monitors.attention import qk_spectra
g = torch.Generator().manual_seed(0)
H, G, r, d = 32, 4, 64, 2048
def layer():
    q = torch.randn(H, r, d, generator=g) * 0.02
    k = torch.randn(G, r, d, generator=g) * 0.02
    return q, k, q + torch.randn(H, r, d, generator=g) * 3e-4, k + torch.randn(G, r, d, generator=g) * 3e-4
layers = [layer(), layer()]
solve = lambda w: qk_spectra(*w, compute_dtype=torch.float64)
solve(layers[0])
best1 = best2 = float("inf")
for _ in range(3):
    t = time.perf_counter(); solve(layers[0]); best1 = min(best1, time.perf_counter() - t)
    threads = [threading.Thread(target=solve, args=(w,)) for w in layers]
    t = time.perf_counter()
    for th in threads: th.start()
    for th in threads: th.join()
    best2 = min(best2, time.perf_counter() - t)
print(best1, best2)
"""


def overlap(python: str, source: Path) -> tuple[float, float]:
    env = {**os.environ, "PYTHONPATH": str(source)}
    # cwd = the source: Python puts the working directory first on sys.path.
    out = subprocess.run([python, "-c", OVERLAP], env=env, capture_output=True, text=True, check=True,
                         cwd=source).stdout
    one, two = map(float, out.split())
    return one, two


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/ckptscan-bench"))
    parser.add_argument("--before", default=None, help="a git revision to compare with (e.g. 2ac9f66), or a "
                        "directory holding that revision's ckptscan/ package")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    python = sys.executable
    print(f"machine: {machine()}")
    print(f"load average before: {load_average()}")
    a, b = ensure_run(LLAMA_1B, args.cache / f"{LLAMA_1B.name}-run", [100, 200])
    sources = {"after": ROOT}
    with tempfile.TemporaryDirectory() as tmp:
        worktree = None
        if args.before and Path(args.before).is_dir():
            sources["before"] = Path(args.before).resolve()
        elif args.before:
            worktree = Path(tmp) / "before"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(worktree), args.before],
                           check=True)
            sources["before"] = worktree
        try:
            timed: dict[str, list[float]] = {}
            peaks: dict[str, list[int]] = {}
            for _ in range(args.rounds):
                for name, source in sources.items():
                    env_cmd = ["env", f"PYTHONPATH={source}", python, "-m", "ckptscan"]
                    # cwd = the source: Python puts the working directory first on sys.path.
                    run = run_child([*env_cmd, "diff", str(a), str(b), "--json", f"{tmp}/{name}.json"], cwd=source)
                    if run.returncode not in (0, 1):
                        raise SystemExit(f"{name} diff failed:\n{run.output[-2000:]}")
                    timed.setdefault(f"diff {name}", []).append(run.wall_s)
                    peaks.setdefault(f"diff {name}", []).append(run.peak_rss_bytes)
                    one, two = overlap(python, source)
                    timed.setdefault(f"overlap {name}", []).append(two / one)
                minimal = run_child([python, str(HERE / "minimal_diff.py"), str(a), str(b)])
                if minimal.returncode != 0:
                    raise SystemExit(f"minimal script failed:\n{minimal.output[-2000:]}")
                timed.setdefault("minimal", []).append(minimal.wall_s)
                peaks.setdefault("minimal", []).append(minimal.peak_rss_bytes)
                for flag in ("--help", "--version"):
                    for name, source in sources.items():
                        env_cmd = ["env", f"PYTHONPATH={source}", python, "-m", "ckptscan", flag]
                        wall = min(run_child(env_cmd, cwd=source).wall_s for _ in range(3))
                        timed.setdefault(f"{flag} {name}", []).append(wall)
        finally:
            if worktree is not None:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)])
    best = {name: min(values) for name, values in timed.items()}
    print(f"load average after: {load_average()}")
    print(f"\n1B-shaped bf16 pair ({LLAMA_1B.layers} layers, {LLAMA_1B.heads} heads / {LLAMA_1B.kv_heads} KV, "
          f"d={LLAMA_1B.hidden}); minimum of {args.rounds} interleaved rounds")
    print(f"{'figure':<28}{'seconds / ratio':>18}")
    for name, value in best.items():
        unit = "" if name.startswith("overlap") else " s"
        print(f"{name:<28}{value:>16.3f}{unit}")
    for name, values in peaks.items():
        print(f"{'peak RSS ' + name:<28}{max(values) / 1e6:>16.0f} MB")
    print(f"{'diff after / minimal':<28}{best['diff after'] / best['minimal']:>16.3f}x  (target ≤ 1.2)")
    if "diff before" in best:
        print(f"{'diff before / minimal':<28}{best['diff before'] / best['minimal']:>16.3f}x")
    print("overlap = (two layers on two threads) / (one layer on one thread): 1.0 side by side, 2.0 serialised")


if __name__ == "__main__":
    main()
