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
from typing import TYPE_CHECKING, Sequence, Union

if TYPE_CHECKING:
    from ckptscan.schema.results import LayerResult, PairResult, ScanReport

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "docs" / "figures.json"
OVERVIEW = ROOT / "docs" / "attention_fault_overview.png"
SCREENSHOT = ROOT / "docs" / "report-screenshot.png"
RUNS = ("healthy", "attention_fault", "router_fault", "both_faults", "silent_fault")
# The screenshot's window: wide enough for the report's figures at their own size, tall enough for the verdict
# and the whole timeline figure below it.
WINDOW = (1280, 1900)

Fact = Union[int, float, str, list, None]


def scan_sample_runs() -> dict[str, ScanReport]:
    """Each sample run's report alone and (the faulty ones) against the healthy run's JSON report, as
    `ckptscan trend RUN [--reference healthy.json]` judges them from the repository root, and each
    against the band of the other four (`compare`, before it leaves out the runs that alert against all)."""
    if str(ROOT) not in sys.path:  # this checkout's ckptscan, when run as a script
        sys.path.insert(0, str(ROOT))
    import ckptscan
    from ckptscan.document.writing import write_json
    from ckptscan.pipeline.sweep import compare_runs

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


def _rounded(value: float | None) -> float | None:
    """Four significant digits: what a page quotes, and stable across machines' last bits."""
    return None if value is None else float(f"{value:.4g}")


def _known(values: Sequence[float | None], what: str) -> list[float]:
    """`values`, each of which the sample runs have: a range the pages quote is over all of them."""
    known = [value for value in values if value is not None]
    if len(known) != len(values) or not known:
        raise SystemExit(f"docs_figures: a sample run has no {what}")
    return known


def run_facts(name: str, report: ScanReport) -> dict[str, Fact]:
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
    # The newer candidates the resume plan passed over, each failing its own check (issue 51): the newest and
    # the oldest of them, where it passed over any.
    passed_over = [item["step"] for item in s.resume.rejected] if s.resume is not None else []
    if passed_over:
        facts[f"{name}.passed_over.newest"] = max(passed_over)
        facts[f"{name}.passed_over.oldest"] = min(passed_over)
    for family, step in sorted(s.first_alert_step.items()):
        facts[f"{name}.first_alert.{family}"] = step
    # The first alert of each monitor (any layer; a hard ceiling's or floor's gets its rule in its key,
    # apart from the rules that judge the monitor against its history), and where its departure began.
    first: dict[str, int | None] = {}
    for pair in report.pairs:
        for layer in pair.layers:
            for finding in layer.findings:
                absolute = finding.rule in ("ceiling", "floor")
                key = f"{finding.monitor}.{finding.rule}" if absolute else finding.monitor
                if finding.severity == "alert" and key not in first:
                    first[key] = pair.to_step
                    facts[f"{name}.alert.{key}"] = pair.to_step
                    facts[f"{name}.onset.{key}"] = finding.onset_step
    history = [step for key, step in first.items() if step is not None and not key.endswith((".ceiling", ".floor"))]
    facts[f"{name}.first_history_alert"] = min(history) if history else None
    return facts


def _layer(pair: PairResult, number: int) -> LayerResult:
    return next(layer for layer in pair.layers if layer.layer == number)


def value_facts(reports: dict[str, ScanReport]) -> dict[str, Fact]:
    """The monitor values sample-runs.md quotes: the router fault's routing collapse, and where layer 0's
    Δ2 entropy stands at its last pair."""
    router = reports["router_fault"]
    first = next(k for k, pair in enumerate(router.pairs) if pair.to_step == router.summary.first_alert_step["router"])
    before, at = (_layer(router.pairs[k], 0).router for k in (first - 1, first))
    last = _layer(router.pairs[-1], 0).judgements["delta2_entropy_norm"]
    routing = [result.routing_entropy_norm if result is not None else None for result in (before, at)]
    return {
        "router_fault.layer0.routing_entropy_norm.before_first_alert": _rounded(routing[0]),
        "router_fault.layer0.routing_entropy_norm.at_first_alert": _rounded(routing[1]),
        "router_fault.layer0.delta2_entropy_norm.baseline": _rounded(last.expected),
        "router_fault.layer0.delta2_entropy_norm.last": _rounded(last.value),
        "router_fault.layer0.delta2_entropy_norm.last_alert_at": _rounded(last.alert_at),
    }


