"""The trend table (report/trend_table.py) stays one screen for long runs and
many layers, and never folds away a layer or a pair that warned or alerted;
what to do about an alert comes right after the rollback line."""

from rich.console import Console

from ckptscan.monitors.interventions import family_lines
from ckptscan.report.resume import terminal_lines
from ckptscan.report import trend_table
from ckptscan.report.table import STATUS_STYLE
from ckptscan.report.trend_table import FoldedLayers, print_trend, shown_layers, trend_table as table_of
from ckptscan.schema.results import Finding, LayerSummary, Summary

from detection.helpers import run_report

SCREEN_LINES = 60


def summaries(count, statuses):
    return [LayerSummary(n, statuses.get(n, "ok")) for n in range(count)]


def rows(shown):
    return [("folded", r.first, r.last, r.count) if isinstance(r, FoldedLayers) else r.layer for r in shown]


def test_a_model_up_to_the_limit_shows_every_layer():
    layers = summaries(trend_table.MAX_LAYER_ROWS, {})
    assert shown_layers(layers) == layers


def test_many_layers_fold_their_ok_runs_between_the_edges_and_keep_every_flagged_layer():
    layers = summaries(80, {10: "warn", 11: "alert", 13: "info", 50: "alert", 78: "warn"})
    assert rows(shown_layers(layers)) == [0, 1, 2, ("folded", 3, 9, 7), 10, 11, 12, 13, ("folded", 14, 49, 36), 50,
                                          ("folded", 51, 76, 26), 77, 78, 79]


def test_every_flagged_layer_is_shown_even_beyond_the_limit():
    flagged = {n: "alert" for n in range(0, 100, 2)}
    shown = rows(shown_layers(summaries(100, flagged)))
    assert [n for n in shown if isinstance(n, int) and n in flagged] == sorted(flagged)


def long_report(pairs=600, layers=48, collapsed=37, alert_pair=450, warned=()):
    """A run of `pairs` pairs over `layers` layers; one layer alerts at one
    pair only, the `warned` layers warn at their pair."""
    report = run_report(pairs, layers=layers)
    statuses = {n: "warn" for n in warned} | {collapsed: "alert"}
    for n, status, pair in [(collapsed, "alert", alert_pair)] + [(n, "warn", 100 + n) for n in warned]:
        result = report.pairs[pair].layers[n]
        result.findings.append(Finding("delta2_entropy_norm", "attention", status, 0.1, f"layer {n} fell"))
        result.status = status
    report.summary = Summary(
        "alert", sorted(statuses), {"attention": report.pairs[alert_pair].to_step},
        layers=[LayerSummary(n, statuses.get(n, "ok"),
                             first_alert_step=report.pairs[alert_pair].to_step if n == collapsed else None,
                             first_alert_family="attention" if n == collapsed else None,
                             first_warn_step=report.pairs[100 + n].to_step if n in warned else None)
                for n in range(layers)])
    return report


def printed(report, width=160):
    console = Console(width=width, record=True, color_system=None)
    print_trend(console, report)
    return console.export_text()


def test_a_long_run_with_many_layers_prints_one_screen_with_its_alert():
    report = long_report()
    text = printed(report)
    assert len(text.splitlines()) <= SCREEN_LINES
    assert "… 34 ok layers …" in text  # layers 3–36
    row = next(line for line in text.splitlines() if line.strip().startswith("37 "))
    assert "alert" in row and f"{report.pairs[450].to_step} attention" in row
    assert "layer 37 step" in text


def test_one_alerting_pair_among_hundreds_colours_its_sparkline_cell():
    report = long_report()
    table = table_of(report, width=160)
    shown = list(table.columns[0].cells)
    spark = list(table.columns[1].cells)[shown.index("37")]
    alarmed = [span for span in spark.spans if span.style == STATUS_STYLE["alert"]]
    assert len(alarmed) == 1 and alarmed[0].end - alarmed[0].start == 1
    # The cell holding pair 450 of 600 in a 30-cell line.
    assert alarmed[0].start == 450 * trend_table.SPARK_WIDTH // 600


def test_findings_are_detailed_for_the_earliest_flagged_layers_and_the_rest_counted():
    warned = tuple(range(10))
    text = printed(long_report(warned=warned))
    detailed = {int(line.split()[1]) for line in text.splitlines() if line.startswith("  layer ")}
    assert len(detailed) == trend_table.MAX_FINDING_LAYERS
    # The alerting layer first, then the earliest warnings (layer n warns at pair 100 + n).
    assert detailed == {37, *range(trend_table.MAX_FINDING_LAYERS - 1)}
    assert f"… and {len(warned) + 1 - trend_table.MAX_FINDING_LAYERS} more flagged layers" in text


def test_skipped_checkpoints_are_listed_up_to_a_few_lines():
    report = long_report(pairs=40, layers=4, collapsed=1, alert_pair=30)
    report.skipped = [{"path": f"run/checkpoint-{k}", "reason": "unreadable"} for k in range(12)]
    text = printed(report)
    assert text.count("skipped run/checkpoint-") == trend_table.MAX_SKIPPED_LINES
    assert f"… and {12 - trend_table.MAX_SKIPPED_LINES} more skipped checkpoints" in text


def test_what_to_do_follows_the_rollback_line(reports):
    lines = printed(reports["loss"], width=400).splitlines()
    rollback = next(i for i, line in enumerate(lines) if line.startswith("rollback candidate:"))
    # The resume plan's lines, indented, between them (report/resume.py).
    todo = rollback + len(terminal_lines(reports["loss"].summary))
    expected = [f"  what to do, {line}" for line in family_lines(reports["loss"].summary)]
    assert expected and [line.rstrip() for line in lines[todo: todo + len(expected)]] == expected


def test_a_healthy_run_has_nothing_to_do(reports):
    assert "what to do" not in printed(reports["healthy"])
