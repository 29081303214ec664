"""Evaluate ckptscan and the baselines users already have on the corpus.

    python -m experiments.evaluate [--split heldout|calibration|all] [--corpus corpus] [--legacy]
        [--reference-seed N | --references healthy-seeds] [--partial]

Per run: fault, onset (first step with the fault), loss-divergence step,
ckptscan's first warning and first alert per family, its verdict, the
first alarm of the loss-spike and grad-norm-spike detectors
(experiments/baselines.py) and the oracle's step (below), each with its lead
as a fraction of the onset→divergence window; healthy runs, faults present
from step 0 and faults switched on mid-run in separate sections. Then a
summary per detector, its median lead over all diverging runs, over those
with the fault from step 0 and over those with it switched on mid-run; for
generations 1/2 (runs without "generation" in the manifest), generation 3,
and all together.

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
- wrong primary family: the family ckptscan names first (`summary.primary_family`
  where the report has it, else `summary.first_family`) is not the fault's.
  Without a primary family, a tie (another family's first alert on the same
  pair as the fault's) counts as wrong too: the report could not say which
  came first.
- oracle: the limit of the signals, what a rule that knew the faulty run's
  same-seed healthy twin (manifest "twin") could see. For each layer and
  each monitor of the fault's family compared across runs (attention:
  normalised Δ2 entropy and the QK logit bound; router: normalised routing
  entropy and router ε; the bound and ε on a log scale, as ckptscan judges
  them), the twin's jitter is the robust sigma of its successive
  differences over its whole series (1.4826 × MAD / √2), floored at the
  monitor's `min_scale` (its Judging, ckptscan/monitors/). The run departs on a
  pair when run − twin at the pair's step, toward the monitor's alarm side
  (for a two-sided monitor, one side for both pairs), exceeds 3 × that
  jitter. The oracle's step is the newer step of the second of the first two
  consecutive departing pairs after onset (newer checkpoint > onset), on any
  layer and monitor; its lead is computed as for an alarm.

ckptscan is judged from each run's stored metrics (experiments/judge.py),
with the thresholds in ckptscan/detection/rules.py (`--legacy`: the rules
before the change-point statistic, for a before/after). The baselines'
thresholds come from experiments/calibration.json (experiments/calibrate.py,
healthy calibration runs only).

References: `--reference-seed N` judges each run against the healthy run of
its recipe with seed N (another calibration seed for that seed's own runs);
`--references healthy-seeds` against the band of its recipe's healthy
calibration runs of every other seed (a held-out run: all calibration seeds;
a calibration run: the others; one run is a single reference, two or more a
band). `--partial` evaluates the runs whose metrics exist, with their twin's
and references' (a corpus still being generated), and says how many were left out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
from pathlib import Path

from ckptscan.detection.catalog import JudgedMonitor, judged_by_name
from ckptscan.detection.rules import Thresholds
from ckptscan.detection.series import difference_scale, judged_value
from ckptscan.schema.results import PairResult, ScanReport, Summary
from experiments import pinned
from experiments.baselines import BASELINES, read_log
from experiments.calibrate import CALIBRATION
from experiments.corpus import DEFAULT_OUT, healthy_seed_references, load_manifest, reference_run, require_corpus
from experiments.divergence import divergence_step
from experiments.judge import judge_run, load_report

FAULT_FAMILIES = {"attention": {"attention"}, "router": {"router"}, "both": {"attention", "router"}, "none": set()}
# The rules as they were before the change-point statistic (issue #13's "before").
LEGACY = dict(cusum_warn=math.inf, cusum_alert=math.inf, pooled_cusum_warn=math.inf, pooled_cusum_alert=math.inf,
              cross_layer_min_layers=4)
# The oracle (module docstring): each family's monitors compared across runs,
# a departure of more than ORACLE_SIGMAS twin jitters, ORACLE_PAIRS pairs in a row.
ORACLE_MONITORS = {"attention": ("delta2_entropy_norm", "qk_logit_bound"),
                   "router": ("routing_entropy_norm", "epsilon")}
ORACLE_SIGMAS = 3.0
ORACLE_PAIRS = 2


@dataclasses.dataclass
class Outcome:
    run: dict
    onset: int | None
    divergence: int | None
    effect: dict
    measurable: bool
    first_warn: dict
    first_alert: dict
    family: str | None  # the family ckptscan names first: its primary family, else its first family
    wrong_family: bool  # (faulty runs) that family is not the fault's, or a tie when no primary is named
    verdict: str
    ckptscan_alarm: int | None  # first own-family alert after onset
    ckptscan_false: int | None  # first alert at or before onset (or any, on a healthy run)
    baseline_alarm: dict  # name -> first alarm after onset
    baseline_false: dict  # name -> first alarm before onset (or any, on a healthy run)
    oracle: int | None  # the step at which the run leaves its healthy twin (module docstring)

    @property
    def generation(self) -> str:
        return str(self.run.get("generation", "1/2"))

    @property
    def from_step_0(self) -> bool:
        return self.onset == 0


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


def oracle_step(report: ScanReport, twin: ScanReport, families: set[str], onset: int) -> int | None:
    """The first step at which `report` leaves its healthy twin beyond the
    twin's own jitter (module docstring), None if it never does."""
    twin_pairs = {p.to_step: p for p in twin.pairs}
    numbers = sorted({layer.layer for pair in report.pairs for layer in pair.layers})
    first = None
    for monitor in [judged_by_name()[name] for family in sorted(families) for name in ORACLE_MONITORS[family]]:
        sides = {"low": (-1.0,), "high": (1.0,), "both": (1.0, -1.0)}[monitor.spec.bad]
        for number in numbers:
            twin_series = [y for y in (_judged(monitor, p, number) for p in sorted(twin.pairs, key=lambda p: p.to_step))
                           if not math.isnan(y)]
            if len(twin_series) < 2:
                continue
            jitter = difference_scale(twin_series, monitor.spec.min_scale)
            departures = [(pair.to_step, (_judged(monitor, pair, number)
                                          - _judged(monitor, twin_pairs.get(pair.to_step), number)) / jitter)
                          for pair in report.pairs]
            for side in sides:
                streak = 0
                for step, departure in departures:
                    # nan (no value, or no twin pair at this step) compares False: it ends a streak.
                    streak = streak + 1 if step > onset and side * departure > ORACLE_SIGMAS else 0
                    if streak >= ORACLE_PAIRS:
                        first = step if first is None else min(first, step)
                        break
    return first


