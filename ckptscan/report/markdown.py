"""Markdown summary of a report, e.g. for `$GITHUB_STEP_SUMMARY`.

Every table cell is escaped (`|` → `\\|`, newlines → spaces), so a path or a
message can never break the table.
"""

from __future__ import annotations

from pathlib import Path

from ckptscan.system.output import write_output
from ckptscan.report.fired import headline_cells
from ckptscan.report.sparkline import sparkline
from ckptscan.report.resume import resume_lines
from ckptscan.report.table import fmt
from ckptscan.report.trend_table import SPARK_WIDTH, first_alert_text, first_findings, headline_monitors, series
from ckptscan.schema.results import ScanReport
from ckptscan.schema.results import status_word

ICONS = {"alert": "🔴", "warn": "🟡", "ok": "🟢", "unchanged": "⚪", "not_judged": "❔"}


def escape(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def markdown_report(report: ScanReport) -> str:
    s = report.summary
    where = report.settings.get("run") or (report.pairs[0].to_path if report.pairs else "")
    heading = f"### {ICONS.get(s.status, '')} ckptscan {report.command}: `{escape(where)}` — {status_word(s.status)}"
    lines = [heading, "", escape(s.message), ""]
    lines += _trend_table(report) if report.command == "trend" else _pair_table(report)
    lines.append("")
    if s.rollback_candidate is not None:
        lines.append(f"- rollback candidate: `{escape(s.rollback_candidate.path)}` (step {s.rollback_candidate.step})")
    lines += [f"{'  ' if line.startswith('  ') else ''}- {escape(line.strip())}" for line in resume_lines(s, True)]
    if s.loss_divergence_step is not None:
        lines.append(f"- loss diverged at step {s.loss_divergence_step}"
                     + (f"; lead {s.lead_steps} steps" if s.lead_steps is not None else ""))
    elif "loss_log" in report.settings:
        lines.append("- the loss did not diverge")
    for summary in s.layers:
        if summary.status in ("warn", "alert"):
            for step, f in first_findings(report, summary.layer):
                lines.append(f"- layer {summary.layer}, step {step}, {f.family} {f.severity}: {escape(f.message)}")
    return "\n".join(lines) + "\n"


def append_markdown(report: ScanReport, path: str | Path) -> None:
    """Append the summary to `path` (GitHub step summaries accumulate)."""
    write_output(path, markdown_report(report), append=True)


def _trend_table(report: ScanReport) -> list[str]:
    monitors = headline_monitors(report)
    header = ["layer"]
    for monitor in monitors:
        header += [f"{monitor.label} over the run", "now", "baseline or ceiling"]
    header += ["first alert", "status"]
    rows = [header, ["---"] * len(header)]
    for summary in report.summary.layers:
        row = [str(summary.layer)]
        for monitor in monitors:
            values = series(report, summary.layer, monitor.read)
            row += [sparkline(values, SPARK_WIDTH),
                    *headline_cells(summary, monitor, values, report.thresholds, report.model.hidden_size)]
        row += [first_alert_text(summary), f"{ICONS.get(summary.status, '')} {summary.status}"]
        rows.append(row)
    if "loss_log" in report.settings:
        losses = [p.loss for p in report.pairs]
        known = [v for v in losses if v is not None]
        loss_row = ["loss", sparkline(losses, SPARK_WIDTH), fmt(known[-1] if known else None)]
        rows.append(loss_row + [""] * (len(header) - len(loss_row)))
    return [_row(r) for r in rows]


def _pair_table(report: ScanReport) -> list[str]:
    has_router = any(layer.router is not None for pair in report.pairs for layer in pair.layers)
    header = ["layer", "Δ2 H/ln n", "Δ2 worst head", "ΔWq H/ln r", "ΔWk H/ln r"]
    header += ["router ε", "router cos"] if has_router else []
    header += ["status"]
    rows = [header, ["---"] * len(header)]
    for pair in report.pairs:
        for layer in pair.layers:
            att = layer.attention
            row = [str(layer.layer)]
            row += [fmt(att.delta2_entropy_norm), fmt(att.delta2_entropy_norm_min), fmt(att.dwq_entropy_norm),
                    fmt(att.dwk_entropy_norm)] if att is not None else ["–"] * 4
            if has_router:
                router = layer.router
                row += [fmt(router.epsilon), fmt(router.cosine_similarity)] if router is not None else ["–", "–"]
            row.append(f"{ICONS.get(layer.status, '')} {layer.status}")
            rows.append(row)
    return [_row(r) for r in rows]


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(escape(c) for c in cells) + " |"
