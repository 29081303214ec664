"""Terminal rendering with rich: the per-layer health table of one pair.

Made for a terminal of 80 to 120 columns: by default a row gives the layer,
the headline monitors (normalised Δ2 entropy, the relative update of W_q, the
router's ε and, with a probe, its routing entropy), what fired (the monitor
and its value against its limit, `report/fired.py`, wrapped rather than cut)
and the status. `wide` gives every monitor's column as well (the JSON and
HTML reports have every value).
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ckptscan.report.fired import deciding_finding, fired_text
from ckptscan.report.resume import terminal_lines
from ckptscan.schema.results import PairResult, ScanReport

STATUS_STYLE = {"ok": "green", "unchanged": "dim", "info": "cyan", "warn": "yellow", "not_judged": "magenta",
                "alert": "bold red"}


def fmt(value: float | None) -> str:
    """Three significant digits: the table is for eyes, the JSON for exact values."""
    return "–" if value is None else f"{value:.3g}"


# The widest table printed by default (trend_table.TABLE_WIDTH), the least
# room its "fired" column wraps within, and what a column costs besides its
# cells (padding on each side and the separator).
TABLE_WIDTH = 120
FIRED_MIN_WIDTH = 24
COLUMN_GAP = 3


def pair_table(pair: PairResult, width: int = TABLE_WIDTH, wide: bool = False) -> Table:
    """The pair's table: at most `width` (and TABLE_WIDTH) columns unless `wide`."""
    if wide:
        return _wide_pair_table(pair)
    has_router = any(layer.router is not None for layer in pair.layers)
    has_routing = any(layer.router is not None and layer.router.routing_entropy is not None for layer in pair.layers)
    title = f"{_step(pair.from_step, pair.from_path)} → {_step(pair.to_step, pair.to_path)}"
    names = ["layer", "Δ2 H/ln n", "ΔWq rel"] + (["ε"] if has_router else []) + (["route H"] if has_routing else [])
    rows = []
    for layer in pair.layers:
        att, router = layer.attention, layer.router
        row: list[str | Text] = [str(layer.layer)]
        row += [fmt(att.delta2_entropy_norm), fmt(att.dwq_rel_norm)] if att is not None else ["–", "–"]
        if has_router:
            row.append(fmt(router.epsilon) if router is not None else "–")
        if has_routing:
            row.append(fmt(router.routing_entropy) if router is not None else "–")
        finding = deciding_finding(layer)
        row += [fired_text(finding) if finding is not None else "–",
                Text(layer.status, style=STATUS_STYLE.get(layer.status, ""))]
        rows.append(row)
    status_width = max([6] + [len(layer.status) for layer in pair.layers])
    longest = max([5] + [len(str(row[-2])) for row in rows])
    # The monitors' columns give way from the right, down to the first, before what fired gets less than
    # FIRED_MIN_WIDTH (it wraps within what it gets: never cut).
    while True:
        widths = [max([len(name)] + [len(str(row[k])) for row in rows]) for k, name in enumerate(names)]
        columns = len(names) + 2  # and the box's two edges, a border and a space each
        room = min(width, TABLE_WIDTH) - sum(widths) - status_width - COLUMN_GAP * (columns - 1) - 4
        if room >= min(longest, FIRED_MIN_WIDTH) or len(names) <= 2:
            break
        names.pop()
        rows = [row[:len(names)] + row[-2:] for row in rows]
    fired_width = max(min(longest, FIRED_MIN_WIDTH), min(longest, room))
    table = Table(title=title, title_justify="left", header_style="bold")
    for name in names:
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("fired", overflow="fold", min_width=fired_width, max_width=fired_width)
    table.add_column("status", no_wrap=True, min_width=status_width)
    for row in rows:
        table.add_row(*row)
    return table


