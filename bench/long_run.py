"""Benchmark: runs as long as real ones (issue #26).

    .venv/bin/python bench/long_run.py            # everything (~10 min on 2 shared cores)
    .venv/bin/python bench/long_run.py --quick    # reduced sizes: checks that it works (~2 min)

Each figure is measured in a child process, so each has its own peak RSS
(GNU time's max RSS, `measure.run_child`):

* judge time per new pair at 10 / 100 / 1,000 / 10,000 pairs, on synthetic
  metrics of a 1B (22 layers × 32 heads) and a 70B (80 × 64) shape:
  `judge_new_pair` is the one place that says how a new pair is judged
  (the incremental `SeriesJudge` when it exists, else batch `judge` of the
  whole series, which is what live mode, `watch` and `trend` do today);
* the JSON report at 80 layers × 64 heads: bytes per pair (measured at a
  few run lengths, linear), projected to 2,000 checkpoints, and the time and
  peak RSS of `json.load` + `ckptscan.load_report` of it;
* a generated long run (real safetensors checkpoints of a tiny Llama,
  `synthetic.ensure_run`, ≥ 2,001 checkpoints under --root): `trend` first
  run and re-run after one new checkpoint (with the pair cache) next to a
  `diff` of that pair, peak RSS at 100 and at 2,000 checkpoints; `watch`
  latency for a new checkpoint in a directory of 20 and of 2,000;
* issue #41 (`--parts report,report2000,renderers,rerun`): the JSON report
  at 80 × 64 under `--per-head all` and under the CLI's default (schema 2's
  bytes, document and parts, beside what schema 1 and its .json.gz weighed;
  write and `load_report` time, peak RSS; projected to 2,000 checkpoints),
  the default JSON of 2,000 checkpoints × 80 × 64 generated at full size and
  measured (`report2000`); JUnit, Markdown, live mode's report.json,
  TensorBoard and `--json` re-written after one new pair at 30 and 2,000
  pairs × 16 layers (`renderers`); and a generated 16-layer run (`LONG16`,
  2,001 checkpoints, ~0.9 GB) re-run from its cache after one new
  checkpoint, with `--json` (appending to the report the run before wrote,
  put back before each round), without, and a `diff` of the new pair, in
  turn, at 30, 600 and 2,000 checkpoints (the first run of each size is
  kept under --root and reused);
* live overhead at every=50 over 10,000 simulated pairs at the 1B shape:
  the monitored step's fixed part (snapshot + the pair's scan) and the
  training step are the README's measured 1B figures (--train-step-s,
  --monitor-fixed-s); the part that grows with the run (judging the new
  pair, rewriting the report) is measured here at 10 … 10,000 pairs and
  integrated over the run.

A batch judge at 10,000 pairs takes minutes: a measurement whose time,
projected linearly from the one before, is over --budget-s is not run but
extrapolated (marked ~), and counts as a FAIL where it sits beside a target.
The table ends with the issue's targets and PASS/FAIL.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import load_average, machine, run_child, symlink_run  # noqa: E402
from synthetic import ModelSpec, ensure_run  # noqa: E402

from ckptscan.cli.options import DEFAULT_PER_HEAD  # noqa: E402
from ckptscan.detection.rules import Thresholds  # noqa: E402
from ckptscan.layouts.base import ModelInfo  # noqa: E402
from ckptscan.pipeline.metrics import Metrics  # noqa: E402
from ckptscan.schema.results import AttentionResult, CheckpointRef, HeadResult, LayerResult, PairResult  # noqa: E402

SHAPES = {"1B": (22, 32), "70B": (80, 64)}  # layers, query heads
INTERVAL = 100  # steps between checkpoints
# A tiny Llama (2 layers, hidden 64, 4 / 2 heads, no MLP): a few hundred KB a
# checkpoint, so 2,001 of them take seconds to write and ~0.5 GB of disk.
TINY = ModelSpec("long-run-tiny", "llama", 2, 64, 4, 2, 0, 256)
# Issue #41's run: the same, 16 layers (~460 KB a checkpoint).
LONG16 = ModelSpec("long-run-16", "llama", 16, 64, 4, 2, 0, 256)
POINTER = "latest_checkpointed_iteration.txt"


# ---------------------------------------------------------------- synthetic metrics

def model_info(layers: int, heads: int) -> ModelInfo:
    return ModelInfo(family="llama", num_layers=layers, hidden_size=heads * 128, num_heads=heads,
                     num_kv_heads=8, head_dim=128)


def synthetic_pairs(layers: int, heads: int, count: int, fault_from: int | None = None, seed: int = 0
                    ) -> list[PairResult]:
    """`count` consecutive pairs of a Llama's metrics as a scan computes them
    (every field a real report fills; per-head results included), healthy
    noise around fixed levels. From pair `fault_from`, layer 3's QK update
    collapses (Δ2 entropy falls), so the report carries findings.

    Each layer's per-head list is one object shared by its pairs: judging
    never reads it, and 10,000 pairs × 80 layers × 64 heads of distinct
    objects would not fit in memory; serialised, it is as long as distinct
    values of the same magnitude."""
    rng = random.Random(seed)
    head_lists = [[HeadResult(head=h, kv_head=h * 8 // heads, delta2_entropy=rng.uniform(1, 4),
                              delta3_entropy=rng.uniform(0.1, 1), dwq_entropy=rng.uniform(2, 4),
                              dwk_entropy=rng.uniform(2, 4), delta1_entropy=rng.uniform(1, 4),
                              delta2_entropy_norm=rng.uniform(0.4, 0.7), q_spectral_norm=rng.uniform(2, 10),
                              qk_logit_bound=rng.uniform(5, 20)) for h in range(heads)] for _ in range(layers)]
    pairs = []
    for i in range(count):
        results = []
        for n in range(layers):
            collapse = fault_from is not None and n == 3 and i >= fault_from
            d2n = (0.05 if collapse else 0.55) + rng.gauss(0, 0.01)
            attention = AttentionResult(
                delta2_entropy=d2n * 4.8, delta2_entropy_min=d2n * 4.0, delta2_entropy_norm=d2n,
                delta3_entropy=rng.uniform(0.1, 1), dwq_entropy=rng.uniform(2, 4), dwk_entropy=rng.uniform(2, 4),
                dwq_rel_norm=rng.gauss(0.1, 0.005), dwk_rel_norm=rng.gauss(0.1, 0.005),
                qk_logit_bound=rng.gauss(12, 0.3), heads=head_lists[n], delta2_entropy_worst_head=rng.randrange(heads),
                delta2_entropy_norm_min=d2n - 0.05, delta2_effective_rank=rng.uniform(20, 60),
                delta1_entropy=rng.uniform(1, 4), dwq_entropy_norm=rng.gauss(0.8, 0.01),
                dwk_entropy_norm=rng.gauss(0.8, 0.01), q_spectral_norm_max=rng.uniform(5, 10),
                q_spectral_norm_growth=rng.gauss(1.0, 0.01))
            results.append(LayerResult(n, attention, None, stored_dtype={"W_q": "BF16", "W_k": "BF16"},
                                       changed_fraction={"W_q": rng.uniform(0.99, 1), "W_k": rng.uniform(0.99, 1)}))
        pairs.append(PairResult(i * INTERVAL, (i + 1) * INTERVAL, results, f"run/checkpoint-{i * INTERVAL}",
                                f"run/checkpoint-{(i + 1) * INTERVAL}"))
    return pairs


def run_metrics(model: ModelInfo, pairs: list[PairResult]) -> Metrics:
    checkpoints = [CheckpointRef(f"run/checkpoint-{i * INTERVAL}", i * INTERVAL) for i in range(len(pairs) + 1)]
    return Metrics(kind="run", model=model, checkpoints=checkpoints, pairs=pairs, settings={"run": "run"})


def grown(metrics: Metrics, pair: PairResult) -> Metrics:
    """`metrics` with one more pair, as live mode grows its run: its lists
    are appended to, not built again (a benchmark that rebuilt 10,000
    checkpoint records before each timed call would time the collector
    walking them)."""
    metrics.pairs.append(pair)
    metrics.checkpoints.append(CheckpointRef(pair.to_path, pair.to_step))
    return dataclasses.replace(metrics)


# ---------------------------------------------------------------- judging a new pair

def judge_new_pair(model: ModelInfo, pairs: list[PairResult], rounds: int) -> tuple[float, str]:
    """Seconds to judge the newest of `pairs` once the ones before it are
    judged, as live mode, `watch` and `trend` do at each new pair (the best
    of `rounds` new pairs); and the name of what was called.

    THE ONE PLACE TO ADAPT to the judging API. With the incremental judge
    (`ckptscan.detection.judge.SeriesJudge`, issue #26 points 1–2): its
    state is folded over the pairs before, then `SeriesJudge.report` of the
    metrics with one more pair is timed: the new pair's judgement plus the
    report of the whole run. Without it: batch `judge` of the whole series.
    """
    try:
        from ckptscan.detection.judge import SeriesJudge
    except ImportError:
        SeriesJudge = None
    n = len(pairs) - rounds
    if SeriesJudge is None:
        from ckptscan.detection.judge import judge

        best = math.inf
        for k in range(rounds):
            metrics = run_metrics(model, pairs[:n + k + 1])
            start = time.perf_counter()
            judge(metrics, Thresholds())
            best = min(best, time.perf_counter() - start)
        return best, "ckptscan.detection.judge.judge (batch: the whole series)"
    series = SeriesJudge(Thresholds())
    metrics = run_metrics(model, pairs[:n])
    series.report(metrics)
    best = math.inf
    for k in range(rounds):
        metrics = grown(metrics, pairs[n + k])
        start = time.perf_counter()
        series.report(metrics)
        best = min(best, time.perf_counter() - start)
    return best, "ckptscan.detection.judge.SeriesJudge.report (incremental)"


def judge_and_write_seconds(model: ModelInfo, pairs: list[PairResult], out: Path, rounds: int,
                            per_head: str = "all") -> tuple[float, float]:
    """The two parts of a live monitored step that see the whole run: judging
    the new pair, and rewriting the report file (`live.report_file.ReportFile`,
    which reuses the old pairs' JSON), each the best of `rounds`. Live mode
    rewrites the file only at geometrically spaced pairs
    (`live.monitor.report_due`): `main` adds the rewrites up over the run.
    `per_head`: the Monitor's (the report file keeps the text of those heads only)."""
    from ckptscan.detection.judge import SeriesJudge
    from ckptscan.live.report_file import ReportFile

    file = ReportFile(out / "live.json", per_head)
    n = len(pairs) - rounds
    series = SeriesJudge(Thresholds())
    metrics = run_metrics(model, pairs[:n])
    file.write(series.report(metrics))
    judged = written = math.inf
    for k in range(rounds):
        metrics = grown(metrics, pairs[n + k])
        start = time.perf_counter()
        report = series.report(metrics)
        middle = time.perf_counter()
        file.write(report)
        judged, written = min(judged, middle - start), min(written, time.perf_counter() - middle)
    return judged, written


def live_monitor_seconds(judged: dict, written: dict, pairs: int, fixed_s: float) -> tuple[float, int]:
    """Seconds live mode spends monitoring over `pairs` pairs of a healthy
    run (no verdict change, no alert: each forces one more rewrite): at each
    pair the fixed part, the judge, and the report file's rewrite where
    `report_due` says so; and the number of rewrites."""
    from ckptscan.live.monitor import report_due

    total, rewrites, state = 0.0, 0, None
    for n in range(1, pairs + 1):
        total += fixed_s + _interpolate(judged, n)
        if report_due(state, n, "ok", False):
            total += _interpolate(written, n)
            rewrites, state = rewrites + 1, (n, "ok")
    return total, rewrites


# ---------------------------------------------------------------- the JSON report

def written_bytes(path: Path) -> int:
    """The bytes of the report at `path`: its document and, in schema 2, its parts file."""
    return sum(p.stat().st_size for p in [path, *path.parent.glob(f"{path.name}.pairs-*")])


def remove_report(path: Path) -> None:
    for p in [path, *path.parent.glob(f"{path.name}.pairs-*")]:
        p.unlink()


def write_report(layers: int, heads: int, pairs: int, path: Path, per_head: str = "all") -> dict:
    """A judged report of `pairs` pairs written to `path` as `--json
    --per-head PER_HEAD` writes it (schema 2 past PARTS_LAYERS layer results);
    its bytes, the seconds `write_json` took, and what schema 1 (compact, as
    it wrote a report this long) and its .json.gz weighed."""
    from ckptscan.detection.judge import judge
    from ckptscan.document.writing import report_json, write_json

    report = judge(run_metrics(model_info(layers, heads), synthetic_pairs(layers, heads, pairs, pairs // 2)),
                   Thresholds())
    start = time.perf_counter()
    write_json(report, path, per_head)
    written = time.perf_counter() - start
    with open(path) as f:
        schema = json.load(f)["schema_version"]
    text = report_json(report, per_head)
    found = {"bytes": written_bytes(path), "schema": schema, "write_s": written, "v1_bytes": len(text.encode()),
             "v1_gzip_bytes": len(gzip.compress(text.encode(), 6))}
    if per_head != "all":
        return found
    data = json.loads(text)
    layer = data["pairs"][-1]["layers"][3]
    found["layer_parts"] = {"heads": len(json.dumps(layer["attention"]["heads"], separators=(",", ":"))),
                            "judgements": len(json.dumps(layer["judgements"], separators=(",", ":"))),
                            "findings": len(json.dumps(layer["findings"], separators=(",", ":"))),
                            "layer": len(json.dumps(layer, separators=(",", ":")))}
    return found


def write_tiled_report(layers: int, heads: int, judged: int, pairs: int, path: Path, per_head: str) -> dict:
    """A report of `pairs` pairs at full size, not projected: the pairs of a
    judged synthetic run of `judged` pairs repeated, each copy at its own
    steps (a batch judge of 2,000 pairs × 80 layers would take longer than
    the whole benchmark; the values repeat with a period of `judged` pairs,
    longer than gzip's window at 80 layers, so they pack no better than a
    real run's), written as `--json --per-head PER_HEAD` writes it."""
    from ckptscan.detection.judge import judge
    from ckptscan.document.writing import write_json

    report = judge(run_metrics(model_info(layers, heads), synthetic_pairs(layers, heads, judged, judged // 2)),
                   Thresholds())
    tiled = [dataclasses.replace(report.pairs[i % judged], from_step=i * INTERVAL, to_step=(i + 1) * INTERVAL,
                                 from_path=f"run/checkpoint-{i * INTERVAL}",
                                 to_path=f"run/checkpoint-{(i + 1) * INTERVAL}") for i in range(pairs)]
    long = dataclasses.replace(report, pairs=tiled, checkpoints=[CheckpointRef(f"run/checkpoint-{i * INTERVAL}",
                                                                               i * INTERVAL)
                                                                 for i in range(pairs + 1)])
    start = time.perf_counter()
    write_json(long, path, per_head)
    written = time.perf_counter() - start
    with open(path) as f:
        schema = json.load(f)["schema_version"]
    return {"bytes": written_bytes(path), "schema": schema, "write_s": written}


def load_seconds(path: Path) -> dict:
    """Seconds to read a report back: `json.load`, then `ckptscan.load_report`
    (which parses it again and builds the result objects)."""
    from ckptscan.document.reading import load_report

    start = time.perf_counter()
    with open(path) as f:
        json.load(f)
    json_load = time.perf_counter() - start
    start = time.perf_counter()
    load_report(path)
    return {"json_load_s": json_load, "load_report_s": time.perf_counter() - start}


def renderer_figures(layers: int, heads: int, count: int) -> dict:
    """Each report of a judged run of `count` pairs and the same run one pair
    longer, as a re-run writes it: bytes and seconds of JUnit, Markdown, the
    live report file, TensorBoard (its re-run appends the new pair's points)
    and `--json` (schema 2: its re-run appends)."""
    from ckptscan.detection.judge import judge
    from ckptscan.live.report_file import ReportFile
    from ckptscan.document.writing import write_json
    from ckptscan.report.junit import junit_xml
    from ckptscan.report.markdown import markdown_report

    model = model_info(layers, heads)
    pairs = synthetic_pairs(layers, heads, count + 1, count // 2)
    before, after = (judge(run_metrics(model, pairs[:k]), Thresholds()) for k in (count, count + 1))
    found: dict = {}

    def timed(name: str, write) -> None:
        start = time.perf_counter()
        size = write()
        found[name] = {"s": round(time.perf_counter() - start, 4), "bytes": size}

    with tempfile.TemporaryDirectory() as out:
        where = Path(out)
        timed("junit", lambda: len(junit_xml(after).encode()))
        timed("markdown", lambda: len(markdown_report(after).encode()))
        live = ReportFile(where / "live.json", DEFAULT_PER_HEAD)
        live.write(before)
        timed("live_report_file_next", lambda: (live.write(after), (where / "live.json").stat().st_size)[1])
        write_json(before, where / "report.json", DEFAULT_PER_HEAD)
        timed("json_rerun", lambda: (write_json(after, where / "report.json", DEFAULT_PER_HEAD),
                                     written_bytes(where / "report.json"))[1])
        timed("json_whole", lambda: (write_json(after, where / "whole.json", DEFAULT_PER_HEAD),
                                     written_bytes(where / "whole.json"))[1])
        try:
            from ckptscan.report.tensorboard import write_tensorboard

            write_tensorboard(before, where / "tb")
            timed("tensorboard_rerun", lambda: (write_tensorboard(after, where / "tb"),
                                                sum(p.stat().st_size for p in (where / "tb").iterdir()))[1])
        except ImportError:
            found["tensorboard_rerun"] = None
    return found


def renderer_rows(shown: dict, sizes: list[int]) -> list[Row]:
    small, large = shown[sizes[0]], shown[sizes[-1]]
    rows = []
    for name, words in (("junit", "JUnit XML"), ("markdown", "Markdown summary"),
                        ("live_report_file_next", "live report.json, next monitored step"),
                        ("tensorboard_rerun", "TensorBoard re-run (appends the new pair)"),
                        ("json_rerun", "--json re-run (schema 2: appends)"), ("json_whole", "--json written whole")):
        if small.get(name) is None or large.get(name) is None:
            rows.append(Row(f"{words}: not measured (tensorboard not installed)", ""))
            continue
        a, b = small[name], large[name]
        rows.append(Row(f"{words}, {sizes[-1]:,} / {sizes[0]} pairs × {LONG16.layers} layers: seconds, size",
                        f"{b['s']:.3f} s / {a['s']:.3f} s; {b['bytes'] / 1e3:,.0f} KB / {a['bytes'] / 1e3:,.0f} KB"))
    return rows


# ---------------------------------------------------------------- child processes

def child(argv: list[str]) -> dict:
    """Run one measurement in a child process: its printed JSON result, its
    wall time and peak RSS."""
    run = run_child([sys.executable, __file__, "--child", json.dumps(argv)])
    if run.returncode != 0:
        raise SystemExit(f"child {argv} failed ({run.returncode}):\n{run.output[-3000:]}")
    result = json.loads(run.output.strip().splitlines()[-1])
    result["peak_rss"] = run.peak_rss_bytes
    return result


def child_main(argv: list[str]) -> None:
    kind, *rest = argv
    if kind == "judge":
        shape, count, rounds = rest[0], int(rest[1]), int(rest[2])
        layers, heads = SHAPES[shape]
        pairs = synthetic_pairs(layers, heads, count + rounds)
        seconds, called = judge_new_pair(model_info(layers, heads), pairs, rounds)
        print(json.dumps({"seconds": seconds, "called": called}))
    elif kind == "live":
        count, rounds, per_head = int(rest[0]), int(rest[1]), rest[2] if len(rest) > 2 else "all"
        layers, heads = SHAPES["1B"]
        with tempfile.TemporaryDirectory() as out:
            judged, written = judge_and_write_seconds(model_info(layers, heads),
                                                      synthetic_pairs(layers, heads, count + rounds), Path(out), rounds,
                                                      per_head)
        print(json.dumps({"seconds": judged + written, "judge_s": judged, "write_s": written}))
    elif kind == "report":
        layers, heads, count, path, per_head = int(rest[0]), int(rest[1]), int(rest[2]), Path(rest[3]), rest[4]
        print(json.dumps(write_report(layers, heads, count, path, per_head)))
    elif kind == "tiled":
        layers, heads, judged, count, path, per_head = (int(rest[0]), int(rest[1]), int(rest[2]), int(rest[3]),
                                                        Path(rest[4]), rest[5])
        print(json.dumps(write_tiled_report(layers, heads, judged, count, path, per_head)))
    elif kind == "renderers":
        print(json.dumps(renderer_figures(int(rest[0]), int(rest[1]), int(rest[2]))))
    elif kind == "load":
        print(json.dumps(load_seconds(Path(rest[0]))))
    else:
        raise SystemExit(f"unknown child measurement {kind}")


# ---------------------------------------------------------------- the generated long run

def ckptscan(*args: str) -> dict:
    run = run_child([sys.executable, "-m", "ckptscan", *args])
    if run.returncode not in (0, 1):
        raise SystemExit(f"ckptscan {' '.join(args)} failed ({run.returncode}):\n{run.output[-3000:]}")
    return {"seconds": run.wall_s, "peak_rss": run.peak_rss_bytes}


TREND_ROUNDS = 3  # re-runs and diffs timed per size, alternating: the best of each counts (a shared machine)


def trend_figures(checkpoints: list[Path], root: Path, sizes: list[int]) -> dict:
    """`trend` on the first N checkpoints with an empty pair cache, then again
    once one more checkpoint is there (the cache holding the N − 1 pairs),
    and a `diff` of that new pair alone. The re-run and the diff are each
    the best of TREND_ROUNDS, side by side; every re-run starts from the
    cache the first run left (copied back), so each computes the new pair."""
    found = {}
    for n in sizes:
        run = symlink_run(root / f"run-{n}", checkpoints[:n])
        cache, kept = root / f"cache-{n}", root / f"cache-{n}-first"
        shutil.rmtree(cache, ignore_errors=True)
        first = ckptscan("trend", str(run), "--cache-dir", str(cache))
        shutil.rmtree(kept, ignore_errors=True)
        shutil.copytree(cache, kept, symlinks=True)
        (run / checkpoints[n].name).symlink_to(checkpoints[n])
        agains, diffs = [], []
        for _ in range(TREND_ROUNDS):
            shutil.rmtree(cache)
            shutil.copytree(kept, cache, symlinks=True)
            agains.append(ckptscan("trend", str(run), "--cache-dir", str(cache)))
            diffs.append(ckptscan("diff", str(checkpoints[n - 1]), str(checkpoints[n])))
        again = {"seconds": min(r["seconds"] for r in agains), "peak_rss": max(r["peak_rss"] for r in agains)}
        diff = {"seconds": min(r["seconds"] for r in diffs), "peak_rss": max(r["peak_rss"] for r in diffs)}
        found[n] = {"first": first, "again": again, "diff": diff,
                    "ratios": [a["seconds"] / d["seconds"] for a, d in zip(agains, diffs)]}
        print(f"  trend {n + 1} checkpoints: first run {first['seconds']:.1f} s, after one new checkpoint "
              f"{again['seconds']:.1f} s ({again['peak_rss'] / 2**20:.0f} MiB); diff of that pair "
              f"{diff['seconds']:.1f} s (best of {TREND_ROUNDS}; each round's ratio "
              f"{', '.join(f'{r:.2f}' for r in found[n]['ratios'])})", flush=True)
    return found


def rerun_figures(checkpoints: list[Path], root: Path, sizes: list[int]) -> dict:
    """Issue #41: `trend` of the first N checkpoints once one more is there,
    its pair cache holding the N − 1 pairs before (copied back before each
    re-run, so each computes and judges the new pair), with `--json` and
    without, next to a `diff` of the new pair; TREND_ROUNDS rounds of the
    three in turn, so each round's ratios are taken side by side. The cache
    of the first run is kept under ROOT (rerun-cache-N-first) and reused by
    a later call: the first run of 2,000 checkpoints takes minutes."""
    found = {}
    for n in sizes:
        run = symlink_run(root / f"rerun-{n}", checkpoints[:n])
        cache, kept, out = root / f"rerun-cache-{n}", root / f"rerun-cache-{n}-first", root / f"rerun-{n}.json"
        if not kept.is_dir():
            ckptscan("trend", str(run), "--cache-dir", str(kept), "--quiet")
        # The report the run before wrote (the nightly job's file, which the re-run appends to), kept aside.
        shutil.rmtree(cache, ignore_errors=True)
        shutil.copytree(kept, cache, symlinks=True)
        saved = root / f"rerun-{n}-before"
        shutil.rmtree(saved, ignore_errors=True)
        saved.mkdir()
        for p in out.parent.glob(f"{out.name}*"):
            p.unlink()
        ckptscan("trend", str(run), "--cache-dir", str(cache), "--quiet", "--json", str(out))
        for p in out.parent.glob(f"{out.name}*"):
            shutil.copy2(p, saved / p.name)
        (run / checkpoints[n].name).symlink_to(checkpoints[n])
        rounds = []
        for _ in range(TREND_ROUNDS):
            timed = {}
            for name, extra in (("json", ["--json", str(out)]), ("plain", [])):
                shutil.rmtree(cache, ignore_errors=True)
                shutil.copytree(kept, cache, symlinks=True)
                for p in out.parent.glob(f"{out.name}*"):
                    p.unlink()
                for p in saved.iterdir():
                    shutil.copy2(p, out.parent / p.name)
                timed[name] = ckptscan("trend", str(run), "--cache-dir", str(cache), "--quiet", *extra)
                if name == "json":  # before the next round puts the report of the run before back
                    timed["written"] = {"bytes": written_bytes(out), **written_how(out)}
            timed["diff"] = ckptscan("diff", str(checkpoints[n - 1]), str(checkpoints[n]), "--quiet")
            rounds.append(timed)
        best = {name: min(r[name]["seconds"] for r in rounds) for name in ("json", "plain", "diff")}
        found[n] = {"best": best, "peak_rss": max(r["json"]["peak_rss"] for r in rounds),
                    "json_over_diff": statistics.median(r["json"]["seconds"] / r["diff"]["seconds"] for r in rounds),
                    "plain_over_diff": statistics.median(r["plain"]["seconds"] / r["diff"]["seconds"] for r in rounds),
                    "load": load_average(), **rounds[-1]["written"]}
        r = found[n]
        print(f"  {n + 1} checkpoints, after one new: with --json {best['json']:.2f} s, without "
              f"{best['plain']:.2f} s, diff of the new pair {best['diff']:.2f} s (best of {TREND_ROUNDS}); median "
              f"ratio to the diff {r['json_over_diff']:.2f}× / {r['plain_over_diff']:.2f}×; JSON "
              f"{r['bytes'] / 1e6:.1f} MB (schema {r['schema']}, {r['chunks']} chunks of pairs: "
              f"{'appended' if r['chunks'] > 1 else 'written whole'}), peak RSS {r['peak_rss'] / 2**20:.0f} MiB; "
              f"load average {r['load']}",
              flush=True)
    return found


def written_how(path: Path) -> dict:
    """The schema of the report at `path` and how many chunks its pairs are in
    (schema 2: one per write that appended; schema 1: 0)."""
    with open(path) as f:
        data = json.load(f)
    pairs = data["pairs"]
    return {"schema": data["schema_version"],
            "chunks": len(pairs["parts"]["chunks"]) if isinstance(pairs, dict) else 0}


def rerun_rows(found: dict, sizes: list[int]) -> list[Row]:
    rows = []
    for n in sizes:
        r, best = found[n], found[n]["best"]
        target = n >= 600 or n == sizes[-1]
        rows.append(Row(f"re-run after one new checkpoint, {n + 1:,} checkpoints × 16 layers: with --json / without "
                        f"/ diff of the new pair (JSON {r['bytes'] / 1e6:.1f} MB, schema {r['schema']}"
                        f"{', appended to' if r['chunks'] > 1 else ''}; load {r['load']})",
                        f"{best['json']:.2f} s / {best['plain']:.2f} s / {best['diff']:.2f} s"))
        rows.append(Row("  with --json / diff (without --json / diff), median of the rounds",
                        f"{r['json_over_diff']:.2f}× ({r['plain_over_diff']:.2f}×)", "≤ 2×" if target else "",
                        _verdict(r["json_over_diff"] <= 2) if target else ""))
    first, last = found[sizes[0]]["best"]["json"], found[sizes[-1]]["best"]["json"]
    rows.append(Row(f"  with --json at {sizes[-1] + 1:,} / at {sizes[0] + 1} checkpoints", f"{last / first:.2f}×",
                    "≤ 1.5×", _verdict(last / first <= 1.5)))
    return rows


def watch_latency(checkpoints: list[Path], root: Path, count: int, cache: Path | None) -> dict:
    """Seconds from a new checkpoint's pointer file to its row from `ckptscan
    watch` on a directory of `count` checkpoints (after its first rows).

    The pairs already there come from a pair cache (as a restarted watch
    finds them): a copy of `cache` when it holds exactly those pairs, else
    one that `trend` fills first. The new checkpoints are the next two of
    the run, which no cache has seen, so each new row costs one pair's
    compute at every size."""
    from watch_latency import Rows

    run = symlink_run(root / f"watch-{count}", checkpoints[:count])
    own_cache = root / f"watch-cache-{count}"
    shutil.rmtree(own_cache, ignore_errors=True)
    if cache is not None:
        shutil.copytree(cache, own_cache)
    else:
        ckptscan("trend", str(run), "--cache-dir", str(own_cache))
    step = lambda path: int(path.name.split("-")[1])  # noqa: E731
    (run / POINTER).write_text(str(step(checkpoints[count - 1])))
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, "-m", "ckptscan", "watch", str(run), "--cache-dir", str(own_cache)],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    rows = Rows(process.stdout)
    rows.start()
    try:
        ready = row_time(rows, process, step(checkpoints[count - 1]), 900) - started
        delays = []
        for new in checkpoints[count: count + 2]:
            (run / new.name).symlink_to(new)
            (run / POINTER).write_text(str(step(new)))
            complete = time.monotonic()
            delays.append(row_time(rows, process, step(new), 300) - complete)
    finally:
        process.terminate()
        process.wait()
    print(f"  watch {count} checkpoints: first rows after {ready:.1f} s; new checkpoint → row "
          f"{', '.join(f'{d:.2f}' for d in delays)} s", flush=True)
    return {"seconds": min(delays), "ready_s": ready}


def row_time(rows, process: subprocess.Popen, step: int, guard: float) -> float:
    """When the row of `step` arrived; fails at once if watch exited first
    (it stops at the first alert: its gate)."""
    deadline = time.monotonic() + guard
    while True:
        try:
            return rows.wait_for(step, guard=2)
        except SystemExit:
            if process.poll() is not None:
                raise SystemExit(f"ckptscan watch exited ({process.returncode}) before the row of step {step}")
            if time.monotonic() > deadline:
                raise


# ---------------------------------------------------------------- the table

@dataclass
class Row:
    what: str
    figure: str
    target: str = ""
    verdict: str = ""  # PASS / FAIL / ""


def judge_rows(judged: dict, sizes: list[int]) -> list[Row]:
    rows = []
    for shape, by_size in judged.items():
        first, last = by_size[sizes[0]], by_size[sizes[-1]]
        for n in sizes:
            r = by_size[n]
            rows.append(Row(f"judge per new pair, {shape} {SHAPES[shape][0]}×{SHAPES[shape][1]}, {n:,} pairs",
                            f"{_ms(r)} ms, peak RSS {_mib(r)}"))
        ratio = last["seconds"] / first["seconds"]
        rows.append(Row(f"  {shape}: time at {sizes[-1]:,} / at {sizes[0]:,} pairs", _approx(last) + f"{ratio:.1f}×",
                        "≤ 1.2×", _verdict(ratio <= 1.2 and not last.get("extrapolated"))))
        if shape == "70B":
            rows.append(Row(f"  70B: per pair at {sizes[-1]:,} pairs", f"{_ms(last)} ms", "≤ 10 ms",
                            _verdict(last["seconds"] <= 0.010 and not last.get("extrapolated"))))
    return rows


def _ms(r: dict) -> str:
    return f"{_approx(r)}{r['seconds'] * 1e3:,.1f}"


def _mib(r: dict) -> str:
    return f"{r['peak_rss'] / 2**20:,.0f} MiB" if r.get("peak_rss") else "–"


def _approx(r: dict) -> str:
    return "~" if r.get("extrapolated") else ""


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def print_table(rows: list[Row]) -> None:
    width = max(len(r.what) for r in rows)
    fig = max(len(r.figure) for r in rows)
    print(f"{'measurement':{width}s}  {'figure':{fig}s}  {'target':10s}  result")
    print("-" * (width + fig + 26))
    for r in rows:
        print(f"{r.what:{width}s}  {r.figure:{fig}s}  {r.target:10s}  {r.verdict}")


def measured_or_projected(measured: dict, sizes: list[int], budget: float, measure) -> dict:
    """`measure(n)` for each size while the projection (linear in n from the
    previous size) stays within `budget` seconds; projected beyond."""
    previous = None
    for n in sizes:
        if previous is not None and measured[previous]["seconds"] * n / previous > budget:
            measured[n] = {key: measured[previous][key] * n / previous for key in ("seconds", "judge_s", "write_s")
                           if key in measured[previous]} | {"extrapolated": True}
            print(f"  {n:,} pairs: not run, ~{measured[n]['seconds']:.1f} s projected (over --budget-s)", flush=True)
        else:
            measured[n] = measure(n)
        previous = n
    return measured


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="reduced sizes: checks that the benchmark works")
    p.add_argument("--root", type=Path, default=Path("/tmp/ckptscan-bench-long"))
    p.add_argument("--budget-s", type=float, default=15.0,
                   help="a judge measurement projected to take longer is extrapolated, not run")
    p.add_argument("--train-step-s", type=float, default=65.5,
                   help="training step of the 1B shape (README, bench/live_overhead.py on this machine's CPU)")
    p.add_argument("--monitor-fixed-s", type=float, default=11.3,
                   help="monitored step of the 1B shape without judging and the report (snapshot + scan)")
    p.add_argument("--parts", default="judge,live,report,report2000,renderers,run,rerun",
                   help="which measurements: judge (synthetic metrics), live, report (JSON size), run (the "
                        "generated long run: trend and watch), rerun (issue #41: a 16-layer run's cached re-run "
                        "with --json), renderers (JUnit, Markdown, live report.json, TensorBoard at 30 and 2,000 "
                        "pairs), report2000 (the default JSON of 2,000 checkpoints × 80 × 64, generated and measured)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child_main(json.loads(args.child))
        return
    quick = args.quick
    judge_sizes = [10, 100, 1_000, 10_000]
    rounds = 10  # new pairs timed at each size (the best counts: the machine is shared)
    report_sizes = [30, 35] if quick else [30, 60]  # both past PARTS_LAYERS at 80 layers: schema 2
    rerun_sizes = [10, 40] if quick else [30, 600, 2_000]
    trend_sizes = [20, 200] if quick else [100, 2_000]
    watch_sizes = [20, trend_sizes[-1] + 1]
    budget = 2.0 if quick else args.budget_s
    print(f"machine: {machine()}; load average {load_average()}", flush=True)
    rows: list[Row] = []
    parts = set(args.parts.split(","))
    called = "not measured (--parts)"

    if "judge" in parts:
        print("judging a new pair (synthetic metrics):", flush=True)
        judged = {}
        for shape in SHAPES:
            def measure(n: int, shape=shape) -> dict:
                r = child(["judge", shape, str(n), str(rounds)])
                print(f"  {shape} {n:,} pairs: {r['seconds'] * 1e3:,.1f} ms, peak RSS {_mib(r)} ({r['called']})",
                      flush=True)
                return r
            judged[shape] = measured_or_projected({}, judge_sizes, budget, measure)
        called = next(r["called"] for r in judged["1B"].values() if "called" in r)
        rows += judge_rows(judged, judge_sizes)

    if "live" in parts:
        print("live mode, 1B shape: judging, and rewriting the report file, at a monitored step:", flush=True)

        def live(n: int) -> dict:
            r = child(["live", str(n), str(rounds)])
            print(f"  {n:,} pairs: judge {r['judge_s'] * 1e3:,.1f} ms, report file {r['write_s'] * 1e3:,.1f} ms, "
                  f"peak RSS {_mib(r)}", flush=True)
            return r
        grows = measured_or_projected({}, judge_sizes, budget, live)
        judge_part = {n: {"seconds": r["judge_s"]} for n, r in grows.items()}
        write_part = {n: {"seconds": r["write_s"]} for n, r in grows.items()}
        last = judge_sizes[-1]
        total_monitor, rewrites = live_monitor_seconds(judge_part, write_part, last, args.monitor_fixed_s)
        overhead = total_monitor / (last * 50 * args.train_step_s)
        every_pair = sum(args.monitor_fixed_s + _interpolate(grows, n) for n in range(1, last + 1)) / (
            last * 50 * args.train_step_s)
        first_overhead = (args.monitor_fixed_s + grows[judge_sizes[0]]["seconds"]) / (50 * args.train_step_s)
        rows.append(Row(f"live every=50, 1B, over {last:,} pairs (judge {_ms(judge_part[judge_sizes[0]])} → "
                        f"{_ms(judge_part[last])} ms; report file rewritten {rewrites} times, "
                        f"{_ms(write_part[judge_sizes[0]])} → {_ms(write_part[last])} ms; first pairs {first_overhead:.2%}; "
                        f"rewritten at every pair: {every_pair:.2%})",
                        f"{_approx(grows[last])}{overhead:.2%}, peak RSS {_mib(grows[last])}",
                        "≤ 0.5%", _verdict(overhead <= 0.005 and not grows[last].get("extrapolated"))))
        if not grows[last].get("extrapolated"):
            # Monitor(per_head="newest"): the report file keeps no old pair's per-head text.
            lean = child(["live", str(last), str(rounds), "newest"])
            print(f"  {last:,} pairs, per_head='newest': report file {lean['write_s'] * 1e3:,.1f} ms, "
                  f"peak RSS {_mib(lean)}", flush=True)
            rows.append(Row(f"live peak RSS at {last:,} pairs, 1B: per_head 'all' / 'newest'",
                            f"{_mib(grows[last])} / {_mib(lean)}", "", ""))

    if "report" in parts:
        print("JSON report, 80 layers × 64 heads:", flush=True)
        sized: dict[str, dict[int, dict]] = {"all": {}, DEFAULT_PER_HEAD: {}}
        args.root.mkdir(parents=True, exist_ok=True)
        for per_head, by_size in sized.items():
            for n in report_sizes:
                path = args.root / f"report-{n}.json"
                by_size[n] = child(["report", "80", "64", str(n), str(path), per_head])
                by_size[n].update(child(["load", str(path)]))  # its peak RSS: loading alone
                remove_report(path)
                r = by_size[n]
                extra = f"; one layer's JSON in schema 1: {r['layer_parts']}" if per_head == "all" else ""
                print(f"  --per-head {per_head}, {n} pairs: schema {r['schema']} {r['bytes'] / 1e6:.1f} MB (schema 1 "
                      f"{r['v1_bytes'] / 1e6:.1f} MB, its .json.gz {r['v1_gzip_bytes'] / 1e6:.1f} MB){extra}, "
                      f"written in {r['write_s']:.2f} s, json.load of the document {r['json_load_s']:.2f} s, "
                      f"load_report {r['load_report_s']:.2f} s, peak RSS {_mib(r)}; load average {load_average()}",
                      flush=True)
        a, b = report_sizes[0], report_sizes[-1]

        def at_2000(by_size: dict[int, dict], read) -> float:
            """Linear in the pairs: the larger size plus the slope between the two sizes."""
            return read(by_size[b]) + (read(by_size[b]) - read(by_size[a])) / (b - a) * (2_000 - b)

        for per_head, by_size in sized.items():
            per_pair = (by_size[b]["bytes"] - by_size[a]["bytes"]) / (b - a)
            size_2000 = at_2000(by_size, lambda r: r["bytes"])
            v1_2000 = at_2000(by_size, lambda r: r["v1_bytes"])
            v1_gzip_2000 = at_2000(by_size, lambda r: r["v1_gzip_bytes"])
            load_2000 = at_2000(by_size, lambda r: r["load_report_s"])
            rss_2000 = at_2000(by_size, lambda r: r["peak_rss"])
            default = per_head == DEFAULT_PER_HEAD
            what = f"JSON --per-head {per_head}{' (the default)' if default else ''}"
            rows.append(Row(f"{what}, 2,000 checkpoints × 80 layers × 64 heads, schema {by_size[b]['schema']} "
                            f"(projected linearly from generated reports of {a} and {b} pairs)",
                            f"~{size_2000 / 1e6:,.0f} MB ({per_pair / 1e6:.3f} MB/pair); schema 1 ~{v1_2000 / 1e6:,.0f} "
                            f"MB, as .json.gz ~{v1_gzip_2000 / 1e6:,.0f} MB", "≤ 100 MB" if default else "",
                            _verdict(size_2000 <= 100e6) if default else ""))
            rows.append(Row("  load_report of it: time / peak RSS", f"~{load_2000:.1f} s / ~{rss_2000 / 2**30:.2f} GiB",
                            "≤ 5 s, 1 GiB" if default else "",
                            _verdict(load_2000 <= 5 and rss_2000 <= 2**30) if default else ""))

    if "report2000" in parts:
        print("JSON report, 2,000 checkpoints × 80 layers × 64 heads, generated (60 judged pairs repeated):",
              flush=True)
        args.root.mkdir(parents=True, exist_ok=True)
        path = args.root / "report-2000.json"
        count = 300 if quick else 1_999
        r = child(["tiled", "80", "64", "60", str(count), str(path), DEFAULT_PER_HEAD])
        r.update(child(["load", str(path)]))
        remove_report(path)
        print(f"  {count + 1:,} checkpoints: schema {r['schema']} {r['bytes'] / 1e6:.1f} MB, written in "
              f"{r['write_s']:.1f} s, load_report {r['load_report_s']:.2f} s, its peak RSS {_mib(r)}; load average "
              f"{load_average()}", flush=True)
        rows.append(Row(f"JSON --per-head {DEFAULT_PER_HEAD} (the default), {count + 1:,} checkpoints × 80 layers × 64 "
                        f"heads, schema {r['schema']}, measured (generated: 60 judged pairs repeated)",
                        f"{r['bytes'] / 1e6:,.1f} MB; written whole in {r['write_s']:.0f} s", "≤ 100 MB",
                        _verdict(r["bytes"] <= 100e6)))
        rows.append(Row("  load_report of it: time / peak RSS",
                        f"{r['load_report_s']:.2f} s / {r['peak_rss'] / 2**30:.2f} GiB", "≤ 5 s, 1 GiB",
                        _verdict(r["load_report_s"] <= 5 and r["peak_rss"] <= 2**30)))

    if "renderers" in parts:
        print(f"the other reports at {LONG16.layers} layers × {LONG16.heads} heads (synthetic judged pairs):", flush=True)
        sizes = [30, 300] if quick else [30, 2_000]
        shown = {n: child(["renderers", str(LONG16.layers), str(LONG16.heads), str(n)]) for n in sizes}
        for n, r in shown.items():
            print(f"  {n:,} pairs: {json.dumps(r)}", flush=True)
        rows += renderer_rows(shown, sizes)

    if "rerun" in parts:
        print(f"re-run with --json: {LONG16.name} ({LONG16.layers} layers), {', '.join(map(str, rerun_sizes))} "
              f"checkpoints under {args.root}", flush=True)
        steps = [INTERVAL * k for k in range(rerun_sizes[-1] + 1)]
        checkpoints = ensure_run(LONG16, args.root / "source-16", steps)
        rows += rerun_rows(rerun_figures(checkpoints, args.root, rerun_sizes), rerun_sizes)

    if "run" in parts:
        print(f"generated long run: {trend_sizes[-1] + 3} checkpoints of {TINY.name} under {args.root}", flush=True)
        start = time.perf_counter()
        # trend: the first N, then one more; watch: the first N + 1, then two more (never in a cache).
        steps = [INTERVAL * k for k in range(trend_sizes[-1] + 3)]
        checkpoints = ensure_run(TINY, args.root / "source", steps)
        print(f"  ready in {time.perf_counter() - start:.0f} s, {TINY.total_bytes() / 1e3:.0f} KB each", flush=True)
        trends = trend_figures(checkpoints, args.root, trend_sizes)
        small, large = trends[trend_sizes[0]], trends[trend_sizes[-1]]
        ratio = large["again"]["seconds"] / large["diff"]["seconds"]
        rows.append(Row(f"trend {trend_sizes[-1] + 1:,} checkpoints: first run / after one new (cached)",
                        f"{large['first']['seconds']:.1f} s / {large['again']['seconds']:.1f} s"))
        rows.append(Row(f"  trend re-run / diff of the new pair ({large['diff']['seconds']:.1f} s)", f"{ratio:.1f}×",
                        "≤ 2×", _verdict(ratio <= 2)))
        rss_ratio = large["again"]["peak_rss"] / small["again"]["peak_rss"]
        rows.append(Row(f"  trend peak RSS at {trend_sizes[-1]:,} / at {trend_sizes[0]:,} checkpoints "
                        f"({_mib(large['again'])} / {_mib(small['again'])})", f"{rss_ratio:.2f}×", "≤ 1.5×",
                        _verdict(rss_ratio <= 1.5)))
        # The largest trend's cache holds exactly the pairs of its first trend_sizes[-1] + 1 checkpoints.
        watched = {n: watch_latency(checkpoints, args.root, n,
                                    args.root / f"cache-{n - 1}" if n - 1 == trend_sizes[-1] else None)
                   for n in watch_sizes}
        w_ratio = watched[watch_sizes[-1]]["seconds"] / watched[watch_sizes[0]]["seconds"]
        rows.append(Row(f"watch: new checkpoint → row, {watch_sizes[-1]:,} vs {watch_sizes[0]} in the directory "
                        f"({watched[watch_sizes[-1]]['seconds']:.2f} s / {watched[watch_sizes[0]]['seconds']:.2f} s)",
                        f"{w_ratio:.2f}×", "≤ 1.2×", _verdict(w_ratio <= 1.2)))

    print(f"\nload average after: {load_average()}; judging called: {called}")
    if quick:
        print("--quick: reduced sizes; the targets are stated for the full sizes")
    print()
    print_table(rows)


def _interpolate(measured: dict, n: int) -> float:
    sizes = sorted(measured)
    if n <= sizes[0]:
        return measured[sizes[0]]["seconds"]
    for lo, hi in zip(sizes, sizes[1:]):
        if n <= hi:
            a, b = measured[lo]["seconds"], measured[hi]["seconds"]
            return a + (b - a) * (n - lo) / (hi - lo)
    return measured[sizes[-1]]["seconds"]


if __name__ == "__main__":
    os.environ.setdefault("PYTHONPATH", str(Path(__file__).resolve().parent.parent))
    main()
