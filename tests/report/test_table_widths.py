"""The terminal tables fit 80 and 120 columns on every sample run, and no
cell a reader acts on is cut: each layer's status, its first alert and what
fired (the monitor, its value against its limit) are there whole, wrapped at
a space at most; `--wide` keeps every monitor's column."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rich.cells import cell_len
from rich.console import Console

from ckptscan import scan_pair, scan_run
from ckptscan.report.fired import deciding_finding, fired_text
from ckptscan.report.table import print_pair
from ckptscan.report.trend_table import TABLE_WIDTH, layer_fired, pair_layers, print_trend

SAMPLES = Path(__file__).resolve().parents[2] / "sample_checkpoints"
RUNS = ("healthy", "attention_fault", "router_fault", "both_faults", "silent_fault")
WIDTHS = (80, 120)

pytestmark = pytest.mark.skipif(not all((SAMPLES / run).is_dir() for run in RUNS),
                                reason="sample_checkpoints/ not present")


@pytest.fixture(scope="module")
def runs():
    return {run: scan_run(SAMPLES / run) for run in RUNS}


@pytest.fixture(scope="module")
def pairs(runs):
    """Each run's pair at its first alert (healthy: 1700 → 1800), as `ckptscan diff` judges it."""
    chosen = {}
    for run, report in runs.items():
        steps = [step for step in report.summary.first_alert_step.values() if step is not None]
        step = min(steps) if steps else 1800
        chosen[run] = scan_pair(SAMPLES / run / f"checkpoint-{step - 100}", SAMPLES / run / f"checkpoint-{step}")
    return chosen


def rendered(print_table, report, width: int, **kwargs) -> list[str]:
    console = Console(width=width, record=True, color_system=None)
    print_table(console, report, **kwargs)
    return console.export_text().splitlines()


def column_cells(lines: list[str], header: str, stop: str | None) -> dict[str, str]:
    """The cells of one column by the row's first cell (the layer), continuation lines joined."""
    head = next(k for k, line in enumerate(lines) if re.search(rf"\b{re.escape(header)}\b", line)
                and line.strip().lstrip("┃│ ").startswith("layer"))
    start = lines[head].index(header)
    end = lines[head].index(stop) if stop is not None else None
    cells: dict[str, str] = {}
    key = None
    for line in lines[head + 2:]:
        if not line.strip() or line.startswith(("└", "sparklines", "loss", "  layer")):
            break
        first = line[:start].strip("│ ").split()
        if first and first[0].replace("│", "").isdigit():
            key = first[0]
            cells[key] = line[start:end].strip(" │")
        elif key is not None:
            cells[key] += " " + line[start:end].strip(" │")
    return {layer: " ".join(text.split()) for layer, text in cells.items()}


def table_lines(lines: list[str]) -> list[str]:
    """The table itself: from its header to the line before what follows it."""
    head = next(k for k, line in enumerate(lines) if "status" in line and "layer" in line)
    end = next((k for k in range(head + 1, len(lines)) if not lines[k].startswith((" ", "─", "│", "└", "┡", "┏"))),
               len(lines))
    return lines[head - 1:end]


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("run", RUNS)
def test_the_trend_table_fits_and_keeps_each_first_alert_and_status_whole(runs, run, width):
    report = runs[run]
    lines = rendered(print_trend, report, width)
    table = table_lines(lines)
    assert max(cell_len(line.rstrip()) for line in table) <= width
    assert not any("…" in line for line in table)  # no cell cut (no folded layers in a 2-layer model)
    alerts = column_cells(lines, "first alert", "status")
    statuses = column_cells(lines, "status", None)
    by_pair = pair_layers(report)
    for summary in report.summary.layers:
        assert statuses[str(summary.layer)] == summary.status
        found = layer_fired(report, by_pair, summary)
        if summary.first_alert_step is not None:
            step, finding = found
            assert alerts[str(summary.layer)] == f"{summary.first_alert_step} {fired_text(finding)}"
            assert finding.monitor == summary.first_alert_monitor  # the monitor that fired is named
        elif found is not None:
            step, finding = found
            assert alerts[str(summary.layer)] == f"– (warn {step}: {fired_text(finding)})"
        else:
            assert alerts[str(summary.layer)] == "–"


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("run", RUNS)
def test_the_diff_table_fits_and_keeps_what_fired_and_the_status_whole(pairs, run, width):
    report = pairs[run]
    lines = rendered(lambda console, r: print_pair(console, r, r.pairs[0]), report, width)
    table = [line for line in lines if line.startswith(("┏", "┃", "┡", "│", "└"))]
    assert max(cell_len(line) for line in table) <= width
    assert not any("…" in line for line in table)
    fired = column_cells(lines, "fired", "status")
    statuses = column_cells(lines, "status", None)
    for layer in report.pairs[0].layers:
        assert statuses[str(layer.layer)] == layer.status
        finding = deciding_finding(layer)
        assert fired[str(layer.layer)] == (fired_text(finding) if finding is not None else "–")


def test_a_pipe_gets_a_table_of_at_most_120_columns(runs):
    """A console without a width (a pipe: the CLI's is 10,000 wide) still gets the narrow table."""
    lines = rendered(print_trend, runs["attention_fault"], 10_000)
    assert max(cell_len(line.rstrip()) for line in table_lines(lines)) <= TABLE_WIDTH


def test_wide_gives_each_monitors_newest_value_and_baseline(runs):
    lines = rendered(print_trend, runs["attention_fault"], 200, wide=True)
    header = next(line for line in lines if "status" in line and "layer" in line)
    assert header.split().count("now") == header.split().count("base") >= 2
    assert "Δ2 H/ln n" in header


def test_wide_diff_keeps_every_monitor_column(pairs):
    lines = rendered(lambda console, r: print_pair(console, r, r.pairs[0], wide=True), pairs["attention_fault"], 200)
    header = next(line for line in lines if "status" in line and "layer" in line)
    for column in ("Δ2 H", "Δ2 min", "head", "Δ3 H", "ΔWq H", "ΔWk H", "cos", "route p05", "load CV", "dead", "fired"):
        assert column in header
