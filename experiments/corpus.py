"""Generate the calibration / held-out corpus fixed by experiments/corpus_manifest.json.

    python -m experiments.corpus                 # every run, two at a time, into corpus/
    python -m experiments.corpus --out DIR --jobs 2 --only NAME ...

Runs with "view_of" are not trained: they are another run seen through every
"stride"-th checkpoint (generation 3's checkpoints 200 steps apart), computed
after the runs they view.

Each run is `python -m experiments.train --out DIR/NAME <recipe flags> <fault
flags>` in its own process on one thread (bit-reproducible for one Python and
torch). A run whose run.json records the same command is complete and is
skipped, so an interrupted generation resumes where it stopped. After
training, the run's checkpoint metrics are computed once (`ckptscan.scan_run`)
and stored as DIR/NAME/metrics.json, so evaluation and calibration can re-judge
the runs with other thresholds in seconds.

The manifest fixes every run's recipe, its healthy twin (same seed and
recipe, no fault) and its split: rules are tuned on "calibration" only;
"heldout" is for the final figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

MANIFEST = Path(__file__).with_name("corpus_manifest.json")
DEFAULT_OUT = "corpus"


def load_manifest(path: Path = MANIFEST) -> dict:
    with open(path) as fh:
        return json.load(fh)


def require_corpus(corpus: Path) -> None:
    """One line and exit 2 when the corpus has not been generated (or only in part)."""
    missing = [r["name"] for r in load_manifest()["runs"] if not (corpus / r["name"] / "metrics.json").exists()]
    if missing:
        print(f"{corpus}: {len(missing)} run(s) of the manifest missing (e.g. {missing[0]}); "
              f"generate them with `python -m experiments.corpus --out {corpus}`", file=sys.stderr)
        raise SystemExit(2)


def reference_run(manifest: dict, run: dict, seed: int) -> str:
    """The healthy run of `run`'s recipe with `seed`, or, when that is the
    run's own seed, with another calibration seed: a known-healthy run a team
    would pass as --reference, never the run's own twin."""
    if seed == run["seed"]:
        seed = next(r["seed"] for r in manifest["runs"] if r["recipe"] == run["recipe"] and r["seed"] != seed
                    and r["fault"] == "none" and r["split"] == "calibration")
    return next(r["name"] for r in manifest["runs"]
                if r["recipe"] == run["recipe"] and r["seed"] == seed and r["fault"] == "none")


def healthy_seed_references(manifest: dict, run: dict) -> list[str]:
    """The healthy calibration runs of `run`'s recipe with another seed: the
    band a team's earlier healthy runs would make (never the run's own twin).
    A held-out run gets every calibration seed (two in generations 1/2, three
    in generation 3); a calibration run the others."""
    return [r["name"] for r in manifest["runs"] if r["recipe"] == run["recipe"] and r["seed"] != run["seed"]
            and r["fault"] == "none" and r["split"] == "calibration"]


def run_flags(manifest: dict, run: dict) -> list[str]:
    """The trainer flags of a run: its recipe's, its seed, then its fault's."""
    return [*manifest["recipes"][run["recipe"]], "--seed", str(run["seed"]), *run["fault_flags"]]


def is_complete(out: Path, flags: list[str]) -> bool:
    try:
        with open(out / "run.json") as fh:
            done = json.load(fh)
    except (OSError, ValueError):
        return False
    return done.get("command", "").endswith(" ".join(flags)) and (out / "metrics.json").exists()


def cost(flags: list[str]) -> float:
    """Relative training time of a run: layers x hidden size (the trainer's defaults otherwise)."""
    def flag(name: str, default: int) -> int:
        return int(flags[flags.index(name) + 1]) if name in flags else default
    return flag("--layers", 2) * flag("--hidden-size", 64) * flag("--steps", 3000)


