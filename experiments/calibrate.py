"""Set every detector's alarm threshold from the healthy calibration runs.

    python -m experiments.calibrate [--corpus corpus] [--rate 0.01] [--write] [--partial]

The target is a false-alarm rate: at most `rate` false alarms per healthy
run-length (3000 steps, 30 checkpoint pairs here). A detector raises an alarm
when its statistic crosses a threshold, so a healthy run raises one exactly
when the run's maximum statistic crosses it. With n healthy runs the
empirical maxima can only resolve rates down to 1/n, so the tail is
extrapolated: the maxima are fitted with a Gumbel law (the limit law of
maxima of light-tailed sequences; method of moments), and the threshold is
its (1 - rate) quantile, never below the largest maximum seen (no
calibration run may alarm). The same procedure sets ckptscan's change-point
thresholds and the two baselines', so they are compared at one rate.

Warnings use the same procedure at `warn_rate` (default 0.1).

The reference rule (`--reference`) is calibrated the same way: each healthy
calibration run is judged against the healthy run of its recipe with the
other calibration seed, the per-run maxima of its departure (in the
reference's own sigmas) are fitted, and `reference_scale_factor` is the
alert quantile over `alert_sigma`: how much wider than one run's noise two
healthy runs of one recipe differ.

A band of several references (`--reference A B ...`) is calibrated the same
way, leave-one-out: each healthy calibration run whose recipe has at least
two other healthy calibration runs (generation 2: four seeds per recipe, generation 3: three) is
judged against the band of the others; its largest departure in band sigmas
(band factor 1) on two pairs in a row, over the judged pairs, layers and
monitors compared across runs (update monitors only against references saved
at a like interval), is one maximum; `band_scale_factor` is the Gumbel alert
quantile of these maxima over `alert_sigma`. It may be below 1: the band's
sigma is the spread between its runs, and how many of those sigmas a healthy
run strays is what calibration measures, as for every other threshold. The
band judges the warm-up pairs too (detection/reference.py), so they count.
The same bands calibrate the layer-band rule (detection/layer_band.py): the
largest mean departure of a layer's attention update monitors on two pairs
in a row is one maximum, and `layer_band_warn` / `layer_band_alert` are the
Gumbel quantiles themselves (band sigmas). So is the run-band rule: the mean
of those layer means over the layers, `run_band_warn` / `run_band_alert`.

Only runs of the calibration split are read. `--partial` calibrates on the
runs whose metrics.json exists (a corpus still being generated), saying how
many were left out; its figures are provisional, never written. `--write`
stores the result in experiments/calibration.json, which
experiments.evaluate reads; ckptscan's own defaults
(ckptscan/detection/rules.py `Thresholds`) were set from this output by
hand, and the test in tests/detection pins that they agree.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from ckptscan.detection.reference import BAND_MIN_RUNS
from ckptscan.detection.rules import Thresholds
from experiments.baselines import BASELINES, read_log
from experiments.corpus import DEFAULT_OUT, healthy_seed_references, load_manifest, reference_run

CALIBRATION = Path(__file__).with_name("calibration.json")
EULER_GAMMA = 0.5772156649015329


def gumbel_quantile(maxima: list[float], rate: float) -> float:
    """The (1 - rate) quantile of a Gumbel law fitted to `maxima` by moments
    (scale β = s·√6/π, location μ = mean − γβ)."""
    beta = statistics.stdev(maxima) * math.sqrt(6) / math.pi
    mu = statistics.mean(maxima) - EULER_GAMMA * beta
    return mu - beta * math.log(-math.log(1 - rate))


def gumbel_threshold(maxima: list[float], rate: float) -> float:
    """The fitted quantile, and at least max(maxima): no calibration run may alarm."""
    finite = [m for m in maxima if math.isfinite(m)]
    if len(finite) < 2:
        return max(finite, default=0.0)
    return max(gumbel_quantile(finite, rate), max(finite))


def healthy_runs(manifest: dict, corpus: Path, partial: bool = False) -> list[Path]:
    """The healthy calibration runs (`partial`: those whose metrics exist)."""
    runs = [corpus / r["name"] for r in manifest["runs"] if r["split"] == "calibration" and r["fault"] == "none"]
    return [r for r in runs if (r / "metrics.json").exists()] if partial else runs


def baseline_maxima(runs: list[Path]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for run in runs:
        log = read_log(run)
        for detector in BASELINES:
            scores = detector.scores(log["step"], log[detector.field])
            out.setdefault(detector.name, []).append(max((z for _, z in scores), default=-math.inf))
    return out


def band_runs(manifest: dict, runs: list[Path]) -> list[tuple[Path, list[Path]]]:
    """Each of `runs` whose recipe has ≥ 2 other healthy calibration runs
    among `runs`, with those others: the leave-one-out bands."""
    present = set(runs)
    by_name = {r["name"]: r for r in manifest["runs"]}
    out = []
    for run in runs:
        band = [p for name in healthy_seed_references(manifest, by_name[run.name])
                if (p := run.parent / name) in present]
        if len(band) >= BAND_MIN_RUNS:
            out.append((run, band))
    return out


def calibrate(corpora: list[Path], rate: float, warn_rate: float, partial: bool = False) -> dict:
    from experiments.judge import band_maxima, changepoint_maxima, reference_maxima  # re-judged from metrics.json

    manifest = load_manifest()
    runs = [run for corpus in corpora for run in healthy_runs(manifest, corpus, partial)]
    named = [r.name if len(corpora) == 1 else f"{r.parent.name}/{r.name}" for r in runs]
    result: dict = {"rate": rate, "warn_rate": warn_rate, "healthy_runs": named, "thresholds": {}}
    maxima = {**baseline_maxima(runs), **changepoint_maxima(runs)}
    by_name = {r["name"]: r for r in manifest["runs"]}
    pairs = [(run, run.parent / reference_run(manifest, by_name[run.name], by_name[run.name]["seed"]))
             for run in runs]
    present = set(runs)
    maxima["reference departure"] = reference_maxima([(run, ref) for run, ref in pairs if ref in present])
    bands = band_runs(manifest, runs)
    maxima.update(band_maxima(bands))
    result["band_runs"] = [r.name if len(corpora) == 1 else f"{r.parent.name}/{r.name}" for r, _ in bands]
    for name, values in sorted(maxima.items()):
        if not values:
            continue
        result["thresholds"][name] = {
            "alert": round(gumbel_threshold(values, rate), 3),
            "warn": round(gumbel_threshold(values, warn_rate), 3),
            "healthy_maxima": [round(v, 3) for v in values],
        }
    alert_sigma = Thresholds().alert_sigma
    if "reference departure" in result["thresholds"]:
        result["reference_scale_factor"] = round(result["thresholds"]["reference departure"]["alert"] / alert_sigma, 3)
    layer = result["thresholds"].get("band departure, layer mean")
    if layer is not None:  # the layer-band rule's own levels, in band sigmas
        result["layer_band_alert"], result["layer_band_warn"] = layer["alert"], layer["warn"]
    run = result["thresholds"].get("band departure, run mean")
    if run is not None:  # and the run-band rule's
        result["run_band_alert"], result["run_band_warn"] = run["alert"], run["warn"]
    for factor, kind in (("band_scale_factor", "band departure, update monitors"),
                         ("band_state_scale_factor", "band departure, state monitors")):
        if kind in result["thresholds"]:
            result[factor] = round(result["thresholds"][kind]["alert"] / alert_sigma, 3)
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", type=Path, action="append",
                   help=f"a corpus directory (default {DEFAULT_OUT}); give it again to pool the calibration runs "
                        "of several generations of the corpus (e.g. trained on other machines)")
    p.add_argument("--rate", type=float, default=0.01, help="false alarms per healthy run-length (alerts)")
    p.add_argument("--warn-rate", type=float, default=0.1, help="the same for warnings")
    p.add_argument("--write", action="store_true", help=f"store the result in {CALIBRATION}")
    p.add_argument("--partial", action="store_true",
                   help="calibrate on the runs generated so far (provisional; not with --write)")
    args = p.parse_args(argv)
    if args.partial and args.write:
        p.error("--partial figures are provisional: not written")
    corpora = args.corpus or [Path(DEFAULT_OUT)]
    if not args.partial:  # what calibration reads: the healthy calibration runs, every one of them
        manifest = load_manifest()
        for corpus in corpora:
            missing = [run for run in healthy_runs(manifest, corpus) if not (run / "metrics.json").exists()]
            if missing:
                p.exit(2, f"{corpus}: {len(missing)} healthy calibration run(s) missing (e.g. {missing[0].name}); "
                          f"generate them with `python -m experiments.corpus --out {corpus} --split calibration`\n")
    result = calibrate(corpora, args.rate, args.warn_rate, args.partial)
    if args.partial:
        manifest = load_manifest()
        every = sum(len(healthy_runs(manifest, corpus)) for corpus in corpora)
        print(f"--partial: {len(result['healthy_runs'])} of {every} healthy calibration runs generated so far; "
              f"{every - len(result['healthy_runs'])} left out")
    print(f"{len(result['healthy_runs'])} healthy calibration runs; alert at {args.rate} and warn at "
          f"{args.warn_rate} false alarms per healthy run-length (Gumbel fit of the per-run maxima)")
    for name, t in result["thresholds"].items():
        print(f"  {name:34s} alert ≥ {t['alert']:8.3f}  warn ≥ {t['warn']:8.3f}  "
              f"healthy max {max(t['healthy_maxima']):8.3f}")
    print(f"  reference_scale_factor = reference departure alert / alert_sigma = "
          f"{result.get('reference_scale_factor', 'n/a (no pair of healthy runs)')}")
    print(f"  band_scale_factor = band departure alert / alert_sigma = "
          f"{result.get('band_scale_factor', 'n/a (no recipe with three healthy calibration runs)')}, "
          f"band_state_scale_factor {result.get('band_state_scale_factor', 'n/a')}"
          f" ({len(result['band_runs'])} runs judged against the band of the others); layer band: warn "
          f"{result.get('layer_band_warn', 'n/a')}, alert {result.get('layer_band_alert', 'n/a')}; run band: warn "
          f"{result.get('run_band_warn', 'n/a')}, alert {result.get('run_band_alert', 'n/a')}")
    if args.write:
        CALIBRATION.write_text(json.dumps(result, indent=1) + "\n")
        print(f"written: {CALIBRATION}")


if __name__ == "__main__":
    main()
