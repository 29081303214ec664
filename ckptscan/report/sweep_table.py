"""The terminal table of a sweep (`ckptscan compare`, `ckptscan trend SWEEP/`):
the runs ranked healthiest first, each with its status, first alert and family."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console, JustifyMethod
from rich.table import Table
from rich.text import Text

from ckptscan.document.sweep import sweep_message
from ckptscan.report.table import STATUS_STYLE, print_model

if TYPE_CHECKING:
    from ckptscan.schema.results import SweepReport


def print_sweep(console: Console, sweep: SweepReport) -> None:
    first = sweep.runs[0].report
    print_model(console, dataclasses.replace(first, probe=None))  # each run has its own probe
    others = len(sweep.runs) - 1
    against = "the other run" if others == 1 else f"the band of the other {others}"
    if sweep.left_out:
        against = "the band of the others, less those that alert against all the rest"
    table = Table(title=f"{len(sweep.runs)} runs, each judged against {against}", title_justify="left",
                  header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    columns: list[tuple[str, JustifyMethod]] = [("rank", "right"), ("run", "left"), ("steps", "left"),
                                                ("status", "left"), ("first alert", "right"), ("family", "left")]
    if sweep.left_out:
        columns.append(("against", "right"))
    for name, justify in columns:
        table.add_column(name, justify=justify, no_wrap=True)
    for run in sweep.runs:
        steps = [c.step for c in run.report.checkpoints if c.step is not None]
        span = f"{min(steps)}–{max(steps)}" if steps else "–"
        alert = str(run.first_alert_step) if run.first_alert_step is not None else "–"
        references = [str(len(run.references))] if sweep.left_out else []
        table.add_row(str(run.rank), run.path, span, Text(run.status, style=STATUS_STYLE.get(run.status, "")), alert,
                      run.family or "–", *references)
    console.print(table)
    for note in sweep.notes:
        console.print(Text(f"note: {note}", style="dim"))
    console.print(Text(sweep_message(sweep), style=STATUS_STYLE.get(sweep.status, "")))
