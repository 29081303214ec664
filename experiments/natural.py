"""Judge generation 4 (natural instabilities, nothing injected) and print what
ckptscan says beside the inside view no checkpoint keeps.

    python -m experiments.natural [--split heldout|calibration|all] [--corpus corpus]
        [--references healthy-seeds] [--partial] [--calibrate] [--without-output]

The truth of each run is its training log (experiments/train.py logs every
step's largest attention logit and mean log Z):
- saturation: the first logged step whose largest attention logit exceeds
  SATURATED (100: softmax puts e^100 times more weight on one key; Wortsman
  et al. 2023 find every run whose logits passed 1e4 diverged);
- divergence: experiments/divergence.py on the loss;
- onset: 0 for a recipe changed from the start, the jump step for a resume
  with another LR (`--lr-jump-step`).

Per run: ckptscan's first alert, its primary family, the rollback candidate,
and whether the verdict is right:
- a healthy run: no alert (else a false alarm);
- an alert on a pair whose newer checkpoint is at or before the onset: a
  pre-onset alarm;
- a run that saturates: an attention alert at most one checkpoint after the
  saturation and before divergence, with a rollback candidate before it;
- QK-norm runs (dense Qwen3): never blamed on attention;
- a resume with another LR: the learning rate ("update") named primary;
- a run whose logged mean log Z drifts below LOG_Z_DRIFT (output-logit
  divergence, Wortsman et al. 2023 §3.2): the output family named.
Beside it, the output family's first alert and, as its oracle, the logged
mean log Z (its lowest value after the warm-up, and its last).
`--without-output` judges with the output family's ceilings off (the table
before the family), to show what it changes.
`--calibrate` prints, per recipe, the largest logit scale of the healthy
calibration runs (generation 3's healthy seeds, d_model 256, among them) and,
per saturating calibration run, the logit scale at its first checkpoint
after saturation, each beside the ceiling at its model's width
(`Thresholds.at_width`): what `logit_scale_ceiling` and its √d growth are set from;
and the output family's largest logit scale and log Z shift scale per run,
healthy and not, beside the logged mean log Z: what the output ceilings are
set from.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
from pathlib import Path

from ckptscan.detection.rules import Thresholds
from ckptscan.schema.results import ScanReport
from experiments import pinned
from experiments.corpus import DEFAULT_OUT, healthy_seed_references, load_manifest
from experiments.divergence import divergence_step
from experiments.judge import judge_run, load_report

SATURATED = 100.0
# Output-logit divergence in the log: mean log Z below this (it starts at
# ln V, 5.5 for the byte vocabulary, and rises in every healthy run).
LOG_Z_DRIFT = 0.0


def inside_view(run_dir: Path) -> tuple[list[int], list[float | None], list[float | None]]:
    steps, logits, losses = [], [], []
    with open(run_dir / "train_log.jsonl") as fh:
        for line in fh:
            rec = json.loads(line)
            steps.append(rec["step"])
            logits.append(rec.get("max_attn_logit"))
            losses.append(rec.get("loss"))
    return steps, logits, losses


def saturation_step(steps: list[int], logits: list[float | None]) -> int | None:
    """The first step whose largest attention logit exceeds SATURATED (a
    non-finite logit, logged as null, counts as saturated)."""
    return next((s for s, v in zip(steps, logits) if v is None or v > SATURATED), None)


def mean_log_z(run_dir: Path, after: int = 100) -> tuple[float | None, float | None]:
    """The logged mean log Z: its lowest value from step `after` on (the warm-up
    moves it for every run), and its last."""
    values = []
    with open(run_dir / "train_log.jsonl") as fh:
        for line in fh:
            rec = json.loads(line)
            if rec["step"] >= after and rec.get("mean_log_z") is not None:
                values.append(float(rec["mean_log_z"]))
    return (min(values), values[-1]) if values else (None, None)


def output_values(report: ScanReport, name: str) -> dict[int, float]:
    """The output family's monitor `name` at each pair's newer checkpoint, by its step."""
    found = {}
    for pair in report.pairs:
        for layer in pair.layers:
            value = layer.families.get("output", {}).get(name)
            if value is not None and pair.to_step is not None:
                found[pair.to_step] = value
    return found


def without_output(thresholds: Thresholds) -> Thresholds:
    """The thresholds with the output family's ceilings off."""
    return dataclasses.replace(thresholds, output_logit_scale_ceiling=math.inf, output_shift_ceiling=math.inf)


def onset_of(run: dict) -> int | None:
    flags = run["fault_flags"]
    if run["fault"] == "none":
        return None
    if "--lr-jump-step" in flags:
        return int(flags[flags.index("--lr-jump-step") + 1])
    return 0


def logit_scales(report: ScanReport) -> dict[int, float]:
    """The newer checkpoint's largest logit scale over layers, by its step."""
    found = {}
    for pair in report.pairs:
        values = [layer.attention.logit_scale for layer in pair.layers
                  if layer.attention is not None and layer.attention.logit_scale is not None]
        if values and pair.to_step is not None:
            found[pair.to_step] = max(values)
    return found