def _judged(monitor: JudgedMonitor, pair: PairResult | None, number: int) -> float:
    """`monitor`'s judged value in layer `number` of `pair`; nan where there is none."""
    layer = next((r for r in pair.layers if r.layer == number), None) if pair is not None else None
    return judged_value(monitor.read(layer) if layer is not None else None, monitor.spec.log)


def family_verdict(summary: Summary, fault: str) -> tuple[str | None, bool]:
    """The family ckptscan names first, and whether that is wrong for `fault`
    (module docstring: a tie without a primary family counts as wrong)."""
    right = FAULT_FAMILIES[fault]
    primary = getattr(summary, "primary_family", None)  # reports before primary-family attribution lack it
    if primary is not None:
        return primary, fault != "none" and primary not in right
    steps = [s for s in summary.first_alert_step.values() if s is not None]
    tied = {f for f, s in summary.first_alert_step.items() if steps and s == min(steps)}
    return summary.first_family, fault != "none" and bool(tied - right)


def evaluate_run(corpus: Path, run: dict, thresholds: Thresholds, calibration: dict,
                 references: list[str] | None = None) -> Outcome:
    run_dir = corpus / run["name"]
    log = read_log(run_dir)
    divergence = divergence_step(log["step"], log["loss"])
    onset = fault_onset(run_dir)
    references = list(references or [])
    report = judge_run(run_dir, thresholds, divergence, [corpus / name for name in references])
    families = FAULT_FAMILIES[run["fault"]]
    effect, measurable, oracle = {}, False, None
    if run["twin"] is not None:
        effect = twin_effect(run_dir, corpus / run["twin"], onset)
        oracle = oracle_step(load_report(run_dir), load_report(corpus / run["twin"]), families, onset)
        measurable = (divergence is not None or effect["logit_ratio"] >= 1.25 or effect["delta2_drop"] >= 0.1
                      or effect["routing_drop"] >= 0.1)
    own, false = first_alarms(report, families, onset)
    baseline_alarm, baseline_false = {}, {}
    for detector in BASELINES:
        threshold = calibration["thresholds"][detector.name]["alert"]
        first = detector.first_alarm(log["step"], log[detector.field], threshold)
        baseline_false[detector.name] = first if first is not None and (onset is None or first < onset) else None
        baseline_alarm[detector.name] = None if onset is None else \
            detector.first_alarm(log["step"], log[detector.field], threshold, after=onset - 1)
    s = report.summary
    family, wrong = family_verdict(s, run["fault"])
    return Outcome(run, onset, divergence, effect, measurable, dict(s.first_warn_step), dict(s.first_alert_step),
                   family, wrong, s.status, own, false, baseline_alarm, baseline_false, oracle)


