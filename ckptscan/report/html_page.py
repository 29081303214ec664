"""One self-contained HTML page of a report, for people deciding on a rollback.

Sections, in order: the verdict (primary family and why, rollback candidate and the resume plan
(report/resume.py), first alert per family, loss divergence and lead time), the timeline figure, a heatmap per monitor,
the layers table, the flagged layers' first findings, the effective
thresholds, and the model and run facts.

Self-contained: inline CSS, PNG figures as base64 data URIs, no script, no
link, no font or address to fetch, so the file works offline and as a chat
attachment. No timestamp: the same report gives the same bytes, whether it
comes from `ckptscan trend --html` or from `ckptscan report REPORT.json`.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any, Iterable, Sequence

from ckptscan.errors import CkptScanError
from ckptscan.monitors.interventions import intervention_lines
from ckptscan.report.resume import resume_lines
from ckptscan.system.output import own_descriptor, write_output
from ckptscan.report.figures import Figure, run_figures
from ckptscan.document.reading import as_json_values, report_from_dict
from ckptscan.report.fired import headline_cells
from ckptscan.report.trend_table import first_alert_text, first_findings, headline_monitors, layer_series, pair_layers
from ckptscan.schema.results import ScanReport
from ckptscan.schema.results import counted, status_word

SECTIONS = ("verdict", "timeline", "monitors", "layers", "findings", "thresholds", "run")

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2rem auto; max-width: 72rem;
       padding: 0 1rem; color: #1a1a1a; line-height: 1.45; }
h1 { font-size: 1.5rem; margin-bottom: 0.2rem; }
h2 { font-size: 1.15rem; margin-top: 2.2rem; border-bottom: 1px solid #ddd; padding-bottom: 0.2rem; }
.where { color: #555; margin-top: 0; overflow-wrap: break-word; }
.message { font-size: 1.05rem; padding: 0.7rem 0.9rem; border-left: 6px solid #999; background: #f6f6f6; }
.message.alert { border-color: #b2182b; } .message.warn { border-color: #e08214; }
.message.ok { border-color: #1a9850; } .message.not_judged { border-color: #762a83; }
.badge { display: inline-block; padding: 0.05rem 0.5rem; border-radius: 0.3rem; color: #fff; background: #777;
         font-weight: 600; font-size: 0.9em; }
.badge.alert { background: #b2182b; } .badge.warn { background: #b35806; } .badge.ok { background: #1a7f45; }
.badge.not_judged { background: #762a83; }
dl { display: grid; grid-template-columns: max-content minmax(0, 1fr); gap: 0.25rem 1.2rem; }
dt { font-weight: 600; } dd { margin: 0; overflow-wrap: break-word; }
table { border-collapse: collapse; font-size: 0.9rem; }
th, td { border-bottom: 1px solid #e3e3e3; padding: 0.2rem 0.6rem; text-align: right; }
th { background: #f3f3f3; } td.text, th.text { text-align: left; }
figure { margin: 1rem 0 1.6rem; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #444; font-size: 0.88rem; max-width: 60rem; }
footer { margin-top: 3rem; color: #777; font-size: 0.85rem; }
.note { color: #555; font-size: 0.85rem; }
"""


def write_report_files(data: dict[str, Any], html_path: str | Path | None = None,
                       png_dir: str | Path | None = None) -> list[Path]:
    """Render a report dict (`report_dict(report)`, or a JSON report file's
    contents) to an HTML page and/or PNG figures; returns the files written.

    The dict goes through a JSON round trip first, so a report rendered
    straight after a scan and one read back from its JSON file are the same.
    """
    data = as_json_values(data)
    report = report_from_dict(data)
    figures = run_figures(report)
    written = []
    try:
        if html_path is not None:
            write_output(html_path, html_page(report, data, figures))
            written.append(Path(html_path))
        if png_dir is not None:
            directory = Path(png_dir)
            if own_descriptor(str(directory)) is not None:
                raise CkptScanError("--png needs a directory to write one file per figure into", path=png_dir)
            directory.mkdir(parents=True, exist_ok=True)
            for figure in figures:
                path = directory / f"{figure.name}.png"
                write_output(path, figure.png)
                written.append(path)
    except OSError as e:
        raise CkptScanError(f"cannot write the report: {e.strerror or e}", path=e.filename) from None
    return written


