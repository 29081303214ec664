"""The corpus judged as sweeps (`ckptscan.pipeline.sweep.compare_runs`, issue #25):
with the runs that alert against all the others left out of their bands,
and without (every band holds all the other runs).

    python -m experiments.sweeps [--corpus corpus] [--cache DIR]

One sweep per recipe: every faulty run of the recipe that has been
generated, and the recipe's healthy runs of every seed without a faulty run
in the sweep (a faulty run's healthy twin, same seed and data order, would
be an oracle, not a sibling). Generation 3 is also seen through every 4th
checkpoint (`stride=4`: its runs saved 200 steps apart). Runs are scanned
from their checkpoints with a pair cache, as `ckptscan compare` does.

Per run: fault onset, loss divergence, and for each setting the first alert
in the fault's own family after onset (a detection when before divergence)
with its lead, as experiments/evaluate.py defines them; any alert on a
healthy run, or at or before onset, is a false alarm. Then per setting:
false alarms, detections and the median lead over the diverging runs.

Last, `--reference` screening's false exclusions (`detection/screening.py`):
each healthy reference set of the held-out evaluation (the healthy seeds of
a recipe, `--references healthy-seeds`) screened from its stored metrics;
every run left out is a healthy run wrongly taken for a faulty one.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from ckptscan.caches.pair_cache import PairCache
from ckptscan.detection.screening import screen_references
from ckptscan.detection.thresholds import Thresholds
from ckptscan.schema.results import SweepReport
from ckptscan.pipeline.sweep import compare_runs
from experiments.baselines import read_log
from experiments.corpus import DEFAULT_OUT, healthy_seed_references, load_manifest
from experiments.divergence import divergence_step
from experiments.evaluate import FAULT_FAMILIES, fault_onset, first_alarms, window_lead
from experiments.judge import load_report

SETTINGS = (("bands of all others", False), ("alerting runs left out", True))


def sweeps(manifest: dict, corpus: Path) -> list[tuple[str, list[dict], int]]:
    """(title, runs, stride) of each sweep (module docstring)."""
    found = []
    for recipe in dict.fromkeys(run["recipe"] for run in manifest["runs"]):
        runs = [run for run in manifest["runs"] if run["recipe"] == recipe and "view_of" not in run
                and (corpus / run["name"] / "metrics.json").is_file()]
        faulty = [run for run in runs if run["fault"] != "none"]
        seeds = {run["seed"] for run in faulty}
        members = [run for run in runs if run["fault"] == "none" and run["seed"] not in seeds] + faulty
        if len(members) >= 3 and faulty:
            found.append((recipe, members, 1))
            if recipe.startswith("g3-") and recipe.endswith("-i50"):
                found.append((recipe.replace("-i50", "-i50 seen every 200 steps"), members, 4))
    return found


def healthy_reference_sets(manifest: dict, corpus: Path) -> list[list[str]]:
    """The distinct healthy-seed reference sets of the held-out runs, all of whose runs are generated."""
    sets: list[list[str]] = []
    for run in manifest["runs"]:
        names = healthy_seed_references(manifest, run) if run["split"] == "heldout" else []
        if names and names not in sets and all((corpus / n / "metrics.json").is_file() for n in names):
            sets.append(names)
    return sets


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=Path(DEFAULT_OUT))
    parser.add_argument("--cache", type=Path, default=None, help="pair cache (default: CORPUS/.sweep-cache)")
    args = parser.parse_args(argv)
    cache = PairCache(args.cache or args.corpus / ".sweep-cache")
    totals = {name: {"false": 0, "healthy": 0, "detected": 0, "faulty": 0, "leads": []} for name, _ in SETTINGS}
    for title, members, stride in sweeps(load_manifest(), args.corpus):
        results: dict[str, SweepReport] = {
            name: compare_runs([args.corpus / run["name"] for run in members], stride=stride, cache=cache,
                               leave_out=leave_out) for name, leave_out in SETTINGS}
        print(f"## {title}: {len(members)} runs; left out: "
              f"{', '.join(Path(p).name for p in results[SETTINGS[1][0]].left_out) or 'none'}")
        print(f"   {'run':36s} {'onset':>5s} {'div':>5s}  " + "  ".join(f"{name:>24s}" for name, _ in SETTINGS))
        for run in members:
            run_dir = args.corpus / run["name"]
            onset = fault_onset(run_dir)
            log = read_log(run_dir)
            divergence = divergence_step(log["step"], log["loss"])
            cells = []
            for name, _ in SETTINGS:
                report = next(r.report for r in results[name].runs if Path(r.path).name == run["name"])
                own, false = first_alarms(report, FAULT_FAMILIES[run["fault"]], onset)
                total = totals[name]
                if run["fault"] == "none":
                    total["healthy"] += 1
                    total["false"] += false is not None
                    cells.append(f"FA@{false}" if false is not None else "–")
                    continue
                total["faulty"] += 1
                total["false"] += false is not None
                detected = own is not None and (divergence is None or own < divergence)
                total["detected"] += detected
                share = window_lead(onset, divergence, own)
                if share is not None:
                    total["leads"].append(share)
                cells.append(("–" if own is None else str(own)) + ("" if share is None else f" {100 * share:.0f}%")
                             + (f" FA@{false}" if false is not None else ""))
            print(f"   {run['name']:36s} {onset if onset is not None else '–':>5} "
                  f"{divergence if divergence is not None else '–':>5}  " + "  ".join(f"{c:>24s}" for c in cells))
    print()
    for name, _ in SETTINGS:
        total = totals[name]
        median = f"{100 * statistics.median(total['leads']):.0f}% of {len(total['leads'])}" if total["leads"] else "–"
        print(f"{name:24s} false alarms {total['false']} (healthy runs {total['healthy']}); detected "
              f"{total['detected']}/{total['faulty']}; median lead over diverging runs {median}")
    sets = healthy_reference_sets(load_manifest(), args.corpus)
    left_out = [name for names in sets for name in screen_references(
        [load_report(args.corpus / n) for n in names], names, Thresholds()).left_out]
    print(f"--reference screening of {len(sets)} healthy reference sets ({sum(map(len, sets))} healthy runs): "
          f"{len(left_out)} left out{': ' + ', '.join(left_out) if left_out else ''}")


if __name__ == "__main__":
    main()