def first_alarms(report: ScanReport, families: set[str], onset: int | None) -> tuple[int | None, int | None]:
    """ckptscan's first alert in one of `families` after onset, and its first
    alert of any family at or before onset (any alert, on a healthy run)."""
    own, false = None, None
    for pair in report.pairs:
        alerts = {f.family for layer in pair.layers for f in layer.findings if f.severity == "alert"}
        if alerts and false is None and (onset is None or pair.to_step <= onset):
            false = pair.to_step
        if onset is not None and pair.to_step > onset and alerts & families and own is None:
            own = pair.to_step
    return own, false


def lead(o: Outcome, alarm: int | None) -> float | None:
    """Lead as a fraction of the onset→divergence window; 0 for a miss; None if the run did not diverge."""
    return window_lead(o.onset, o.divergence, alarm)


def window_lead(onset: int | None, divergence: int | None, alarm: int | None) -> float | None:
    """`lead` from the steps themselves."""
    if divergence is None or onset is None:
        return None
    if alarm is None or alarm >= divergence:
        return 0.0
    return (divergence - alarm) / (divergence - onset)


def _fmt(step: int | None) -> str:
    return "–" if step is None else str(step)


def _pct(x: float | None, missing: str = "") -> str:
    return missing if x is None else f"{100 * x:.0f}%"


def print_table(outcomes: list[Outcome]) -> None:
    head = (f"{'run':36s} {'fault':9s} {'onset':>5s} {'div':>5s} {'warn att/rtr':>12s} "
            f"{'alert att/rtr':>13s} {'verdict':7s} {'family':9s} {'ckptscan':>12s} {'loss spike':>12s} "
            f"{'grad spike':>12s} {'oracle':>12s}  effect")
    sections = [("healthy runs", [o for o in outcomes if o.run["fault"] == "none"]),
                ("faults from step 0", [o for o in outcomes if o.run["fault"] != "none" and o.from_step_0]),
                ("faults switched on mid-run", [o for o in outcomes if o.run["fault"] != "none" and not o.from_step_0])]
    print(head)
    for title, members in sections:
        if not members:
            continue
        print(f"-- {title} " + "-" * (len(head) - len(title) - 4))
        for o in members:
            def cell(alarm: int | None, false: int | None = None) -> str:
                if false is not None:
                    return f"FA@{false}"
                return f"{_fmt(alarm)} {_pct(lead(o, alarm))}".strip()
            effect = ""
            if o.effect:
                effect = (f"logit×{o.effect['logit_ratio']:.2f} Δ2−{o.effect['delta2_drop']:.2f} "
                          f"rout−{o.effect['routing_drop']:.2f}" + ("" if o.measurable else " (none)"))
            family = (o.family or "–") + (" ✗" if o.wrong_family else "")
            print(f"{o.run['name']:36s} {o.run['fault']:9s} {_fmt(o.onset):>5s} {_fmt(o.divergence):>5s} "
                  f"{_fmt(o.first_warn.get('attention')) + '/' + _fmt(o.first_warn.get('router')):>12s} "
                  f"{_fmt(o.first_alert.get('attention')) + '/' + _fmt(o.first_alert.get('router')):>13s} "
                  f"{o.verdict:7s} {family:9s} {cell(o.ckptscan_alarm, o.ckptscan_false):>12s} "
                  f"{cell(o.baseline_alarm.get('loss_spike'), o.baseline_false.get('loss_spike')):>12s} "
                  f"{cell(o.baseline_alarm.get('grad_spike'), o.baseline_false.get('grad_spike')):>12s} "
                  f"{cell(o.oracle) if o.run['twin'] else '':>12s}  {effect}")


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def summarize(outcomes: list[Outcome]) -> dict:
    healthy = [o for o in outcomes if o.run["fault"] == "none"]
    faulty = [o for o in outcomes if o.run["fault"] != "none"]
    measurable = [o for o in faulty if o.measurable]
    mid_run = [o for o in faulty if o.onset]
    diverging = [o for o in faulty if o.divergence is not None]
    detectors = {"ckptscan": (lambda o: o.ckptscan_alarm, lambda o: o.ckptscan_false)}
    for d in BASELINES:
        detectors[d.name] = (lambda o, n=d.name: o.baseline_alarm[n], lambda o, n=d.name: o.baseline_false[n])
    detectors["oracle"] = (lambda o: o.oracle, lambda o: None)
    out = {}
    for name, (alarm, false) in detectors.items():
        def before_divergence(o: Outcome) -> bool:
            a = alarm(o)
            return a is not None and false(o) is None and (o.divergence is None or a < o.divergence)

        def leads(kind: list[Outcome]) -> list[float | None]:
            return [lead(o, alarm(o) if false(o) is None else None) for o in kind]
        step_0 = [o for o in diverging if o.from_step_0]
        switched = [o for o in diverging if not o.from_step_0]
        out[name] = {
            "detected": sum(before_divergence(o) for o in measurable), "measurable": len(measurable),
            "false_healthy": sum(false(o) is not None for o in healthy), "healthy": len(healthy),
            "false_pre_onset": sum(false(o) is not None for o in mid_run), "mid_run": len(mid_run),
            "median_lead": _median(leads(diverging)), "diverging": len(diverging),
            "median_lead_step_0": _median(leads(step_0)), "diverging_step_0": len(step_0),
            "median_lead_mid_run": _median(leads(switched)), "diverging_mid_run": len(switched),
        }
    out["ckptscan"]["wrong_primary_family"] = sum(o.wrong_family for o in faulty)
    ahead = [o for o in diverging if all(
        (lead(o, o.ckptscan_alarm if o.ckptscan_false is None else None) or 0)
        > (lead(o, o.baseline_alarm[d.name] if o.baseline_false[d.name] is None else None) or 0) for d in BASELINES)]
    out["ckptscan"]["ahead_of_both"] = len(ahead)
    return out