def first_alert(report: ScanReport) -> int | None:
    steps = [step for step in report.summary.first_alert_step.values() if step is not None]
    return min(steps) if steps else None


def verdict_row(run: dict, run_dir: Path, report: ScanReport, every: int, qk_norm: bool) -> dict:
    steps, logits, losses = inside_view(run_dir)
    saturation = saturation_step(steps, logits)
    divergence = divergence_step(steps, losses)
    onset = onset_of(run)
    alert = first_alert(report)
    s = report.summary
    family = s.primary_family or s.first_family
    rollback = s.rollback_candidate.step if s.rollback_candidate is not None else None
    problems = []
    if run["fault"] == "none":
        if alert is not None:
            problems.append("false alarm")
    else:
        if alert is not None and onset is not None and alert <= onset:
            problems.append("pre-onset alarm")
        if saturation is not None and not qk_norm:
            attention = s.first_alert_step.get("attention")
            deadline = (saturation // every + 1) * every + every  # one checkpoint after the first one past it
            if attention is None or attention > deadline or (divergence is not None and attention > divergence):
                problems.append(f"attention late ({attention})")
            if rollback is not None and rollback > saturation:
                problems.append(f"rollback {rollback} after saturation")
        if qk_norm and s.first_alert_step.get("attention") is not None and family == "attention":
            problems.append("QK-norm run blamed on attention")
        if "--lr-jump-step" in run["fault_flags"] and alert is not None and family != "update":
            problems.append(f"LR jump named {family}")
    lowest, last = mean_log_z(run_dir)
    if lowest is not None and lowest < LOG_Z_DRIFT and s.first_alert_step.get("output") is None:
        problems.append("log Z drift not named output")
    scales = output_values(report, "output_logit_rms")
    return {"run": run["name"], "split": run["split"], "onset": onset, "saturation": saturation,
            "divergence": divergence, "alert": alert, "family": family, "rollback": rollback,
            "verdict": s.message.split(":")[0], "problems": problems,
            "output_alert": s.first_alert_step.get("output"),
            "output_scale": max(scales.values()) if scales else None, "log_z_min": lowest, "log_z_last": last}


def evaluate(corpus: Path, split: str, references: bool, partial: bool, output: bool = True) -> list[dict]:
    manifest = load_manifest()
    rows = []
    every = 100
    for run in manifest["runs"]:
        if run.get("generation") != 4 or split != "all" and run["split"] != split:
            continue
        run_dir = corpus / run["name"]
        if not (run_dir / "metrics.json").exists():
            if partial:
                continue
            raise SystemExit(f"{run_dir}: no metrics.json (python -m experiments.corpus --generation 4)")
        refs = None
        if references:
            names = [n for n in healthy_seed_references(manifest, run) if (corpus / n / "metrics.json").exists()]
            refs = [corpus / n for n in names] or None
        report = judge_run(run_dir, Thresholds() if output else without_output(Thresholds()), None, refs)
        rows.append(verdict_row(run, run_dir, report, every, "qwen3" in manifest["recipes"][run["recipe"]]))
    return rows


def calibrate(corpus: Path) -> None:
    manifest = load_manifest()
    healthy: dict[str, list[float]] = {}
    shares: list[tuple[float, str]] = []  # healthy runs' largest logit scale / the ceiling at their width
    saturating = []
    for run in manifest["runs"]:
        run_dir = corpus / run["name"]
        # Generation 3's healthy seeds too: the widest healthy runs the ceiling must hold on.
        wanted = run.get("generation") == 4 or run.get("generation") == 3 and run["fault"] == "none"
        if not wanted or run["split"] != "calibration" or not (run_dir / "metrics.json").exists():
            continue
        report = load_report(run_dir)
        scales = logit_scales(report)
        steps, logits, _ = inside_view(run_dir)
        if not scales:  # a QK-norm model: its gains' bound (qk_norm_logit_bound) is judged instead
            print(f"{run['name']}: QK-norm, no logit scale; largest logged logit "
                  f"{max((v for v in logits if v is not None), default=None)}")
            continue
        width = report.model.hidden_size
        ceiling = Thresholds().at_width(width).logit_scale_ceiling
        observed = max((v for v in logits if v is not None), default=None)
        if run["fault"] == "none":
            largest = max(scales.values())
            healthy.setdefault(run["recipe"], []).append(largest)
            shares.append((largest / ceiling, run["name"]))
            print(f"healthy {run['name']} (d_model {width}, ceiling {ceiling:.3g}): largest logit scale "
                  f"{largest:.4g} ({largest / ceiling:.2f} of the ceiling), largest logged logit {observed}")
            continue
        saturation = saturation_step(steps, logits)
        if saturation is None:
            print(f"{run['name']}: never saturates (largest logged logit {observed}); "
                  f"largest logit scale {max(scales.values()):.4g}")
            continue
        after = min((s for s in scales if s >= saturation), default=None)
        saturating.append(scales[after] / ceiling if after is not None else None)
        print(f"{run['name']} (d_model {width}, ceiling {ceiling:.3g}): saturates at step {saturation}; logit scale "
              f"at checkpoint {after}: {scales.get(after)}; before it: "
              f"{[round(scales[s]) for s in sorted(scales) if s < saturation]}")
    for recipe, values in healthy.items():
        print(f"{recipe}: healthy largest logit scale {max(values):.4g} over {len(values)} runs")
    if shares:
        share, name = max(shares)
        print(f"healthy runs: at most {share:.2f} of the ceiling at their width ({name})")
    known = [v for v in saturating if v is not None]
    if known:
        print(f"saturating runs at their first checkpoint after saturation: min {min(known):.2f}, "
              f"median {statistics.median(known):.2f} of the ceiling at their width")
    calibrate_output(corpus, manifest)


def calibrate_output(corpus: Path, manifest: dict) -> None:
    """Per generation-4 run (every split: the ceiling must hold on all of
    them), the output family's largest logit scale and log Z shift scale
    beside the logged mean log Z; then the healthy maxima across recipes, of
    the calibration runs (what the ceilings are set from) and of the held-out ones."""
    healthy: dict[str, dict[str, list[float]]] = {"calibration": {"output_logit_rms": [], "output_shift": []},
                                                  "heldout": {"output_logit_rms": [], "output_shift": []}}
    for run in manifest["runs"]:
        run_dir = corpus / run["name"]
        if run.get("generation") != 4 or not (run_dir / "metrics.json").exists():
            continue
        report = load_report(run_dir)
        largest = {name: max(output_values(report, name).values(), default=math.nan)
                   for name in ("output_logit_rms", "output_shift")}
        lowest, last = mean_log_z(run_dir)
        kind = "healthy" if run["fault"] == "none" else run["fault"]
        print(f"output {run['name']} ({kind}, {run['split']}): largest logit scale {largest['output_logit_rms']:.3g}, "
              f"log Z shift scale {largest['output_shift']:.3g}; logged mean log Z lowest {lowest}, last {last}")
        if run["fault"] == "none":
            for name, value in largest.items():
                healthy[run["split"]][name].append(value)
    for split, by_name in healthy.items():
        for name, values in by_name.items():
            if values:
                print(f"healthy {split} {name}: largest {max(values):.4g} over {len(values)} runs")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", type=Path, default=Path(DEFAULT_OUT))
    p.add_argument("--split", choices=["heldout", "calibration", "all"], default="heldout")
    p.add_argument("--references", choices=["healthy-seeds"], help="judge against the band of healthy seeds")
    p.add_argument("--partial", action="store_true", help="judge the runs whose metrics exist")
    p.add_argument("--calibrate", action="store_true", help="the logit-scale figures the ceiling is set from")
    p.add_argument("--without-output", action="store_true", help="judge with the output family's ceilings off")
    p.add_argument("--pin", type=Path, default=None, help="record these verdicts per run (experiments/pinned.py)")
    p.add_argument("--against", type=Path, default=None,
                   help="the pinned verdicts to compare with (default: experiments/pinned/natural-SPLIT-REFS.json)")
    args = p.parse_args(argv)
    if args.pin is not None and (args.partial or args.without_output):
        p.error("--pin records a whole split as ckptscan judges it: not with --partial or --without-output")
    if args.calibrate:
        calibrate(args.corpus)
        return
    rows = evaluate(args.corpus, args.split, args.references is not None, args.partial, not args.without_output)
    print("| run | onset | saturation | divergence | first alert | primary | rollback | verdict | output alert | "
          "output scale | mean log Z min / last | problems |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        scale = "–" if r["output_scale"] is None else f"{r['output_scale']:.2f}"
        log_z = "–" if r["log_z_min"] is None else f"{r['log_z_min']:.2f} / {r['log_z_last']:.2f}"
        print(f"| {r['run']} | {r['onset']} | {r['saturation']} | {r['divergence']} | {r['alert']} | "
              f"{r['family']} | {r['rollback']} | {r['verdict']} | {r['output_alert']} | {scale} | {log_z} | "
              f"{', '.join(r['problems']) or 'ok'} |")
    wrong = sum(bool(r["problems"]) for r in rows)
    print(f"{len(rows)} runs, {wrong} with a problem")
    options = {"split": args.split, "references": args.references or "none"}
    held = pinned.with_training({r["run"]: held_result(r) for r in rows}, args.corpus, load_manifest()["runs"])
    if args.pin is not None:
        pinned.save(args.pin, held, options)
        print(f"pinned {len(held)} run(s) in {args.pin}")
    against = args.against or pinned.PINNED / f"natural-{options['split']}-{options['references']}.json"
    if args.pin is None and not args.without_output and against.exists():
        pinned.report(against, held, options)


def held_result(row: dict) -> pinned.Held:
    """A verdict row as a pinned result: a false or pre-onset alarm is the false alarm, any other alert the
    alarm; the family is right unless the row's problems say it is not."""
    false = row["alert"] if {"false alarm", "pre-onset alarm"} & set(row["problems"]) else None
    wrong = any(p.startswith(("LR jump named", "QK-norm run blamed")) for p in row["problems"])
    return pinned.Held(None if false is not None else row["alert"], false, row["family"], None, not wrong)


if __name__ == "__main__":
    main()
