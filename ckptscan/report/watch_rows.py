"""The rows `ckptscan watch` prints as new pairs are judged.

A row: the newer step, the pair, each family's headline monitor (attention:
Δ2 H/ln n; router: routing entropy with a probe, else ε; only for models with
routers; output: the output logit scale) at the pair's worst layer for that
family, each with that layer's baseline, or the monitor's own ceiling where
it is judged against one (`fired.reference_text`, as in every format), the
pair's loss (with a loss log), its status and its flagged layers. The same
cells make the Markdown rows appended to --markdown-summary.

A finding is printed when it starts or changes, not at every pair: under a
row, the warnings and alerts the previous pair did not have (a standing
ceiling alert is printed once, at the pair it began). The newest pair of each
batch gets its row (a live run's batch is its one new checkpoint, so each is
seen as it is judged); of the pairs before it in a batch (a watch started on
a run already under way reads the run so far as one batch), only those whose
status changed or that carry a new finding, the others counted in one line.
"""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from ckptscan.report.fired import ceiling, reference_text
from ckptscan.report.markdown import ICONS, escape
from ckptscan.report.table import STATUS_STYLE, fmt
from ckptscan.monitors.spec import MonitorSpec
from ckptscan.report.trend_table import headline_monitors, short_family
from ckptscan.schema.results import SEVERITIES, LayerResult, PairResult, ScanReport
from ckptscan.schema.results import status_word

WIDTHS = {"step": 8, "pair": 11, "value": 13, "base": 6, "loss": 7, "status": 10}


def columns(report: ScanReport, short: bool = False) -> list[str]:
    """The column names; `short`: each family's name for its monitor's label
    (the terminal's, which stays within 120 columns; `legend` names them)."""
    names = ["step", "pair"]
    for monitor in headline_monitors(report):
        names += [short_family(monitor.family) if short else monitor.label, "base"]
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
        cells += [f"{fmt(monitor.read(layer))} (L{layer.layer})",
                  reference_text(judged.expected if judged else None, _ceiling(report, monitor))]
    if "loss_log" in report.settings:
        cells.append(fmt(pair.loss))
    flagged = [str(layer.layer) for layer in pair.layers if layer.status in ("warn", "alert")]
    return cells + [pair.status, ",".join(flagged) or "–"]


def _ceiling(report: ScanReport, monitor: MonitorSpec) -> float | None:
    """The monitor's own ceiling in this report (the output logit scale's), None for one judged otherwise."""
    return ceiling(monitor.name, report.thresholds, report.model.hidden_size)


def worst_layer(pair: PairResult, monitor: MonitorSpec) -> LayerResult | None:
    """The layer whose findings of the monitor's family are the most severe,
    ties going to the lowest value (both headlines alarm low)."""
    def rank(measured: tuple[LayerResult, float]) -> tuple[int, float]:
        layer, value = measured
        severity = max((SEVERITIES.index(f.severity) for f in layer.findings if f.family == monitor.family),
                       default=0)
        return -severity, value

    values = [(layer, value) for layer in pair.layers if (value := monitor.read(layer)) is not None]
    worst = min(values, key=rank, default=None)
    return worst[0] if worst is not None else None


def finding_lines(pair: PairResult) -> list[tuple[str, str]]:
    """(severity, text) of each warning and alert of the pair, layer by layer."""
    return [(f.severity, f"layer {layer.layer} [{f.family}] {f.severity}: {f.message}")
            for layer in pair.layers for f in layer.findings if f.severity in ("warn", "alert")]


def _keys(pair: PairResult) -> set[tuple[int, str, str, str]]:
    """What a pair's warnings and alerts are, without their values: layer, family, monitor and severity."""
    return {(layer.layer, f.family, f.monitor, f.severity) for layer in pair.layers for f in layer.findings
            if f.severity in ("warn", "alert")}