def html_page(report: ScanReport, data: dict[str, Any], figures: list[Figure]) -> str:
    s = report.summary
    where = report.settings.get("run") or (report.pairs[0].to_path if report.pairs else "")
    title = f"ckptscan {report.command}: {Path(str(where)).name or where} — {status_word(s.status)}"
    heatmaps = [f for f in figures if f.name.startswith("heatmap_")]
    timeline = [f for f in figures if f not in heatmaps]
    single = len(report.pairs) == 1
    parts = [
        *page_head(title),
        "<body>",
        "<header>",
        f'<h1>ckptscan {_e(report.command)} <span class="badge {_e(s.status)}">{_e(status_word(s.status))}</span></h1>',
        f'<p class="where">{_e(where)}</p>',
        f'<p class="message {_e(s.status)}">{_e(s.message or s.status)}</p>',
        "</header>",
        _section("verdict", "Verdict", _verdict(report)),
        _section("timeline", "The layers of this update" if single else
                 "When it went wrong: flagged layers, loss and lead time", _figures(timeline)),
        _section("monitors", "Monitors over the run (layers × steps)", _figures(heatmaps) or (
            "<p>One pair of checkpoints: no time axis (see the figure above).</p>" if single
            else "<p>No monitor values in this report.</p>")),
        _section("layers", "Layers", _layers_table(report)),
        _section("findings", "First findings of the flagged layers", _findings(report)),
        _section("thresholds", "Effective thresholds", _thresholds(report)),
        _section("run", "Model and run", _run_facts(report)),
        f"<footer>ckptscan {_e(data.get('tool', {}).get('version', '?'))}, JSON report schema "
        f"{_e(data.get('schema_version'))}.</footer>",
        "</body>",
        "</html>",
    ]
    return "\n".join(parts) + "\n"


def page_head(title: str) -> list[str]:
    """The lines of a report page up to its body: one stylesheet for the run and the sweep pages."""
    return ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">', f"<title>{_e(title)}</title>",
            f"<style>{CSS}</style>", "</head>"]


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _section(anchor: str, heading: str, body: str) -> str:
    return f'<section id="{anchor}">\n<h2>{_e(heading)}</h2>\n{body}\n</section>'


def _dl_noted(items: Iterable[tuple[str, object]], notes: dict[str, str]) -> str:
    """A list of facts, each with what it means where `notes` says (by its words): shown under the value and as the
    term's tooltip."""
    rows = []
    for k, v in items:
        note = notes.get(k)
        if note is None:
            rows.append(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>")
        else:
            rows.append(f'<dt title="{_e(note)}">{_e(k)}</dt><dd>{_e(v)}<br><span class="note">{_e(note)}</span></dd>')
    return "<dl>\n" + "\n".join(rows) + "\n</dl>"


def setting_notes(report: ScanReport) -> dict[str, str]:
    """What the run facts whose names say too little mean, by the words the page gives them."""
    notes = {
        "lr warmup end step": "where the learning rate's initial ramp ends in the loss log (the first logged step "
                              "it does not rise after): no pair starting before it is judged against the run's "
                              "history",
        "pending steps": "newer checkpoints not on the stride yet: not scanned",
    }
    pairs = report.thresholds.get("warmup_pairs", 2)
    if report.command == "diff":
        notes["warmup end step"] = ("the older step of the pair, judged alone: by the rules that need no history "
                                    "(the non-finite check, the floors and ceilings, the cross-layer rule)")
    else:
        notes["warmup end step"] = ("the older step of the first pair judged against the run's own history; the "
                                    f"pairs before it are the warm-up (the first {pairs} pairs, and those before the "
                                    "learning rate's warm-up ends), judged only by the non-finite check and the "
                                    "ceilings (and a reference band, where there is one)")
    return notes


def _dl(items: Iterable[tuple[str, object]]) -> str:
    rows = "\n".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in items)
    return f"<dl>\n{rows}\n</dl>"


def _table(header: list[str], rows: Sequence[Sequence[object]], text_columns: int = 1) -> str:
    def cell(tag: str, k: int, value: object) -> str:
        css = ' class="text"' if k < text_columns else ""
        return f"<{tag}{css}>{_e(value)}</{tag}>"

    head = "<tr>" + "".join(cell("th", k, h) for k, h in enumerate(header)) + "</tr>"
    body = "\n".join("<tr>" + "".join(cell("td", k, v) for k, v in enumerate(row)) + "</tr>" for row in rows)
    return f"<table>\n<thead>{head}</thead>\n<tbody>\n{body}\n</tbody>\n</table>"


def _figures(figures: list[Figure]) -> str:
    return "\n".join(
        f'<figure id="figure-{_e(f.name)}">\n'
        f'<img alt="{_e(f.title)}" src="data:image/png;base64,{base64.b64encode(f.png).decode("ascii")}">\n'
        f"<figcaption><strong>{_e(f.title)}.</strong> {_e(f.caption)}</figcaption>\n</figure>"
        for f in figures
    )


def _per_family(steps: dict[str, int | None]) -> str:
    return " · ".join(f"{family} {step if step is not None else '–'}" for family, step in steps.items()) or "–"