def is_view_complete(out: Path, source: Path) -> bool:
    """A view is complete once its metrics exist and are newer than its source run's."""
    metrics = out / "metrics.json"
    return metrics.exists() and (source / "metrics.json").exists() \
        and metrics.stat().st_mtime >= (source / "metrics.json").stat().st_mtime


def generate_view(name: str, source: Path, stride: int, out: Path) -> tuple[str, float, str]:
    """The metrics of every `stride`-th checkpoint of an already trained run: nothing is trained."""
    t0 = time.time()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    metrics = subprocess.run([sys.executable, "-m", "experiments.metrics", "--view-of", str(source), "--stride",
                              str(stride), str(out)], capture_output=True, text=True, env=env)
    if metrics.returncode != 0:
        return name, time.time() - t0, "metrics failed: " + metrics.stderr.strip().splitlines()[-1]
    return name, time.time() - t0, f"every {stride}th checkpoint of {source}"


def generate(name: str, flags: list[str], out: Path) -> tuple[str, float, str]:
    t0 = time.time()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "experiments.train", "--out", str(out), "--threads", "1", *flags]
    train = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if train.returncode != 0:
        return name, time.time() - t0, "train failed: " + train.stderr.strip().splitlines()[-1]
    metrics = subprocess.run([sys.executable, "-m", "experiments.metrics", str(out)], capture_output=True,
                             text=True, env=env)
    if metrics.returncode != 0:
        return name, time.time() - t0, "metrics failed: " + metrics.stderr.strip().splitlines()[-1]
    return name, time.time() - t0, train.stdout.strip().splitlines()[-1]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=DEFAULT_OUT, help="corpus directory (default: corpus/, git-ignored)")
    p.add_argument("--jobs", type=int, default=2, help="runs trained at once, one thread each")
    p.add_argument("--only", nargs="*", help="generate only these runs")
    p.add_argument("--split", choices=["calibration", "heldout"], help="generate only this split")
    p.add_argument("--generation", type=int, help="generate only this generation (runs without one are generation 1)")
    p.add_argument("--cheapest-first", action="store_true",
                   help="train the cheapest runs first (results to look at sooner; the default finishes sooner)")
    p.add_argument("--manifest", type=Path, default=MANIFEST)
    args = p.parse_args(argv)
    manifest = load_manifest(args.manifest)
    todo, views = [], []
    for run in manifest["runs"]:
        if args.only and run["name"] not in args.only or args.split and run["split"] != args.split \
                or args.generation is not None and run.get("generation", 1) != args.generation:
            continue
        out = Path(args.out) / run["name"]
        if "view_of" in run:
            views.append((run["name"], Path(args.out) / run["view_of"], run["stride"], out))
            continue
        flags = run_flags(manifest, run)
        if is_complete(out, flags):
            continue
        todo.append((run["name"], flags, out))
    # Longest first, so that two jobs finish together rather than one waiting on a late 4-layer run.
    todo.sort(key=lambda job: cost(job[1]) if args.cheapest_first else -cost(job[1]))
    print(f"{len(todo)} run(s) to generate into {args.out}/ with {args.jobs} job(s)", flush=True)
    t0 = time.time()
    failed = 0
    with ThreadPoolExecutor(args.jobs) as pool:
        for name, seconds, line in pool.map(lambda job: generate(*job), todo):
            failed += "failed" in line
            print(f"[{time.time() - t0:6.0f}s] {name} ({seconds:.0f}s): {line}", flush=True)
    # Views last: they read the checkpoints of runs trained above.
    views = [v for v in views if (v[1] / "metrics.json").exists() and not is_view_complete(v[3], v[1])]
    with ThreadPoolExecutor(args.jobs) as pool:
        for name, seconds, line in pool.map(lambda view: generate_view(*view), views):
            failed += "failed" in line
            print(f"[{time.time() - t0:6.0f}s] {name} ({seconds:.0f}s): {line}", flush=True)
    print(f"done in {time.time() - t0:.0f}s, {failed} failed")
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