def print_summary(summary: dict, title: str) -> None:
    print(f"\n{title}")
    print(f"{'detector':11s} {'detected before div.':>21s} {'FA healthy':>11s} {'FA pre-onset':>13s} "
          f"{'median lead':>12s} {'from step 0':>12s} {'mid-run':>12s}  other")
    for name, s in summary.items():
        other = ""
        if name == "ckptscan":
            other = (f"wrong primary family {s['wrong_primary_family']}; ahead of both baselines on "
                     f"{s['ahead_of_both']}/{s['diverging']} diverging runs")
        elif name == "oracle":
            other = "the limit: the run against its own healthy twin"
        false = name != "oracle"
        print(f"{name:11s} {str(s['detected']) + '/' + str(s['measurable']):>21s} "
              f"{str(s['false_healthy']) + '/' + str(s['healthy']) if false else '':>11s} "
              f"{str(s['false_pre_onset']) + '/' + str(s['mid_run']) if false else '':>13s} "
              f"{_pct(s['median_lead'], '–') + ' of ' + str(s['diverging']):>12s} "
              f"{_pct(s['median_lead_step_0'], '–') + ' of ' + str(s['diverging_step_0']):>12s} "
              f"{_pct(s['median_lead_mid_run'], '–') + ' of ' + str(s['diverging_mid_run']):>12s}  {other}")


def generations(outcomes: list[Outcome]) -> list[tuple[str, list[Outcome]]]:
    """The outcomes of each generation present, then all together."""
    groups = [(f"generation {g}", [o for o in outcomes if o.generation == g])
              for g in sorted({o.generation for o in outcomes})]
    return groups + ([("all generations", outcomes)] if len(groups) > 1 else [])


