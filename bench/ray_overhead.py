"""Benchmark 3: `--executor ray` next to the local executor, and a projection to frontier runs.

    .venv/bin/python bench/ray_overhead.py          # needs `pip install 'ckptscan[ray]'`

Measured on this machine, side by side, --rounds times interleaved, the
minimum counting (the machine is shared), warm page cache (both executors
read the same bytes; the question is the scheduling overhead):

* end to end: `ckptscan trend RUN --no-cache` against the same with
  `--executor ray`, which starts (and stops) a local Ray instance itself;
* on a running Ray (the cluster case: a cluster is up before the scan): in
  one process, `compute(spec)` against `compute(spec, executor=RayExecutor())`
  on a 2-CPU Ray instance whose workers have run one scan already;
* per-layer costs of a 70B- and a 405B-shaped layer on one thread (what one
  Ray task gets): the per-checkpoint Grams and the per-pair cores, on random
  bf16 weights in memory; and the cost of opening a checkpoint (headers).

Then projects the wall time of `trend` over 100 checkpoints on 1, 8 and 64
one-CPU workers, from those measured per-layer costs and a STATED storage
bandwidth per worker (not measured here: this machine has one local disk).

The run is TinyLlama-1.1B's attention stack (22 layers, d 2048, 32/4 heads,
bf16, every attention tensor, embeddings and head present) without the MLP
tensors: the scan never reads those, and leaving them out keeps 20
checkpoints at 14 GB instead of 44 GB on a shared disk. The scan reads the
same bytes as on the full model.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import load_average, machine, run_child  # noqa: E402
from synthetic import ModelSpec, ensure_run  # noqa: E402

from ckptscan.pipeline.metrics import compute  # noqa: E402
from ckptscan.executors.ray import TASKS_PER_CPU  # noqa: E402
from ckptscan.monitors.attention import qk_grams, qk_spectra  # noqa: E402
from ckptscan.monitors.spectral import spectral_stats  # noqa: E402
from ckptscan.system.parallel import torch_threads  # noqa: E402
from ckptscan.readers import open_checkpoint  # noqa: E402
from ckptscan.pipeline.run import resolve_run  # noqa: E402

LLAMA_1B_ATTENTION = ModelSpec("llama-1.1b-attn", "llama", 22, 2048, 32, 4, 0, 32000)
# Layer shapes of the projection (Llama-3 70B and 405B: GQA with 8 KV heads, head_dim 128).
FRONTIER = {"70B": ModelSpec("llama-70b", "llama", 80, 8192, 64, 8, 28672, 128256),
            "405B": ModelSpec("llama-405b", "llama", 126, 16384, 128, 8, 53248, 128256)}
CHECKPOINTS = 100
WORKERS = (1, 8, 64)
# Storage bandwidth per worker (GB/s), stated: a node reading a parallel
# filesystem or an object store with many connections; the lower one a
# throttled or shared link.
BANDWIDTHS = (1.0, 0.25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/ckptscan-bench-ray"))
    parser.add_argument("-n", type=int, default=20, help="checkpoints in the measured run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cli", type=float, nargs=2, metavar=("LOCAL_S", "RAY_S"),
                        help="skip the end-to-end CLI runs; use these minima from an earlier run")
    args = parser.parse_args()
    print(f"machine: {machine()}")
    print(f"load average before: {load_average()}", flush=True)
    paths = ensure_run(LLAMA_1B_ATTENTION, args.cache / f"{LLAMA_1B_ATTENTION.name}-run",
                       [100 * (i + 1) for i in range(args.n)])
    run_dir = paths[0].parent
    print(f"{len(paths)} checkpoints ({LLAMA_1B_ATTENTION.total_bytes() / 1e9:.2f} GB each, "
          f"{LLAMA_1B_ATTENTION.monitored_bytes() / 1e6:.0f} MB monitored)", flush=True)

    timed: dict[str, list[float]] = {}
    if args.cli:
        timed.update(cli_local=[args.cli[0]], cli_ray=[args.cli[1]])
    else:
        _trend(run_dir, [])  # page cache warm before the first timed run
    for round_ in range(0 if args.cli else args.rounds):
        for label, extra in (("cli_local", []), ("cli_ray", ["--executor", "ray"])):
            timed.setdefault(label, []).append(_trend(run_dir, extra))
            print(f"round {round_ + 1}: {label} {timed[label][-1]:.1f} s", flush=True)

    import ray

    from ckptscan.executors.ray import RayExecutor

    start = time.perf_counter()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    ray_start = time.perf_counter() - start
    spec = resolve_run(run_dir)
    executor = RayExecutor()
    start = time.perf_counter()
    compute(spec, executor=executor)  # the workers start and import torch once
    first_ray = time.perf_counter() - start
    for round_ in range(args.rounds):
        for label, chosen in (("lib_local", None), ("lib_ray", executor)):
            start = time.perf_counter()
            compute(spec, executor=chosen)
            timed.setdefault(label, []).append(time.perf_counter() - start)
            print(f"round {round_ + 1}: {label} {timed[label][-1]:.1f} s", flush=True)
    ray.shutdown()
    best = {label: min(values) for label, values in timed.items()}

    open_s = _open_seconds(paths)
    layer_costs = {name: layer_cost(spec_) for name, spec_ in FRONTIER.items()}
    print(f"load average after: {load_average()}")
    print()
    print(overhead_table(best, timed, ray_start, first_ray, len(paths)))
    print()
    print(projection_table(layer_costs, open_s))


def _trend(run_dir: Path, extra: list[str]) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        run = run_child([sys.executable, "-m", "ckptscan", "trend", str(run_dir), "--no-cache", "-q",
                         "--json", f"{tmp}/r.json", *extra])
    if run.returncode not in (0, 1):
        raise SystemExit(f"ckptscan trend failed ({run.returncode}):\n{run.output[-3000:]}")
    return run.wall_s


def _open_seconds(paths: list[Path]) -> float:
    """Opening one checkpoint (headers, config), as every Ray task does for every checkpoint."""
    start = time.perf_counter()
    for path in paths:
        open_checkpoint(path)
    return (time.perf_counter() - start) / len(paths)


def layer_cost(spec: ModelSpec, rounds: int = 2) -> dict[str, float]:
    """One layer on one thread: the upcast and Grams of one checkpoint, and
    the cores and statistics of one pair (a run of N checkpoints pays N of
    each, minus one pair), on random bf16 weights already in memory."""
    h, r, g, d = spec.heads, spec.head_dim, spec.kv_heads, spec.hidden
    gen = torch.Generator().manual_seed(0)
    q_a = (torch.randn(h * r, d, generator=gen) * 0.02).to(torch.bfloat16)
    k_a = (torch.randn(g * r, d, generator=gen) * 0.02).to(torch.bfloat16)
    q_b = (q_a.float() + torch.randn(q_a.shape, generator=gen) * 3e-4).to(torch.bfloat16)
    k_b = (k_a.float() + torch.randn(k_a.shape, generator=gen) * 3e-4).to(torch.bfloat16)
    gram_s, pair_s = math.inf, math.inf
    with torch_threads(1):
        for _ in range(rounds):
            start = time.perf_counter()
            qa, ka = q_a.float().reshape(h, r, d), k_a.float().reshape(g, r, d)
            grams_a = qk_grams(qa, ka)
            gram_s = min(gram_s, time.perf_counter() - start)
            qb, kb = q_b.float().reshape(h, r, d), k_b.float().reshape(g, r, d)
            grams_b = qk_grams(qb, kb)
            start = time.perf_counter()
            spectra = qk_spectra(qa, ka, qb, kb, grams_a=grams_a, grams_b=grams_b)
            for s in (spectra.delta1, spectra.delta2, spectra.delta3, spectra.dwq, spectra.dwk):
                spectral_stats(s)
            pair_s = min(pair_s, time.perf_counter() - start)
            del qa, ka, qb, kb, grams_a, grams_b, spectra
    read_bytes = 2 * (h + g) * r * d
    print(f"{spec.name} layer on 1 thread: Grams {gram_s:.2f} s per checkpoint, cores {pair_s:.2f} s per pair, "
          f"{read_bytes / 1e6:.0f} MB read per checkpoint", flush=True)
    return {"gram_s": gram_s, "pair_s": pair_s, "read_bytes": read_bytes, "layers": spec.layers}


def makespan(layers: int, workers: int, per_layer_s: float, task_fixed_s: float) -> float:
    """Wall time of the layer groups RayExecutor makes for `workers` CPUs,
    each group on the next free worker (Ray's scheduling of equal tasks)."""
    count = max(1, min(layers, TASKS_PER_CPU * workers))
    size, extra = divmod(layers, count)
    free = [0.0] * workers
    for g in range(count):
        i = min(range(workers), key=free.__getitem__)
        free[i] += task_fixed_s + (size + (g < extra)) * per_layer_s
    return max(free)


def overhead_table(best: dict[str, float], timed: dict[str, list[float]], ray_start: float, first_ray: float,
                   n: int) -> str:
    lines = [f"| `trend`, {n} checkpoints, 1.1B-shaped attention, warm page cache | local executor | "
             "`--executor ray` | ratio |", "|---|---|---|---|",
             f"| end to end (`ckptscan trend`; Ray instance started by the command) | {best['cli_local']:.1f} s | "
             f"{best['cli_ray']:.1f} s | {best['cli_ray'] / best['cli_local']:.2f}× |",
             f"| on a running Ray instance (2 CPUs, workers warm) | {best['lib_local']:.1f} s | "
             f"{best['lib_ray']:.1f} s | {best['lib_ray'] / best['lib_local']:.2f}× |", "",
             f"- Ray start-up (`ray.init(num_cpus=2)`): {ray_start:.1f} s; first scan on fresh workers "
             f"(each starts and imports torch): {first_ray:.1f} s",
             "- per round (s): " + "; ".join(f"{k} " + "/".join(f"{x:.1f}" for x in v) for k, v in timed.items())]
    return "\n".join(lines)


def projection_table(costs: dict[str, dict[str, float]], open_s: float) -> str:
    """100 checkpoints on 1/8/64 one-CPU workers at each stated bandwidth.

    Per (layer, checkpoint): read its q/k rows at the worker's bandwidth,
    then compute its Grams and one pair's cores (measured), one after the
    other (a one-CPU task does not overlap them: conservative). A task also
    opens every checkpoint once (measured on 1.1B headers; a sharded
    frontier checkpoint has more files, counted 10× here)."""
    header = "| model, 100 checkpoints | per-worker storage | " + " | ".join(
        f"{w} worker{'s' * (w > 1)}" for w in WORKERS) + " |"
    lines = [header, "|---|---|" + "---|" * len(WORKERS)]
    for name, c in costs.items():
        for bandwidth in BANDWIDTHS:
            per_layer = CHECKPOINTS * (c["read_bytes"] / (bandwidth * 1e9) + c["gram_s"] + c["pair_s"])
            task_fixed = CHECKPOINTS * open_s * 10
            cells = [_hours(makespan(int(c["layers"]), w, per_layer, task_fixed)) for w in WORKERS]
            lines.append(f"| {name} ({int(c['layers'])} layers, {c['read_bytes'] * c['layers'] / 1e9:.0f} GB "
                         f"read per checkpoint) | {bandwidth:g} GB/s | " + " | ".join(cells) + " |")
    lines += ["", "- measured, one thread of this machine: " + "; ".join(
        f"{name} layer Grams {c['gram_s']:.2f} s/checkpoint, cores {c['pair_s']:.2f} s/pair"
        for name, c in costs.items()) + f"; opening a checkpoint {open_s * 1e3:.1f} ms",
        "- projected: storage bandwidth per worker (stated, not measured), no overlap of read and compute in a "
        "task, aggregate bandwidth never the limit (64 × 1 GB/s = 64 GB/s), Ray overhead as measured above"]
    return "\n".join(lines)


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


if __name__ == "__main__":
    main()
