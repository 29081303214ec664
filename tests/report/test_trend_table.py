"""The terminal rendering of a run (report/trend_table.py): what to do about
the alert, right after the rollback line."""

import io

from rich.console import Console

from ckptscan.interventions import family_lines
from ckptscan.report.trend_table import print_trend


def printed(report):
    """The printed lines, unwrapped."""
    out = io.StringIO()
    print_trend(Console(file=out, width=400, color_system=None), report)
    return out.getvalue().splitlines()


def test_what_to_do_follows_the_rollback_line(reports):
    lines = printed(reports["loss"])
    rollback = next(i for i, line in enumerate(lines) if line.startswith("rollback candidate:"))
    expected = [f"  what to do, {line}" for line in family_lines(reports["loss"].summary)]
    assert expected and lines[rollback + 1: rollback + 1 + len(expected)] == expected


def test_a_healthy_run_has_nothing_to_do(reports):
    assert not any("what to do" in line for line in printed(reports["healthy"]))