def new_finding_lines(report: ScanReport, index: int) -> list[tuple[str, str]]:
    """The pair's warnings and alerts that the pair before it did not have
    (a finding that starts, or whose severity changes)."""
    pair = report.pairs[index]
    before = _keys(report.pairs[index - 1]) if index > 0 else set()
    return [(f.severity, f"layer {layer.layer} [{f.family}] {f.severity}: {f.message}")
            for layer in pair.layers for f in layer.findings if f.severity in ("warn", "alert")
            and (layer.layer, f.family, f.monitor, f.severity) not in before]


def shown_rows(report: ScanReport, new: list[int]) -> list[int]:
    """Of a batch of new pairs, those given a row: the newest, and each one
    whose status is not the previous pair's or that carries a new finding."""
    shown = []
    for index in new:
        previous = report.pairs[index - 1].status if index > 0 else None
        if (index == new[-1] or report.pairs[index].status != previous or index == 0
                or new_finding_lines(report, index)):
            shown.append(index)
    return shown


def legend(report: ScanReport) -> str:
    """Which monitor each family's column gives, at the pair's worst layer (Ln)."""
    return "columns: " + ", ".join(f"{short_family(m.family)} {m.label}" for m in headline_monitors(report)) + \
        " at the pair's worst layer (Ln), each with that layer's baseline or its own ceiling"


def skipped_line(report: ScanReport, skipped: list[int]) -> str:
    """'… 6 pairs, steps 200–700: not_judged, nothing new' (consecutive pairs of one status)."""
    first, last = report.pairs[skipped[0]], report.pairs[skipped[-1]]
    steps = f"step {first.to_step}" if len(skipped) == 1 else f"steps {first.to_step}–{last.to_step}"
    return f"{'':>{WIDTHS['step']}} … {len(skipped)} pair{'s' if len(skipped) > 1 else ''}, {steps}: " \
        f"{first.status}, nothing new"


def print_rows(console: Console, report: ScanReport, new: list[int], header: bool = False) -> None:
    """The rows of the new pairs `shown_rows` keeps (the column names first,
    when `header`), each with its new findings; the pairs between them
    counted in one dim line."""
    names = columns(report, short=True)
    if header:
        console.print(Text(legend(report), style="dim"))
        console.print(Text(_line(names, names, base_widths(report)), style="bold"))
    shown = shown_rows(report, new)
    kept = set(shown)
    skipped: list[int] = []
    for index in new:
        if index not in kept:
            skipped.append(index)
            continue
        if skipped:
            console.print(Text(skipped_line(report, skipped), style="dim"))
            skipped = []
        cells = pair_cells(report, index)
        status = report.pairs[index].status
        line = Text(_line(names, cells[:-2], base_widths(report)) + " ")
        line.append(cells[-2].ljust(WIDTHS["status"]), style=STATUS_STYLE.get(status, ""))
        line.append(" " + cells[-1])
        console.print(line)
        for severity, text in new_finding_lines(report, index):
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


def base_widths(report: ScanReport) -> list[int]:
    """Each headline monitor's "base" column width: WIDTHS's, or its ceiling's cell ("ceiling 2") where wider."""
    return [max(WIDTHS["base"], len(reference_text(None, _ceiling(report, monitor))))
            for monitor in headline_monitors(report)]


def _line(names: list[str], cells: list[str], bases: list[int] | None = None) -> str:
    """Fixed-width cells: rows printed one at a time still line up. `bases`:
    the width of each "base" column in turn (`base_widths`), else WIDTHS's."""
    widths = [WIDTHS["step"], WIDTHS["pair"]]
    base = iter(bases or [])
    for name in names[2:]:
        widths.append(next(base, WIDTHS["base"]) if name == "base" else WIDTHS.get(name, WIDTHS["value"]))
    return " ".join(cell.rjust(width) if i == 0 else cell.ljust(width)
                    for i, (cell, width) in enumerate(zip(cells, widths)))


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(escape(c) for c in cells) + " |"