def sample_run_ranges(reports: dict[str, ScanReport]) -> dict[str, Fact]:
    """What the five sample runs share, as a range over them: the first two pairs (where the weights
    still outgrow their initialisation: the update's size and relatedness the misuse rules read, and the
    lowest normalised Δ2 entropy at the end of the LR ramp), and the healthy run's largest logit scale."""
    from ckptscan.detection.provenance import relatedness
    from ckptscan.detection.update import relative_change

    def spread(name: str, values: list[float | None]) -> dict[str, Fact]:
        known = _known(values, name)
        return {f"sample_runs.{name}.lowest": _rounded(min(known)), f"sample_runs.{name}.highest": _rounded(max(known))}

    def lowest_delta2(pair: PairResult) -> float:
        return min(_known([layer.attention.delta2_entropy_norm if layer.attention else None for layer in pair.layers],
                          "normalised Δ2 entropy"))

    runs = [reports[run] for run in RUNS]
    healthy = reports["healthy"]
    return {
        **spread("first_pair.relative_change", [relative_change(r.pairs[0]) for r in runs]),
        **spread("second_pair.relative_change", [relative_change(r.pairs[1]) for r in runs]),
        **spread("first_pair.relatedness", [relatedness(r.pairs[0]) for r in runs]),
        **spread("second_pair.delta2_entropy_norm", [lowest_delta2(r.pairs[1]) for r in runs]),
        "healthy.logit_scale.largest": _rounded(max(_known([layer.attention.logit_scale if layer.attention else None
                                                            for pair in healthy.pairs for layer in pair.layers],
                                                           "attention logit scale"))),
    }


def facts(reports: dict[str, ScanReport] | None = None) -> dict[str, Fact]:
    """Every fact of docs/figures.json, from `reports` (default: scanned now)."""
    reports = reports if reports is not None else scan_sample_runs()
    found: dict[str, Fact] = {}
    for name, report in reports.items():
        found.update(run_facts(name, report))
    found.update(value_facts(reports))
    found.update(sample_run_ranges(reports))
    return found


def drawn(report: ScanReport) -> dict[str, Fact]:
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
        # A ceiling's monitor has no band, only its level.
        point = _layer(report.pairs[-1], layer.layer).judgements.get(monitor)
        bands.append({"layer": layer.layer, "monitor": monitor,
                      **{key: _rounded(getattr(point, key)) if point is not None else None
                         for key in ("expected", "warn_at", "alert_at")}})
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
    """The JSON beside a committed figure: the numbers it shows, and its SHA-256."""
    return png.with_suffix(".json")


def _write_sidecar(png: Path, report: ScanReport, how: str) -> None:
    record = {"drawn_by": how, "sha256": hashlib.sha256(png.read_bytes()).hexdigest(), **drawn(report)}
    sidecar(png).write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")


def draw_overview(report: ScanReport) -> None:
    """The home page's figure: the report's own timeline figure (what `--png` writes as timeline.png)."""
    from ckptscan.report.figures import run_figures

    timeline = next(f for f in run_figures(report) if f.name == "timeline")
    OVERVIEW.write_bytes(timeline.png)
    _write_sidecar(OVERVIEW, report, "ckptscan.report.figures.run_figures (timeline) of trend attention_fault")


def draw_screenshot(report: ScanReport) -> None:
    """The README's picture of the demo's HTML report, as a headless Chromium shows its top."""
    from ckptscan.report.html_page import write_report_files
    from ckptscan.document.plain import report_dict

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
    reports = scan_sample_runs()
    FIGURES.write_text(json.dumps(facts(reports), indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {FIGURES.relative_to(ROOT)}")
    if args.png:
        draw_overview(reports["attention_fault"])
        draw_screenshot(reports["attention_fault"])
        print(f"wrote {OVERVIEW.relative_to(ROOT)}, {SCREENSHOT.relative_to(ROOT)} and their JSON")
    return 0


if __name__ == "__main__":
    sys.exit(main())