def _verdict(report: ScanReport) -> str:
    s = report.summary
    rollback = (f"{s.rollback_candidate.path} (step {s.rollback_candidate.step})" if s.rollback_candidate is not None
                else "none: no alert" if s.resume is None else "none holds (the resume plan says why)")
    if s.loss_divergence_step is not None:
        loss = f"diverged at step {s.loss_divergence_step}"
    elif "loss_log" in report.settings:
        loss = "did not diverge"
    else:
        loss = "no loss log in the report"
    items = [
        ("verdict", status_word(s.status)),
        ("judged", _judged(report)),
        ("first family to fire", s.first_family or "–"),
        ("primary family", f"{s.primary_family} ({s.primary_family_reason})" if s.primary_family else "–"),
        ("also alerted", ", ".join(s.secondary_families) or "–"),
        ("first alert per family", _per_family(s.first_alert_step)),
        ("first warning per family", _per_family(s.first_warn_step)),
        ("departure began at step", s.first_alert_onset_step if s.first_alert_onset_step is not None else "–"),
        ("rollback candidate", rollback),
        *[("resume plan", line.strip()) for line in resume_lines(s)],
        *[("what to do", line) for line in intervention_lines(s)],
        ("loss", loss),
    ]
    if s.lead_steps is not None:
        items.append(("lead time", f"{s.lead_steps} steps: the first alert came before the loss diverged"
                      if s.lead_steps >= 0 else f"{-s.lead_steps} steps after the loss diverged"))
    items.append(("flagged layers", ", ".join(map(str, s.flagged_layers)) or "none"))
    return _dl(items)


def _judged(report: ScanReport) -> str:
    """What the verdict rests on: the pairs judged, and what was not judged and why."""
    s = report.summary
    if s.judged_pairs is None:  # a report from before the summary counted them
        return "–"
    judged = f"{s.judged_pairs} of {counted(len(report.pairs), 'pair')}"
    return f"{judged}; not judged: {'; '.join(s.not_judged)}" if s.not_judged else judged


def _layers_table(report: ScanReport) -> str:
    monitors = headline_monitors(report)
    header = ["layer", "status", "first alert", "first warning"]
    for m in monitors:
        header += [f"{m.label} now", "baseline or ceiling"]
    rows = []
    by_pair = pair_layers(report)
    for summary in report.summary.layers:
        row: list[object] = [summary.layer, summary.status, first_alert_text(summary),
                             summary.first_warn_step if summary.first_warn_step is not None else "–"]
        for m in monitors:
            row += headline_cells(summary, m, layer_series(by_pair, summary.layer, m.read), report.thresholds,
                                  report.model.hidden_size)
        rows.append(row)
    if not rows:
        return "<p>No per-layer summary in this report.</p>"
    return _table(header, rows, text_columns=0)


def _findings(report: ScanReport) -> str:
    items = []
    for summary in report.summary.layers:
        if summary.status not in ("warn", "alert"):
            continue
        for step, f in first_findings(report, summary.layer):
            items.append(f"<li>layer {_e(summary.layer)}, step {_e(step)}, {_e(f.family)} "
                         f'<span class="badge {_e(f.severity)}">{_e(f.severity)}</span> {_e(f.message)}</li>')
    return f"<ul>\n{chr(10).join(items)}\n</ul>" if items else "<p>No layer was flagged.</p>"


def _thresholds(report: ScanReport) -> str:
    if not report.thresholds:
        return "<p>The report carries no thresholds.</p>"
    rows = [[name, _value(value)] for name, value in report.thresholds.items()]
    return _table(["setting", "value"], rows, text_columns=2)


def _value(value: object) -> str:
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "–"
    return "–" if value is None else str(value)


def _run_facts(report: ScanReport) -> str:
    m = report.model
    model = [("family", m.family), ("layers", m.num_layers), ("hidden size", m.hidden_size),
             ("query heads / KV heads", f"{m.num_heads} / {m.num_kv_heads}"), ("head dim", m.head_dim)]
    if m.num_experts:
        model.append(("experts", f"{m.num_experts}" + (f", top-{m.top_k}" if m.top_k else "")))
    steps = [c.step for c in report.checkpoints if c.step is not None]
    run = [("checkpoints", f"{len(report.checkpoints)}" + (f", steps {min(steps)}–{max(steps)}" if steps else "")),
           ("pairs", len(report.pairs))]
    run += [(key.replace("_", " "), _value(value)) for key, value in report.settings.items()]
    if report.probe is not None:
        run.append(("probe", report.probe))
    notes = setting_notes(report)
    parts = ["<h3>Model</h3>", _dl(model), "<h3>Run</h3>", _dl_noted(run, notes)]
    if report.skipped:
        rows = [[item.get("path", ""), item.get("reason", "")] for item in report.skipped]
        parts += ["<h3>Skipped checkpoints</h3>", _table(["path", "reason"], rows, text_columns=2)]
    return "\n".join(parts)
