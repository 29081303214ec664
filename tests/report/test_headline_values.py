"""One headline value in every format (issue 52 item 5): for the same layer of
a sample run, the JSON report's value of the output logit scale (the newest
pair's), the terminal's `--wide` table, the Markdown summary, the HTML
page and `watch`'s row of the newest pair show the same number, and beside it the output logit scale's own
ceiling, never the attention logit scale's."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest
from rich.console import Console

from ckptscan import scan_run
from ckptscan.report.fired import ceiling, reference_text
from ckptscan.report.html_page import html_page
from ckptscan.document.plain import report_dict
from ckptscan.report.markdown import markdown_report
from ckptscan.report.trend_table import print_trend
from ckptscan.report.watch_rows import columns, markdown_rows, pair_cells, print_rows
from ckptscan.document.reading import as_json_values, report_from_dict

SAMPLES = Path(__file__).resolve().parents[2] / "sample_checkpoints"
RUNS = ("healthy", "attention_fault")
LABEL = "output logit scale"
# The output logit scale's ceiling (detection/thresholds.py), written here: the cells must show it.
OUTPUT_CEILING = "ceiling 9"

pytestmark = pytest.mark.skipif(not all((SAMPLES / run).is_dir() for run in RUNS),
                                reason="sample_checkpoints/ not present")


@pytest.fixture(scope="module")
def data():
    """Each run's report as its JSON file holds it."""
    return {run: as_json_values(report_dict(scan_run(SAMPLES / run))) for run in RUNS}


def json_value(report: dict, layer: int) -> float:
    """The newest pair's output logit scale of `layer`, read from the JSON alone."""
    found = next(item for item in report["pairs"][-1]["layers"] if item["layer"] == layer)
    return found["families"]["output"]["output_logit_rms"]


def head_layer(report: dict) -> int:
    """The layer that carries the LM head (the last one)."""
    return max(item["layer"] for item in report["pairs"][-1]["layers"] if "output" in item.get("families", {}))


def three(value: float) -> str:
    return f"{value:.3g}"


def terminal_cells(report: dict, layer: int) -> list[str]:
    console = Console(width=220, record=True, color_system=None)
    print_trend(console, report_from_dict(report), wide=True)
    lines = console.export_text().splitlines()
    row = next(line for line in lines if re.match(rf"\s+{layer}\s", line))
    return re.split(r"\s{2,}", row.strip())


def markdown_cells(report: dict, layer: int) -> tuple[list[str], list[str]]:
    lines = markdown_report(report_from_dict(report)).splitlines()
    header = next(line for line in lines if line.startswith("| layer |"))
    row = next(line for line in lines if line.startswith(f"| {layer} |"))
    return [c.strip() for c in header.strip("|").split(" | ")], [c.strip() for c in row.strip("|").split(" | ")]


def html_cells(report: dict, layer: int) -> tuple[list[str], list[str]]:
    page = html_page(report_from_dict(report), report, [])
    table = page.split('<section id="layers">', 1)[1].split("</table>", 1)[0]
    header = [html.unescape(c) for c in re.findall(r"<th[^>]*>(.*?)</th>", table)]
    rows = [[html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row)]
            for row in re.findall(r"<tr>(.*?)</tr>", table) if "<td" in row]
    return header, next(row for row in rows if row[0] == str(layer))


@pytest.mark.parametrize("run", RUNS)
def test_the_output_logit_scale_is_one_number_in_every_format(data, run):
    report = data[run]
    layer = head_layer(report)
    expected = three(json_value(report, layer))

    cells = terminal_cells(report, layer)
    assert f"{expected} {OUTPUT_CEILING}" in " ".join(cells), cells

    header, row = markdown_cells(report, layer)
    at = header.index(f"{LABEL} over the run")
    assert row[at + 1:at + 3] == [expected, OUTPUT_CEILING], (header, row)

    header, row = html_cells(report, layer)
    at = header.index(f"{LABEL} now")
    assert row[at:at + 2] == [expected, OUTPUT_CEILING], (header, row)


@pytest.mark.parametrize("run", RUNS)
def test_watch_shows_the_output_logit_scale_beside_its_own_ceiling(data, run):
    """`watch`'s row of the newest pair, in the terminal and in the Markdown summary's rows: its output column
    is the head layer's value in the JSON, and its "base" the output logit scale's ceiling (no series)."""
    report = report_from_dict(data[run])
    newest = len(report.pairs) - 1
    expected = f"{three(json_value(data[run], head_layer(data[run])))} (L{head_layer(data[run])})"
    names, cells = columns(report, short=True), pair_cells(report, newest)
    at = names.index("output")
    assert cells[at:at + 2] == [expected, OUTPUT_CEILING], (names, cells)

    console = Console(width=120, record=True, color_system=None)
    print_rows(console, report, [newest], header=True)
    step = report.pairs[newest].to_step
    row = next(line for line in console.export_text().splitlines() if re.match(rf"\s+{step} ", line))
    assert f"{expected}     {OUTPUT_CEILING}" in row and len(row) <= 120, row

    table = markdown_rows(report, [newest]).splitlines()
    row = next(line for line in table if line.startswith(f"| {report.pairs[newest].to_step} |"))
    assert f"| {expected} | {OUTPUT_CEILING} |" in row, row


def test_a_layer_without_the_head_shows_no_value_and_no_ceiling(data):
    report = data["attention_fault"]
    layer = min(item["layer"] for item in report["pairs"][-1]["layers"])
    assert layer != head_layer(report)
    header, row = markdown_cells(report, layer)
    at = header.index(f"{LABEL} over the run")
    assert row[at + 1:at + 3] == ["–", "–"]


def test_the_attention_ceiling_is_never_beside_the_output_logit_scale(data):
    """The attention fault's alerts are about the attention logit scale's ceiling 2; the output column has its own."""
    report = data["attention_fault"]
    header, row = markdown_cells(report, head_layer(report))
    at = header.index(f"{LABEL} over the run")
    assert "ceiling 2" not in row[at + 2]
    assert "ceiling 2" in reference_text(None, report["thresholds"]["logit_scale_ceiling"])


def test_each_ceiling_is_the_one_detection_applies():
    thresholds = {"logit_scale_ceiling": 2.0, "logit_scale_width": 64, "output_logit_scale_ceiling": 9.0,
                  "output_shift_ceiling": 7.5, "qk_norm_logit_ceiling": 100.0, "delta2_entropy_norm_floor": 0.2}
    assert ceiling("output_logit_rms", thresholds, 4096) == 9.0
    assert ceiling("output_shift", thresholds, 64) == 7.5
    assert ceiling("qk_norm_logit_bound", thresholds, 64) == 100.0
    assert ceiling("logit_scale", thresholds, 64) == 2.0
    assert ceiling("logit_scale", thresholds, 256) == pytest.approx(4.0, rel=1e-15)  # 2 · √(256 / 64)
    # Already at its width (a report's thresholds after at_width): applied once only.
    assert ceiling("logit_scale", {**thresholds, "logit_scale_ceiling": 4.0, "logit_scale_width": 256}, 256) == 4.0
    assert ceiling("delta2_entropy_norm", thresholds, 64) is None
    # A report from before the width scaling (no logit_scale_width): its ceiling as it was applied.
    older = {k: v for k, v in thresholds.items() if k != "logit_scale_width"}
    assert ceiling("logit_scale", older, 256) == 2.0
    assert reference_text(0.482, None) == "0.482" and reference_text(None, None) == "–"
