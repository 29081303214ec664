"""Write docs/figures.json, the facts README.md and docs/ quote about the sample runs, from the tool.

Every number the prose quotes about what ckptscan finds on `sample_checkpoints/`
(first alerts, leads, rollback steps, monitor values) is a fact here, computed
by running ckptscan on the sample runs exactly as the pages' commands do
(`trend RUN`, and `trend RUN --reference` the healthy run's JSON report). A page
binds a number to a fact with an invisible marker right before it:

    alerts at step <!-- fig: attention_fault.first_alert -->1400

and tests/docs/test_figures.py fails when a bound number is not the fact, when
figures.json is not what the tool says today, or when a sentence about the
sample runs quotes a step number that is not bound. With `--png` it also redraws
the committed figures (docs/attention_fault_overview.png: the report's own
timeline figure; docs/report-screenshot.png: the HTML report rendered by a
headless Chromium) and writes beside each a JSON of the numbers it shows:

    python scripts/docs_figures.py           # rewrite docs/figures.json
    python scripts/docs_figures.py --png     # and the committed figures (needs matplotlib, chromium)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Union

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "docs" / "figures.json"
OVERVIEW = ROOT / "docs" / "attention_fault_overview.png"
SCREENSHOT = ROOT / "docs" / "report-screenshot.png"
RUNS = ("healthy", "attention_fault", "router_fault", "both_faults", "silent_fault")
# The screenshot's window: wide enough for the report's figures at their own size, tall enough for the verdict
# and the whole timeline figure below it.
WINDOW = (1280, 1900)

Fact = Union[int, float, str, list, None]


def _reports() -> dict[str, Any]:
    """Each sample run's report alone and (the faulty ones) against the healthy run's JSON report, as
    `ckptscan trend RUN [--reference healthy.json]` judges them from the repository root, and each
    against the band of the other four (`compare`, before it leaves out the runs that alert against all)."""
    sys.path.insert(0, str(ROOT))
    import ckptscan
    from ckptscan.report.json import write_json
    from ckptscan.sweep import compare_runs

    # From the root, as the pages' commands run: the reports name the runs' paths as the pages show them.
    here = Path.cwd()
    os.chdir(ROOT)
    try:
        reports = {run: ckptscan.scan_run(f"sample_checkpoints/{run}") for run in RUNS}
        with tempfile.TemporaryDirectory() as tmp:
            healthy = Path(tmp) / "healthy.json"
            write_json(reports["healthy"], healthy)
            for run in RUNS[1:]:
                reports[f"{run}.vs_healthy"] = ckptscan.scan_run(f"sample_checkpoints/{run}", reference=healthy)
        # `ckptscan compare sample_checkpoints/*`'s first round: each run against the band of all the others.
        sweep = compare_runs([f"sample_checkpoints/{run}" for run in RUNS], leave_out=False)
        for entry in sweep.runs:
            reports[f"{Path(entry.path).name}.vs_all_others"] = entry.report
    finally:
        os.chdir(here)
    return reports


def _rounded(value: float) -> float:
    """Four significant digits: what a page quotes, and stable across machines' last bits."""
    return float(f"{value:.4g}")


def run_facts(name: str, report: Any) -> dict[str, Fact]:
    """What one report says: the verdict, its first alerts (overall, per family, per monitor with the
    onset of the departure behind it), the loss, the lead and the rollback step."""
    s = report.summary
    alerts = [step for step in s.first_alert_step.values() if step is not None]
    facts: dict[str, Fact] = {
        f"{name}.status": s.status,
        f"{name}.pairs": len(report.pairs),
        f"{name}.judged_pairs": s.judged_pairs,
        f"{name}.last_step": report.pairs[-1].to_step,
        f"{name}.first_alert": min(alerts) if alerts else None,
        f"{name}.primary_family": s.primary_family,
        f"{name}.loss_divergence": s.loss_divergence_step,
        f"{name}.lead": s.lead_steps,
        f"{name}.rollback": s.rollback_candidate.step if s.rollback_candidate is not None else None,
        f"{name}.flagged_layers": list(s.flagged_layers),
    }
    for family, step in sorted(s.first_alert_step.items()):
        facts[f"{name}.first_alert.{family}"] = step
    # The first alert of each monitor (any layer; a hard ceiling's or floor's gets its rule in its key,
    # apart from the rules that judge the monitor against its history), and where its departure began.
    first: dict[str, int] = {}
    for pair in report.pairs:
        for layer in pair.layers:
            for finding in layer.findings:
                absolute = finding.rule in ("ceiling", "floor")
                key = f"{finding.monitor}.{finding.rule}" if absolute else finding.monitor
                if finding.severity == "alert" and key not in first:
                    first[key] = pair.to_step
                    facts[f"{name}.alert.{key}"] = pair.to_step
                    facts[f"{name}.onset.{key}"] = finding.onset_step
    history = [step for key, step in first.items() if not key.endswith((".ceiling", ".floor"))]
    facts[f"{name}.first_history_alert"] = min(history) if history else None
    return facts


def value_facts(reports: dict[str, Any]) -> dict[str, Fact]:
    """The monitor values sample-runs.md quotes: the router fault's routing collapse, and where layer 0's
    Δ2 entropy stands at its last pair."""
    router = reports["router_fault"]
    first = router.summary.first_alert_step["router"]
    before = next(p for p in router.pairs if p.to_step == first - (router.pairs[1].to_step - router.pairs[0].to_step))
    at = next(p for p in router.pairs if p.to_step == first)
    last = router.pairs[-1].layers[0].judgements["delta2_entropy_norm"]
    return {
        "router_fault.layer0.routing_entropy_norm.before_first_alert": _rounded(before.layers[0].router.routing_entropy_norm),
        "router_fault.layer0.routing_entropy_norm.at_first_alert": _rounded(at.layers[0].router.routing_entropy_norm),
        "router_fault.layer0.delta2_entropy_norm.baseline": _rounded(last.expected),
        "router_fault.layer0.delta2_entropy_norm.last": _rounded(last.value),
        "router_fault.layer0.delta2_entropy_norm.last_alert_at": _rounded(last.alert_at),
    }


