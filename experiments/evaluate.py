"""Evaluate ckptscan and the baselines users already have on the corpus.

    python -m experiments.evaluate [--split heldout|calibration|all] [--corpus corpus] [--legacy]

Per run: fault, onset (first step with the fault), loss-divergence step,
ckptscan's first warning and first alert per family, its verdict, and the
first alarm of the loss-spike and grad-norm-spike detectors
(experiments/baselines.py), each with its lead as a fraction of the
onset→divergence window. Then a summary per detector.

Definitions (one place):
- divergence: experiments/divergence.py on the run's loss log (the 50-step
  trailing mean rises 0.5 nats above its running minimum for good).
- onset: the fault's first step (0 for faults from the start). A ckptscan
  alert on a pair whose newer checkpoint is ≤ onset, or a baseline alarm at a
  logged step < onset, saw weights or losses the fault had not touched: a
  false alarm. On a healthy run every alarm is a false alarm.
- detected: an alarm after onset, before divergence when the run diverged;
  for ckptscan, an alert in the fault's own family (attention, router; either
  for "both"). A warning is reported but is not a detection.
- lead: (divergence − alarm) / (divergence − onset), on diverging runs; a miss
  or an alarm at or after divergence counts 0.
- measurable effect: the run diverged, or against its healthy twin (same
  recipe and seed) the largest QK logit bound grew ≥ 25 % above the twin's,
  or a layer's normalised Δ2 entropy or routing entropy fell ≥ 0.1 below it.
  Faults without one are listed but not counted as misses.
- wrong first family: the family of ckptscan's first alert is not the fault's.

ckptscan is judged from each run's stored metrics (experiments/judge.py),
with the thresholds in ckptscan/detection/rules.py (`--legacy`: the rules
before the change-point statistic, for a before/after). The baselines'
thresholds come from experiments/calibration.json (experiments/calibrate.py,
healthy calibration runs only).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
from pathlib import Path

from ckptscan.detection.rules import Thresholds
from experiments.baselines import BASELINES, read_log
from experiments.calibrate import CALIBRATION
from experiments.corpus import DEFAULT_OUT, load_manifest, reference_run, require_corpus
from experiments.divergence import divergence_step
from experiments.judge import judge_run, load_report

FAULT_FAMILIES = {"attention": {"attention"}, "router": {"router"}, "both": {"attention", "router"}, "none": set()}
# The rules as they were before the change-point statistic (issue #13's "before").
LEGACY = dict(cusum_warn=math.inf, cusum_alert=math.inf, pooled_cusum_warn=math.inf, pooled_cusum_alert=math.inf,
              cross_layer_min_layers=4)


@dataclasses.dataclass
class Outcome:
    run: dict
    onset: int | None
    divergence: int | None
    effect: dict
    measurable: bool
    first_warn: dict
    first_alert: dict
    first_family: str | None
    verdict: str
    ckptscan_alarm: int | None  # first own-family alert after onset
    ckptscan_false: int | None  # first alert at or before onset (or any, on a healthy run)
    baseline_alarm: dict  # name -> first alarm after onset
    baseline_false: dict  # name -> first alarm before onset (or any, on a healthy run)


def fault_onset(run_dir: Path) -> int | None:
    with open(run_dir / "run.json") as fh:
        faults = json.load(fh)["faults"]
    return min((f["from_step"] for f in faults.values()), default=None)


def twin_effect(run_dir: Path, twin_dir: Path, onset: int) -> dict:
    """How far the fault moved the weights' monitors from the healthy twin's, after onset."""
    ours, theirs = load_report(run_dir), load_report(twin_dir)
    twin_pairs = {p.to_step: p for p in theirs.pairs}
    logit, delta2, routing = 1.0, 0.0, 0.0
    for pair in ours.pairs:
        other = twin_pairs.get(pair.to_step)
        if other is None or pair.to_step <= onset:
            continue
        for a, b in zip(pair.layers, other.layers):
            if a.attention and b.attention:
                if a.attention.qk_logit_bound and b.attention.qk_logit_bound:
                    logit = max(logit, a.attention.qk_logit_bound / b.attention.qk_logit_bound)
                if a.attention.delta2_entropy_norm is not None and b.attention.delta2_entropy_norm is not None:
                    delta2 = max(delta2, b.attention.delta2_entropy_norm - a.attention.delta2_entropy_norm)
            if a.router and b.router and a.router.routing_entropy_norm is not None \
                    and b.router.routing_entropy_norm is not None:
                routing = max(routing, b.router.routing_entropy_norm - a.router.routing_entropy_norm)
    return {"logit_ratio": logit, "delta2_drop": delta2, "routing_drop": routing}


def evaluate_run(corpus: Path, run: dict, thresholds: Thresholds, calibration: dict,
                 reference: str | None = None) -> Outcome:
    run_dir = corpus / run["name"]
    log = read_log(run_dir)
    divergence = divergence_step(log["step"], log["loss"])
    onset = fault_onset(run_dir)
    report = judge_run(run_dir, thresholds, divergence, corpus / reference if reference else None)
    families = FAULT_FAMILIES[run["fault"]]
    effect, measurable = {}, False
    if run["twin"] is not None:
        effect = twin_effect(run_dir, corpus / run["twin"], onset)
        measurable = (divergence is not None or effect["logit_ratio"] >= 1.25 or effect["delta2_drop"] >= 0.1
                      or effect["routing_drop"] >= 0.1)
    own, false = None, None
    for pair in report.pairs:
        alerts = {f.family for layer in pair.layers for f in layer.findings if f.severity == "alert"}
        if alerts and false is None and (onset is None or pair.to_step <= onset):
            false = pair.to_step
        if onset is not None and pair.to_step > onset and alerts & families and own is None:
            own = pair.to_step
    baseline_alarm, baseline_false = {}, {}
    for detector in BASELINES:
        threshold = calibration["thresholds"][detector.name]["alert"]
        first = detector.first_alarm(log["step"], log[detector.field], threshold)
        baseline_false[detector.name] = first if first is not None and (onset is None or first < onset) else None
        baseline_alarm[detector.name] = None if onset is None else \
            detector.first_alarm(log["step"], log[detector.field], threshold, after=onset - 1)
    s = report.summary
    return Outcome(run, onset, divergence, effect, measurable, dict(s.first_warn_step), dict(s.first_alert_step),
                   s.first_family, s.status, own, false, baseline_alarm, baseline_false)


def lead(o: Outcome, alarm: int | None) -> float | None:
    """Lead as a fraction of the onset→divergence window; 0 for a miss; None if the run did not diverge."""
    if o.divergence is None or o.onset is None:
        return None
    if alarm is None or alarm >= o.divergence:
        return 0.0
    return (o.divergence - alarm) / (o.divergence - o.onset)


def _fmt(step: int | None) -> str:
    return "–" if step is None else str(step)


def _pct(x: float | None) -> str:
    return "" if x is None else f"{100 * x:.0f}%"


def print_table(outcomes: list[Outcome]) -> None:
    head = (f"{'run':36s} {'fault':9s} {'onset':>5s} {'div':>5s} {'warn att/rtr':>12s} "
            f"{'alert att/rtr':>13s} {'verdict':7s} {'ckptscan':>12s} {'loss spike':>12s} {'grad spike':>12s}  effect")
    print(head)
    print("-" * len(head))
    for o in outcomes:
        def cell(alarm: int | None, false: int | None) -> str:
            if false is not None:
                return f"FA@{false}"
            return f"{_fmt(alarm)} {_pct(lead(o, alarm))}".strip()
        effect = ""
        if o.effect:
            effect = (f"logit×{o.effect['logit_ratio']:.2f} Δ2−{o.effect['delta2_drop']:.2f} "
                      f"rout−{o.effect['routing_drop']:.2f}" + ("" if o.measurable else " (none)"))
        print(f"{o.run['name']:36s} {o.run['fault']:9s} {_fmt(o.onset):>5s} {_fmt(o.divergence):>5s} "
              f"{_fmt(o.first_warn.get('attention')) + '/' + _fmt(o.first_warn.get('router')):>12s} "
              f"{_fmt(o.first_alert.get('attention')) + '/' + _fmt(o.first_alert.get('router')):>13s} "
              f"{o.verdict:7s} {cell(o.ckptscan_alarm, o.ckptscan_false):>12s} "
              f"{cell(o.baseline_alarm.get('loss_spike'), o.baseline_false.get('loss_spike')):>12s} "
              f"{cell(o.baseline_alarm.get('grad_spike'), o.baseline_false.get('grad_spike')):>12s}  {effect}")


def summarize(outcomes: list[Outcome]) -> dict:
    healthy = [o for o in outcomes if o.run["fault"] == "none"]
    faulty = [o for o in outcomes if o.run["fault"] != "none"]
    measurable = [o for o in faulty if o.measurable]
    mid_run = [o for o in faulty if o.onset]
    diverging = [o for o in faulty if o.divergence is not None]
    detectors = {"ckptscan": (lambda o: o.ckptscan_alarm, lambda o: o.ckptscan_false)}
    for d in BASELINES:
        detectors[d.name] = (lambda o, n=d.name: o.baseline_alarm[n], lambda o, n=d.name: o.baseline_false[n])
    out = {}
    for name, (alarm, false) in detectors.items():
        def before_divergence(o: Outcome) -> bool:
            a = alarm(o)
            return a is not None and false(o) is None and (o.divergence is None or a < o.divergence)
        leads = [lead(o, alarm(o) if false(o) is None else None) for o in diverging]
        out[name] = {
            "detected": sum(before_divergence(o) for o in measurable), "measurable": len(measurable),
            "false_healthy": sum(false(o) is not None for o in healthy), "healthy": len(healthy),
            "false_pre_onset": sum(false(o) is not None for o in mid_run), "mid_run": len(mid_run),
            "median_lead": statistics.median(leads) if leads else None, "diverging": len(diverging),
        }
    wrong = [o.run["name"] for o in faulty if o.first_family is not None
             and o.first_family not in FAULT_FAMILIES[o.run["fault"]]]
    out["ckptscan"]["wrong_first_family"] = len(wrong)
    ahead = [o for o in diverging if all(
        (lead(o, o.ckptscan_alarm if o.ckptscan_false is None else None) or 0)
        > (lead(o, o.baseline_alarm[d.name] if o.baseline_false[d.name] is None else None) or 0) for d in BASELINES)]
    out["ckptscan"]["ahead_of_both"] = len(ahead)
    return out


def print_summary(summary: dict) -> None:
    print()
    print(f"{'detector':11s} {'detected before div.':>21s} {'FA healthy':>11s} {'FA pre-onset':>13s} "
          f"{'median lead':>12s}  other")
    for name, s in summary.items():
        other = ""
        if name == "ckptscan":
            other = (f"wrong first family {s['wrong_first_family']}; ahead of both baselines on "
                     f"{s['ahead_of_both']}/{s['diverging']} diverging runs")
        print(f"{name:11s} {str(s['detected']) + '/' + str(s['measurable']):>21s} "
              f"{str(s['false_healthy']) + '/' + str(s['healthy']):>11s} "
              f"{str(s['false_pre_onset']) + '/' + str(s['mid_run']):>13s} "
              f"{_pct(s['median_lead']) + ' of ' + str(s['diverging']):>12s}  {other}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--split", choices=["heldout", "calibration", "all"], default="heldout")
    p.add_argument("--corpus", type=Path, default=Path(DEFAULT_OUT))
    p.add_argument("--legacy", action="store_true", help="the rules before the change-point statistic")
    p.add_argument("--reference-seed", type=int, default=None,
                   help="judge each run with --reference = the healthy run of its recipe with this seed "
                        "(a calibration seed; for a run of that very seed, the other calibration seed)")
    args = p.parse_args(argv)
    require_corpus(args.corpus)
    manifest = load_manifest()
    calibration = json.loads(CALIBRATION.read_text())
    thresholds = dataclasses.replace(Thresholds(), **LEGACY) if args.legacy else Thresholds()
    runs = [r for r in manifest["runs"] if args.split == "all" or r["split"] == args.split]
    outcomes = [evaluate_run(args.corpus, run, thresholds, calibration,
                             None if args.reference_seed is None else reference_run(manifest, run, args.reference_seed))
                for run in runs]
    print(f"split: {args.split} ({len(runs)} runs); ckptscan rules: {'legacy' if args.legacy else 'current'}"
          + ("" if args.reference_seed is None else f"; --reference: the recipe's healthy seed-{args.reference_seed} "
             "run (the other calibration seed for that seed's own runs)"))
    print("cells: first alarm step and lead (% of onset→divergence); FA@s: false alarm at step s\n")
    print_table(outcomes)
    print_summary(summarize(outcomes))


if __name__ == "__main__":
    main()