def references_of(manifest: dict, run: dict, reference_seed: int | None, references: str | None) -> list[str]:
    if references == "healthy-seeds":
        return healthy_seed_references(manifest, run)
    if reference_seed is not None:
        return [reference_run(manifest, run, reference_seed)]
    return []


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--split", choices=["heldout", "calibration", "all"], default="heldout")
    p.add_argument("--corpus", type=Path, default=Path(DEFAULT_OUT))
    p.add_argument("--legacy", action="store_true", help="the rules before the change-point statistic")
    chosen = p.add_mutually_exclusive_group()
    chosen.add_argument("--reference-seed", type=int, default=None,
                        help="judge each run with --reference = the healthy run of its recipe with this seed "
                             "(a calibration seed; for a run of that very seed, the other calibration seed)")
    chosen.add_argument("--references", choices=["healthy-seeds"], default=None,
                        help="judge each run against the band of its recipe's healthy calibration runs of "
                             "every other seed")
    p.add_argument("--partial", action="store_true",
                   help="evaluate only the runs generated so far (with their twin and references)")
    p.add_argument("--pin", type=Path, default=None,
                   help="record these results per run in this file (experiments/pinned.py), to compare later runs of "
                        "the evaluation against")
    p.add_argument("--against", type=Path, default=None,
                   help="the pinned results to compare with (default: experiments/pinned/evaluate-SPLIT-REFS.json "
                        "where it exists)")
    args = p.parse_args(argv)
    if args.pin is not None and args.partial:
        p.error("--pin records a whole split: not with --partial")
    if not args.partial:
        require_corpus(args.corpus)
    manifest = load_manifest()
    calibration = json.loads(CALIBRATION.read_text())
    thresholds = dataclasses.replace(Thresholds(), **LEGACY) if args.legacy else Thresholds()
    # Generation 4's runs inject nothing: their truth is the training log's inside view, and
    # experiments.natural judges them (its own table and pins).
    runs = [r for r in manifest["runs"] if (args.split == "all" or r["split"] == args.split)
            and r.get("generation") != 4]
    chosen_references = {r["name"]: references_of(manifest, r, args.reference_seed, args.references) for r in runs}
    left_out = 0
    if args.partial:
        def ready(run: dict) -> bool:
            needed = [run["name"], *([run["twin"]] if run["twin"] else []), *chosen_references[run["name"]]]
            return all((args.corpus / name / "metrics.json").exists() for name in needed)
        ready_runs = [r for r in runs if ready(r)]
        left_out, runs = len(runs) - len(ready_runs), ready_runs
    outcomes = [evaluate_run(args.corpus, run, thresholds, calibration, chosen_references[run["name"]])
                for run in runs]
    described = ""
    if args.references == "healthy-seeds":
        described = "; references: the band of the recipe's healthy calibration runs of the other seeds"
    elif args.reference_seed is not None:
        described = (f"; --reference: the recipe's healthy seed-{args.reference_seed} run (the other calibration "
                     "seed for that seed's own runs)")
    print(f"split: {args.split} ({len(runs)} runs); ckptscan rules: {'legacy' if args.legacy else 'current'}"
          + described)
    if args.partial:
        print(f"--partial: {left_out} run(s) of the split left out (their metrics, their twin's or their "
              "references' not generated yet)")
    print("cells: first alarm step and lead (% of onset→divergence); FA@s: false alarm at step s; "
          "family: the primary (else first) alerting family, ✗ when wrong\n")
    print_table(outcomes)
    for title, members in generations(outcomes):
        print_summary(summarize(members), title)
    options = pin_options(args)
    held = pinned.with_training({o.run["name"]: held_result(o) for o in outcomes}, args.corpus, manifest["runs"])
    if args.pin is not None:
        pinned.save(args.pin, held, options)
        print(f"\npinned {len(held)} run(s) in {args.pin}")
    against = args.against or pinned.PINNED / f"evaluate-{options['split']}-{options['references']}.json"
    if args.pin is None and against.exists():
        pinned.report(against, held, options)


def pin_options(args: argparse.Namespace) -> dict:
    """What a pinned result depends on besides the code: results under other options are not compared."""
    references = args.references or ("none" if args.reference_seed is None else f"seed{args.reference_seed}")
    return {"split": args.split, "references": references, "legacy": args.legacy}


def held_result(o: Outcome) -> pinned.Held:
    alarm = o.ckptscan_alarm if o.ckptscan_false is None else None
    return pinned.Held(o.ckptscan_alarm, o.ckptscan_false, o.family, lead(o, alarm), not o.wrong_family)


if __name__ == "__main__":
    main()