def sample_run_ranges(reports: dict[str, Any]) -> dict[str, Fact]:
    """What the five sample runs share, as a range over them: the first two pairs (where the weights
    still outgrow their initialisation: the update's size and relatedness the misuse rules read, and the
    lowest normalised Δ2 entropy at the end of the LR ramp), and the healthy run's largest logit scale."""
    from ckptscan.detection.provenance import relatedness
    from ckptscan.detection.update import relative_change

    def spread(name: str, values: list[float]) -> dict[str, Fact]:
        return {f"sample_runs.{name}.lowest": _rounded(min(values)), f"sample_runs.{name}.highest": _rounded(max(values))}

    runs = [reports[run] for run in RUNS]
    healthy = reports["healthy"]
    return {
        **spread("first_pair.relative_change", [relative_change(r.pairs[0]) for r in runs]),
        **spread("second_pair.relative_change", [relative_change(r.pairs[1]) for r in runs]),
        **spread("first_pair.relatedness", [relatedness(r.pairs[0]) for r in runs]),
        **spread("second_pair.delta2_entropy_norm", [min(layer.attention.delta2_entropy_norm for layer in r.pairs[1].layers)
                                                     for r in runs]),
        "healthy.logit_scale.largest": _rounded(max(layer.attention.logit_scale for pair in healthy.pairs
                                                    for layer in pair.layers)),
    }


def facts(reports: dict[str, Any] | None = None) -> dict[str, Fact]:
    reports = reports if reports is not None else _reports()
    found: dict[str, Fact] = {}
    for name, report in reports.items():
        found.update(run_facts(name, report))
    found.update(value_facts(reports))
    found.update(sample_run_ranges(reports))
    return found


def drawn(report: Any) -> dict[str, Fact]:
    """The numbers a figure of `report` shows: the verdict, the first alert, the loss divergence, the
    lead, the rollback step, and per flagged layer the monitor drawn with its band at the last pair."""
    s = report.summary
    family = s.first_family
    bands = []
    for layer in s.layers:
        if layer.status not in ("warn", "alert"):
            continue
        monitor = layer.first_alert_monitor or next(
            f.monitor for p in report.pairs for lr in p.layers if lr.layer == layer.layer
            for f in lr.findings if f.severity in ("warn", "alert"))
        last = next(lr for lr in report.pairs[-1].layers if lr.layer == layer.layer)
        point = last.judgements.get(monitor)  # a ceiling's monitor has no band, only its level
        bands.append({"layer": layer.layer, "monitor": monitor,
                      **{key: _rounded(getattr(point, key)) if point is not None and getattr(point, key) is not None
                         else None for key in ("expected", "warn_at", "alert_at")}})
    return {
        "status": s.status,
        "first_family": family,
        "first_alert": s.first_alert_step.get(family) if family is not None else None,
        "loss_divergence": s.loss_divergence_step,
        "lead": s.lead_steps,
        "rollback": s.rollback_candidate.step if s.rollback_candidate is not None else None,
        "bands": bands,
    }


def sidecar(png: Path) -> Path:
    return png.with_suffix(".json")


def _write_sidecar(png: Path, report: Any, how: str) -> None:
    record = {"drawn_by": how, "sha256": hashlib.sha256(png.read_bytes()).hexdigest(), **drawn(report)}
    sidecar(png).write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")


def draw_overview(report: Any) -> None:
    """The home page's figure: the report's own timeline figure (what `--png` writes as timeline.png)."""
    from ckptscan.report.figures import run_figures

    timeline = next(f for f in run_figures(report) if f.name == "timeline")
    OVERVIEW.write_bytes(timeline.png)
    _write_sidecar(OVERVIEW, report, "ckptscan.report.figures.run_figures (timeline) of trend attention_fault")


def draw_screenshot(report: Any) -> None:
    """The README's picture of the demo's HTML report, as a headless Chromium shows its top."""
    from ckptscan.report.html import write_report_files
    from ckptscan.report.json import report_dict

    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        raise SystemExit("docs_figures: --png needs chromium for the report screenshot (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "ckptscan-demo.html"
        write_report_files(report_dict(report), html_path=page)
        shot = Path(tmp) / "shot.png"
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--window-size={WINDOW[0]},{WINDOW[1]}", f"--screenshot={shot}", page.as_uri()],
                       check=True, capture_output=True, timeout=120)
        SCREENSHOT.write_bytes(shot.read_bytes())
    _write_sidecar(SCREENSHOT, report, "the HTML report of trend attention_fault (make demo), in headless Chromium")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--png", action="store_true", help="also redraw the committed figures and their JSON")
    args = parser.parse_args(argv)
    reports = _reports()
    FIGURES.write_text(json.dumps(facts(reports), indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {FIGURES.relative_to(ROOT)}")
    if args.png:
        draw_overview(reports["attention_fault"])
        draw_screenshot(reports["attention_fault"])
        print(f"wrote {OVERVIEW.relative_to(ROOT)}, {SCREENSHOT.relative_to(ROOT)} and their JSON")
    return 0


if __name__ == "__main__":
    sys.exit(main())
