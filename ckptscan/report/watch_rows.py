"""The rows `ckptscan watch` prints: one line per new pair, as it is judged.

A row: the newer step, the pair, each family's headline monitor (attention:
Δ2 H/ln n; router: routing entropy with a probe, else ε; only for models with
routers) at the pair's worst layer for that family, each with that layer's
baseline, the pair's loss (with a loss log), its status and its flagged
layers. Under a flagged row, each warning and alert of the pair. The same
cells make the Markdown rows appended to --markdown-summary.
"""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from ckptscan.report.markdown import ICONS, escape
from ckptscan.report.table import STATUS_STYLE, fmt
from ckptscan.monitors.spec import MonitorSpec
from ckptscan.report.trend_table import headline_monitors
from ckptscan.schema.results import SEVERITIES, LayerResult, PairResult, ScanReport
from ckptscan.schema.results import status_word

WIDTHS = {"step": 8, "pair": 15, "value": 14, "base": 6, "loss": 7, "status": 10}


def columns(report: ScanReport) -> list[str]:
    names = ["step", "pair"]
    for monitor in headline_monitors(report):
        names += [monitor.label, "base"]
    if "loss_log" in report.settings:
        names.append("loss")
    return names + ["status", "flagged layers"]


def pair_cells(report: ScanReport, index: int) -> list[str]:
    """The row of `report.pairs[index]`, as strings, in `columns` order."""
    pair = report.pairs[index]
    cells = [str(pair.to_step), f"{pair.from_step}→{pair.to_step}"]
    for monitor in headline_monitors(report):
        layer = worst_layer(pair, monitor)
        if layer is None:
            cells += ["–", "–"]
            continue
        judged = layer.judgements.get(monitor.name)
        cells += [f"{fmt(monitor.read(layer))} (L{layer.layer})", fmt(judged.expected if judged else None)]
    if "loss_log" in report.settings:
        cells.append(fmt(pair.loss))
    flagged = [str(layer.layer) for layer in pair.layers if layer.status in ("warn", "alert")]
    return cells + [pair.status, ",".join(flagged) or "–"]


def worst_layer(pair: PairResult, monitor: MonitorSpec) -> LayerResult | None:
    """The layer whose findings of the monitor's family are the most severe,
    ties going to the lowest value (both headlines alarm low)."""
    def rank(layer: LayerResult) -> tuple[int, float]:
        severity = max((SEVERITIES.index(f.severity) for f in layer.findings if f.family == monitor.family),
                       default=0)
        return -severity, monitor.read(layer)

    measured = [layer for layer in pair.layers if monitor.read(layer) is not None]
    return min(measured, key=rank, default=None)


def finding_lines(pair: PairResult) -> list[tuple[str, str]]:
    """(severity, text) of each warning and alert of the pair, layer by layer."""
    return [(f.severity, f"layer {layer.layer} [{f.family}] {f.severity}: {f.message}")
            for layer in pair.layers for f in layer.findings if f.severity in ("warn", "alert")]


def print_rows(console: Console, report: ScanReport, new: list[int], header: bool = False) -> None:
    """The new pairs' rows (and the column names first, when `header`)."""
    names = columns(report)
    if header:
        console.print(Text(_line(names, names), style="bold"))
    for index in new:
        cells = pair_cells(report, index)
        status = report.pairs[index].status
        line = Text(_line(names, cells[:-2]) + " ")
        line.append(cells[-2].ljust(WIDTHS["status"]), style=STATUS_STYLE.get(status, ""))
        line.append(" " + cells[-1])
        console.print(line)
        for severity, text in finding_lines(report.pairs[index]):
            console.print(Text("    " + text, style=STATUS_STYLE[severity]))


def markdown_rows(report: ScanReport, new: list[int]) -> str:
    """A Markdown section with the new pairs' rows and findings."""
    names = columns(report)
    where = report.settings.get("run", "")
    status = report.summary.status
    newest = report.pairs[new[-1]].to_step
    heading = f"#### {ICONS.get(status, '')} ckptscan watch: `{escape(where)}` at step {newest} — {status_word(status)}"
    lines = [heading, "", _row(names), _row(["---"] * len(names))]
    for index in new:
        cells = pair_cells(report, index)
        cells[-2] = f"{ICONS.get(cells[-2], '')} {cells[-2]}"
        lines.append(_row(cells))
    lines.append("")
    for index in new:
        pair = report.pairs[index]
        lines += [f"- step {pair.to_step}, {escape(text)}" for _, text in finding_lines(pair)]
    return "\n".join(lines) + "\n"


def _line(names: list[str], cells: list[str]) -> str:
    """Fixed-width cells: rows printed one at a time still line up."""
    widths = [WIDTHS["step"], WIDTHS["pair"]]
    for name in names[2:]:
        widths.append(WIDTHS.get(name, WIDTHS["base"] if name == "base" else WIDTHS["value"]))
    return " ".join(cell.rjust(width) if i == 0 else cell.ljust(width)
                    for i, (cell, width) in enumerate(zip(cells, widths)))


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(escape(c) for c in cells) + " |"