def _wide_pair_table(pair: PairResult) -> Table:
    has_router = any(layer.router is not None for layer in pair.layers)
    has_routing = any(layer.router is not None and layer.router.routing_entropy is not None for layer in pair.layers)
    title = f"{_step(pair.from_step, pair.from_path)} → {_step(pair.to_step, pair.to_path)}"
    table = Table(title=title, title_justify="left", header_style="bold")
    # H: spectral entropy (nats), mean over heads; "min" is the worst head.
    for name in ["layer", "Δ2 H", "Δ2 min", "head", "Δ2 H/ln n", "Δ3 H", "ΔWq H", "ΔWk H", "ΔWq rel"]:
        table.add_column(name, justify="right", no_wrap=True)
    if has_router:
        table.add_column("ε", justify="right", no_wrap=True)
        table.add_column("cos", justify="right", no_wrap=True)
    if has_routing:
        # Probe routing at the newer checkpoint: per-token H(p) mean and 5th percentile (nats).
        for name in ["route H", "route p05", "load CV", "dead"]:
            table.add_column(name, justify="right", no_wrap=True)
    table.add_column("fired", no_wrap=True)
    table.add_column("status", no_wrap=True)
    for layer in pair.layers:
        att = layer.attention
        cells = ["–"] * 8
        if att is not None:
            worst = "–" if att.delta2_entropy_worst_head is None else str(att.delta2_entropy_worst_head)
            cells = [
                fmt(att.delta2_entropy), fmt(att.delta2_entropy_min), worst, fmt(att.delta2_entropy_norm),
                fmt(att.delta3_entropy), fmt(att.dwq_entropy), fmt(att.dwk_entropy), fmt(att.dwq_rel_norm),
            ]
        row: list[str | Text] = [str(layer.layer), *cells]
        if has_router:
            router = layer.router
            row += [fmt(router.epsilon), fmt(router.cosine_similarity)] if router else ["–", "–"]
        if has_routing:
            router = layer.router
            row += [
                fmt(router.routing_entropy), fmt(router.routing_entropy_p05), fmt(router.load_cv),
                "–" if router.dead_experts is None else str(router.dead_experts),
            ] if router else ["–"] * 4
        finding = deciding_finding(layer)
        row.append(fired_text(finding) if finding is not None else "–")
        row.append(Text(layer.status, style=STATUS_STYLE.get(layer.status, "")))
        table.add_row(*row)
    return table


def print_pair(console: Console, report: ScanReport, pair: PairResult, wide: bool = False) -> None:
    table = pair_table(pair, console.width, wide)
    console.print(Text(str(table.title)), highlight=False)  # on its own line: paths may be longer than the table
    table.title = None
    console.print(table)
    for layer in pair.layers:
        for f in layer.findings:
            if f.severity in ("warn", "alert"):
                style = STATUS_STYLE[f.severity]
                console.print(Text(f"  layer {layer.layer} [{f.family}] {f.severity}: {f.message}", style=style))


def print_model(console: Console, report: ScanReport) -> None:
    m = report.model
    experts = f", {m.num_experts} experts" + (f" top-{m.top_k}" if m.top_k else "") if m.num_experts else ""
    console.print(Text.assemble(
        (m.family, "bold"),
        f": {m.num_layers} layers, hidden {m.hidden_size}, {m.num_heads} heads / "
        f"{m.num_kv_heads} KV heads, head_dim {m.head_dim}{experts}",
    ))
    if report.probe is not None:
        top_k = next((layer.router.routing_top_k for pair in report.pairs for layer in pair.layers
                      if layer.router is not None and layer.router.routing_top_k), None)
        assumed = f" (the config gives no top-k: expert load assumes top-{top_k})" if top_k and not m.top_k else ""
        console.print(f"probe: {report.probe}{assumed}", highlight=False)


def print_reference_notes(console: Console, report: ScanReport) -> None:
    """How the references were used: left out, ended early, saved at another interval."""
    for note in report.settings.get("reference_notes", []):
        console.print(Text(f"note: {note}", style="dim"))


def print_summary(console: Console, report: ScanReport) -> None:
    s = report.summary
    style = STATUS_STYLE.get(s.status, "")
    console.print(Text(s.message or s.status, style=style))
    for line in terminal_lines(s):  # the rollback candidate and the resume plan (report/resume.py)
        console.print(line, highlight=False)


def _step(step: int | None, path: str) -> str:
    return f"step {step}" if step is not None else path
