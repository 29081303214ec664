"""Terminal rendering of a run (`ckptscan trend`): one row per layer.

Each row: a sparkline of each family's headline monitor (the normalised Δ2
entropy; the router's routing entropy with a probe, else ε) over the run, each
cell coloured by the worst finding of that monitor's family in its pairs;
the layer's first alert (step and family); what fired (the monitor and its
value against its limit, `report/fired.py`); its worst status. The table is
made for a terminal of 80 to 120 columns (wider consoles, and a pipe, get
120): the cells a reader acts on (first alert, what fired, status) are never
cut, what fired wraps rather than lose its limit, and the sparklines take
the room left. `--wide` adds each monitor's newest value and its baseline
(the JSON and HTML reports have every value). Below: the loss, the skipped checkpoints, the verdict, the rollback
candidate and the resume plan (`report/resume.py`), what to do and the lead time, then each flagged layer's first
findings.

It stays one screen however long the run and however many layers: a run of
any length is folded into the sparklines' cells (each coloured by the worst
status of its pairs, so an alert or a warning is never folded away); a model
with more than MAX_LAYER_ROWS layers shows every layer that is not ok, the
first and last EDGE_ROWS layers, and each other run of ok layers as one
"… k ok layers …" row; the first findings are given for at most
MAX_FINDING_LAYERS flagged layers (the earliest to fire), the skipped
checkpoints in at most MAX_SKIPPED_LINES lines. Below those sizes the table
is printed whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ckptscan.monitors.interventions import family_lines
from ckptscan.report.fired import fired_text, first_fired, headline_cells
from ckptscan.report.resume import terminal_lines
from ckptscan.report.sparkline import cell_statuses, sparkline
from ckptscan.report.table import STATUS_STYLE, fmt, print_model, print_reference_notes
from ckptscan.monitors import registry
from ckptscan.monitors.spec import MonitorSpec
from ckptscan.schema.results import CORRUPT, Finding, LayerResult, LayerSummary, ScanReport, counted, worst

SPARK_WIDTH = 30  # at most this many cells per sparkline
MIN_SPARK_WIDTH = 6
# The widest table printed by default: a wider console (or a pipe, whose
# width is unbounded) still gets a table a reader can take in at once.
TABLE_WIDTH = 120
# What a column costs besides its cells in the SIMPLE_HEAD box without edge
# padding: a space of padding on each side of the separator, and the separator.
COLUMN_GAP = 3
# The first alert (what fired, against its limit) never gets less than this, and wraps within it.
FIRED_MIN_WIDTH = 24
# Terminal columns taken by everything but the sparklines: layer, first
# alert and status (with padding), and per sparkline its two numbers.
OTHER_COLUMNS_WIDTH = 29
NUMBER_COLUMNS_WIDTH = 18
FINDINGS_PER_LAYER = 3
MAX_LAYER_ROWS = 40  # more layers than this: the ok ones between EDGE_ROWS at each end are folded
EDGE_ROWS = 3
MAX_FINDING_LAYERS = 8
MAX_SKIPPED_LINES = 5


@dataclass(frozen=True)
class FoldedLayers:
    """A run of consecutive ok layers shown as one row of a folded table."""

    first: int
    last: int
    count: int


def shown_layers(layers: list[LayerSummary], limit: int = MAX_LAYER_ROWS, edge: int = EDGE_ROWS
                 ) -> list[LayerSummary | FoldedLayers]:
    """The table's rows: every layer when there are at most `limit`; else
    every layer whose status is not ok (never folded), the first and last
    `edge` layers, and each run of ok layers between them as one row."""
    if len(layers) <= limit:
        return list(layers)
    rows: list[LayerSummary | FoldedLayers] = []
    run: list[LayerSummary] = []
    for k, summary in enumerate(layers):
        if summary.status == "ok" and edge <= k < len(layers) - edge:
            run.append(summary)
            continue
        rows += _fold(run)
        run = []
        rows.append(summary)
    return rows + _fold(run)


def _fold(run: list[LayerSummary]) -> list[LayerSummary | FoldedLayers]:
    """A run of ok layers: itself when it is one layer (a row either way), else one folded row."""
    if len(run) <= 1:
        return list(run)
    return [FoldedLayers(run[0].layer, run[-1].layer, len(run))]


def series(report: ScanReport, layer: int, read: Callable[[LayerResult], float | None]) -> list[float | None]:
    """One layer's values over the run's pairs."""
    return layer_series(pair_layers(report), layer, read)


def pair_layers(report: ScanReport) -> list[dict[int, LayerResult]]:
    """Per pair, its results by layer: looked up once, so that a table of L
    layers over P pairs costs O(P·L), not O(P·L²)."""
    return [{r.layer: r for r in pair.layers} for pair in report.pairs]


def layer_series(by_pair: list[dict[int, LayerResult]], layer: int, read: Callable[[LayerResult], float | None]
                 ) -> list[float | None]:
    return [read(by_layer[layer]) if layer in by_layer else None for by_layer in by_pair]


def layer_family_statuses(by_pair: list[dict[int, LayerResult]], layer: int, family: str) -> list[str]:
    found = [by_layer[layer].findings if layer in by_layer else [] for by_layer in by_pair]
    # Most layer-pairs have no finding: "ok" without a call (2,000 pairs × 16 layers × each monitor).
    return [worst([f.severity for f in findings if f.family == family]) if findings else "ok" for findings in found]


def headline_monitors(report: ScanReport) -> list[MonitorSpec]:
    """Per family, the first of its headline monitors with a value in the
    report (the router's: routing entropy when a probe gave it, else ε)."""
    return registry.headlines(lambda monitor: any(monitor.read(layer) is not None
                                                  for pair in report.pairs for layer in pair.layers))


def first_findings(report: ScanReport, layer: int, count: int = FINDINGS_PER_LAYER) -> list[tuple[int | None, Finding]]:
    """The layer's first warn/alert findings: the first alert of each monitor
    (or its first warning when it never alerted), in step order."""
    seen: dict[str, tuple[int | None, Finding]] = {}
    for pair in report.pairs:
        for result in pair.layers:
            if result.layer != layer:
                continue
            for f in result.findings:
                if f.severity not in ("warn", "alert"):
                    continue
                held = seen.get(f.monitor)
                if held is None or (held[1].severity == "warn" and f.severity == "alert"):
                    seen[f.monitor] = (pair.to_step, f)
    return sorted(seen.values(), key=lambda sf: (sf[0] is None, sf[0] or 0))[:count]


def earliest_to_fire(flagged: list[LayerSummary], count: int) -> list[LayerSummary]:
    """The `count` flagged layers that alerted first (then warned first), in layer order."""
    never = float("inf")
    ranked = sorted(flagged, key=lambda s: (s.first_alert_step if s.first_alert_step is not None else never,
                                            s.first_warn_step if s.first_warn_step is not None else never, s.layer))
    return sorted(ranked[:count], key=lambda s: s.layer)


def first_alert_text(summary: LayerSummary) -> str:
    """'1700 attention', or '–' (the findings below name the monitor)."""
    if summary.first_alert_step is None:
        return "–"
    return f"{summary.first_alert_step} {summary.first_alert_family}"


def trend_table(report: ScanReport, width: int = 160, wide: bool = False) -> Table:
    """The per-layer table at most `width` columns wide (and TABLE_WIDTH
    unless `wide`); sparklines take what the other columns leave."""
    if not wide:
        width = min(width, TABLE_WIDTH)
    monitors = headline_monitors(report)
    by_pair = pair_layers(report)
    shown = shown_layers(report.summary.layers)
    fired = {summary.layer: _fired_cell(report, by_pair, summary) for summary in shown
             if isinstance(summary, LayerSummary)}
    layer_width = max([5] + [len(_layer_label(summary)) for summary in shown])
    status_width = max([6] + [len(summary.status) for summary in shown if isinstance(summary, LayerSummary)])
    longest = max([11] + [len(text) for text in fired.values()])
    # The sparklines give way from the right before the first alert gets less than FIRED_MIN_WIDTH.
    while True:
        headers = [monitor.label if wide else short_family(monitor.family) for monitor in monitors]
        narrowest = max([MIN_SPARK_WIDTH] + [len(header) for header in headers])
        columns = 3 + len(monitors) * (3 if wide else 1)
        room = (width - layer_width - status_width - COLUMN_GAP * (columns - 1)
                - (NUMBER_COLUMNS_WIDTH * len(monitors) if wide else 0))
        if wide or not monitors or room - narrowest * len(monitors) >= min(longest, FIRED_MIN_WIDTH):
            break
        monitors = monitors[:-1]
    # The first alert takes what it needs when the narrowest sparklines leave it that, else what they leave
    # (and wraps at a space: never cut); the sparklines take the rest.
    fired_width = min(longest, max(FIRED_MIN_WIDTH, room - narrowest * len(monitors)))
    # No wider than the run has pairs: a sparkline draws one cell per pair at most.
    spark_width = max(narrowest, min(SPARK_WIDTH, len(report.pairs), (room - fired_width) // max(1, len(monitors))))
    table = Table(title=_title(report), title_justify="left", header_style="bold", box=box.SIMPLE_HEAD,
                  pad_edge=False, show_edge=False)
    table.add_column("layer", justify="right", no_wrap=True, min_width=layer_width)
    for header in headers:
        table.add_column(header, no_wrap=True, min_width=spark_width, max_width=spark_width, overflow="crop")
        if wide:
            table.add_column("now", justify="right", no_wrap=True, min_width=5)
            table.add_column("base", justify="right", no_wrap=True, min_width=5)
    table.add_column("first alert", overflow="fold", min_width=fired_width, max_width=fired_width)
    table.add_column("status", no_wrap=True, min_width=status_width)
    for summary in shown:
        if isinstance(summary, FoldedLayers):
            folded = Text(f"… {summary.count} ok layers …", style="dim")
            table.add_row(_layer_label(summary), folded, *[""] * ((3 if wide else 1) * len(monitors) - 1), "",
                          Text("ok", style=STATUS_STYLE.get("ok", "")))
            continue
        row: list[Text | str] = [str(summary.layer)]
        for monitor in monitors:
            cells = _spark_cells(by_pair, summary, monitor, report, spark_width)
            row += cells if wide else cells[:1]
        row += [fired[summary.layer], Text(summary.status, style=STATUS_STYLE.get(summary.status, ""))]
        table.add_row(*row)
    return table


def short_family(family: str) -> str:
    """A family's name as a narrow table's sparkline header: shortened where it is wider than a sparkline
    need be (`FamilySpec.short`)."""
    spec = registry.finding_spec(family)
    return spec.short if spec is not None and spec.short is not None else family


def _layer_label(row: LayerSummary | FoldedLayers) -> str:
    return f"{row.first}–{row.last}" if isinstance(row, FoldedLayers) else str(row.layer)


def layer_fired(report: ScanReport, by_pair: list[dict[int, LayerResult]], summary: LayerSummary
                ) -> tuple[int | None, Finding] | None:
    """The finding behind a layer's row: its first alert (the one the summary
    names, at its step), else its first warning (`report.fired.first_fired`)."""
    steps = [(pair.to_step, by_layer.get(summary.layer)) for pair, by_layer in zip(report.pairs, by_pair)]
    if summary.first_alert_step is not None and summary.first_alert_monitor:
        for step, result in steps:
            if step != summary.first_alert_step or result is None:
                continue
            named = next((f for f in result.findings
                          if f.severity == "alert" and f.monitor == summary.first_alert_monitor), None)
            if named is not None:
                return step, named
    return first_fired(steps)


def _fired_cell(report: ScanReport, by_pair: list[dict[int, LayerResult]], summary: LayerSummary) -> str:
    """'1400 attention logit scale 2.15 > 2': the first alert's step and what fired; a layer that only warned,
    'warn 1900: …'; else '–'."""
    found = layer_fired(report, by_pair, summary)
    if found is None:
        return first_alert_text(summary)
    step, finding = found
    if finding.severity == "alert":
        return f"{summary.first_alert_step if summary.first_alert_step is not None else step} {fired_text(finding)}"
    return f"– (warn {step}: {fired_text(finding)})"


def spark_legend(report: ScanReport) -> str:
    """Under a narrow table: which monitor each family's sparkline draws."""
    return "sparklines over the run: " + ", ".join(f"{short_family(m.family)} {m.label}"
                                                    for m in headline_monitors(report)) + \
        " (--wide: their newest values and baselines)"


def print_trend(console: Console, report: ScanReport, wide: bool = False) -> None:
    print_model(console, report)
    table = trend_table(report, console.width, wide)
    # The title on a line of its own: a run's path may be longer than the table is wide, and is never wrapped
    # where the console is not (a pipe).
    console.print(Text(str(table.title)), highlight=False)
    table.title = None
    console.print(table)
    if not wide and headline_monitors(report):
        console.print(spark_legend(report), highlight=False, style="dim")
    _print_loss(console, report)
    print_reference_notes(console, report)
    _print_summary(console, report)


def _spark_cells(by_pair: list[dict[int, LayerResult]], summary: LayerSummary, monitor: MonitorSpec,
                 report: ScanReport, width: int) -> list[Text | str]:
    """The sparkline, and the value now and its baseline or ceiling as every format gives them
    (`report.fired.headline_cells`)."""
    layer = summary.layer
    values = layer_series(by_pair, layer, monitor.read)
    line = sparkline(values, width)
    text = Text()
    for char, status in zip(line, cell_statuses(layer_family_statuses(by_pair, layer, monitor.family), width)):
        text.append(char, style=STATUS_STYLE.get(status, "") if status in ("warn", "alert") else "")
    return [text, *headline_cells(summary, monitor, values, report.thresholds, report.model.hidden_size)]


def _title(report: ScanReport) -> str:
    s = report.settings
    pairs = report.pairs
    steps = f"steps {pairs[0].from_step}–{pairs[-1].to_step}" if pairs else ""
    how = "each against the first" if s.get("pairing") == "first" else "consecutive"
    stride = f", stride {s['stride']}" if s.get("stride", 1) != 1 else ""
    return f"{s.get('run', '')}: {counted(len(pairs), 'pair')} ({how}{stride}), {steps}"


def _print_loss(console: Console, report: ScanReport) -> None:
    """The loss over the run: mean loss of the first and last pairs and, for a
    run that diverged, its lowest pair and the divergence step (a run that
    diverged late can still end below where it started)."""
    if "loss_log" not in report.settings:
        return
    losses = [p.loss for p in report.pairs]
    known = [(loss, pair) for loss, pair in zip(losses, report.pairs) if loss is not None]
    divergence = report.summary.loss_divergence_step
    if not known:
        span = "no finite loss"
    elif divergence is None:
        span = f"{fmt(known[0][0])} → {fmt(known[-1][0])}"
    else:
        low, pair = min(known, key=lambda k: k[0])
        span = (f"first pair {fmt(known[0][0])}, lowest {fmt(low)} (steps {pair.from_step}–{pair.to_step}), "
                f"last pair {fmt(known[-1][0])}")
    diverged = f"diverged at step {divergence}" if divergence is not None else "did not diverge"
    console.print(f"loss      {sparkline(losses, SPARK_WIDTH)}  {span}; {diverged} ({report.settings['loss_log']})",
                  highlight=False)


def skipped_line(item: dict[str, str]) -> str:
    """A skipped checkpoint, its path once (a reader's message starts with it)."""
    reason = item["reason"]
    return f"skipped {reason}" if reason.startswith(item["path"]) else f"skipped {item['path']}: {reason}"


def _print_summary(console: Console, report: ScanReport) -> None:
    s = report.summary
    # Before the verdict, which covers only the checkpoints scanned. A corrupt
    # checkpoint fails the gate, so each is named; the others at most a few.
    corrupt = [item for item in report.skipped if item.get("kind") == CORRUPT]
    others = [item for item in report.skipped if item.get("kind") != CORRUPT]
    for item in corrupt:
        console.print(skipped_line(item), highlight=False, style="yellow")
    for item in others[:MAX_SKIPPED_LINES]:
        console.print(skipped_line(item), highlight=False, style="dim")
    if len(others) > MAX_SKIPPED_LINES:
        console.print(f"… and {len(others) - MAX_SKIPPED_LINES} more skipped checkpoints (the JSON report "
                      f"lists them)", highlight=False, style="dim")
    console.print(Text(s.message or s.status, style=STATUS_STYLE.get(s.status, "")))
    for line in terminal_lines(s):  # the rollback candidate and the resume plan (report/resume.py)
        console.print(line, highlight=False)
    for line in family_lines(s):
        console.print(f"  what to do, {line}", highlight=False)
    if s.interventions:
        console.print("  (each with its source: the JSON's summary.interventions, the HTML report)", highlight=False)
    if s.lead_steps is not None:
        console.print(f"lead: the first alert came {s.lead_steps} steps before the loss diverged"
                      if s.lead_steps >= 0 else
                      f"lead: none, the loss diverged {-s.lead_steps} steps before the first alert", highlight=False)
    flagged = [summary for summary in s.layers if summary.status in ("warn", "alert")]
    detailed = {d.layer for d in earliest_to_fire(flagged, MAX_FINDING_LAYERS)}
    for summary in flagged:
        if summary.layer not in detailed:
            continue
        for step, f in first_findings(report, summary.layer):
            style = STATUS_STYLE[f.severity]
            console.print(Text(f"  layer {summary.layer} step {step} [{f.family}] {f.severity}: {f.message}",
                               style=style))
    if len(detailed) < len(flagged):
        console.print(f"  … and {len(flagged) - len(detailed)} more flagged layers (in the table above); the JSON "
                      f"and HTML reports give their findings", highlight=False, style="dim")
    for note in report.settings.get("run_notes", []):  # e.g. steps that are accelerate save indices
        console.print(f"note: {note}", highlight=False, style="dim")
    pending = report.settings.get("pending_steps")
    if pending:
        console.print(f"newer checkpoints not on the stride yet (not scanned): steps {pending}", highlight=False,
                      style="dim")
