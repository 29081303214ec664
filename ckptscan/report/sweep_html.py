"""One self-contained HTML page of a sweep report (`ckptscan compare RUN… --html`,
`ckptscan trend SWEEP/ --html`, `ckptscan report SWEEP.json --html`).

Sections: the verdict (worst run, how many reached each status), the
ranking (healthiest first: each run's status, first alert and warning, the
family, what it was judged against), the notes (how the runs were aligned,
runs left out of the others' bands), then each run's own verdict and what it
rests on. It renders the sweep's JSON dict (`document.sweep.sweep_dict`), so a
sweep just judged and one read back from its file give the same bytes. No
figures: each run's own figures are its trend report's (`trend RUN --html`).
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from ckptscan.errors import CkptScanError
from ckptscan.system.output import write_output
from ckptscan.report.html_page import page_head
from ckptscan.schema.results import status_word


def sweep_page(data: dict[str, Any]) -> str:
    """The page of a sweep report dict (`"command": "compare"`)."""
    summary, runs = data.get("summary", {}), data.get("runs", [])
    status = str(summary.get("status", ""))
    rows = "\n".join(_row("td", (
        run.get("rank"), run.get("path"), run.get("status"), _step(run.get("first_alert_step")),
        _step(run.get("first_warn_step")), run.get("family") or "–", ", ".join(run.get("references", [])) or "–"))
        for run in runs)
    header = _row("th", ("rank", "run", "status", "first alert", "first warning", "family", "judged against"))
    notes = sweep_notes(data)
    verdicts = "\n".join(
        f"<dt>{_e(run.get('path'))}</dt><dd>{_e(_verdict(run.get('report', {})))}</dd>" for run in runs)
    parts = [
        *page_head(f"ckptscan sweep of {len(runs)} runs — {status_word(status)}"),
        "<body>",
        "<header>",
        f'<h1>ckptscan sweep <span class="badge {_e(status)}">{_e(status_word(status))}</span></h1>',
        f'<p class="message {_e(status)}">{_e(summary.get("message", status))}</p>',
        "</header>",
        '<section id="ranking">\n<h2>Runs, healthiest first</h2>',
        f"<table>\n<thead>{header}</thead>\n<tbody>\n{rows}\n</tbody>\n</table>\n</section>",
        '<section id="notes">\n<h2>Notes</h2>',
        ("<ul>\n" + "\n".join(f"<li>{_e(note)}</li>" for note in notes) + "\n</ul>") if notes else "<p>None.</p>",
        "</section>",
        '<section id="runs">\n<h2>Each run\'s verdict against the others</h2>',
        f"<dl>\n{verdicts}\n</dl>\n</section>",
        f"<footer>ckptscan {_e(data.get('tool', {}).get('version', '?'))}, JSON report schema "
        f"{_e(data.get('schema_version'))}.</footer>",
        "</body>",
        "</html>",
    ]
    return "\n".join(parts) + "\n"


def sweep_notes(data: dict[str, Any]) -> list[str]:
    """The sweep's notes, each once, and a line for each run left out of the
    others' bands that no note already names as left out (reports written
    before the notes named them)."""
    notes = list(dict.fromkeys(data.get("notes", [])))
    named = " ".join(note for note in notes if "left out of the others' bands" in note)
    return notes + [f"left out of the others' bands: {run}" for run in data.get("left_out", [])
                    if str(run) not in named]


def write_sweep_html(data: dict[str, Any], path: str | Path) -> None:
    try:
        write_output(path, sweep_page(data))
    except OSError as e:
        raise CkptScanError(f"cannot write the report: {e.strerror or e}", path=path) from None


def _verdict(report: dict[str, Any]) -> str:
    """A run's verdict and what it rests on."""
    summary = report.get("summary", {})
    judged = summary.get("judged_pairs")
    rests = f" ({judged} of {len(report.get('pairs', []))} pairs judged)" if judged is not None else ""
    return f"{summary.get('message', '')}{rests}"


# The ranking's columns of words (left-aligned); the others are numbers.
TEXT_COLUMNS = (1, 2, 5, 6)


def _row(tag: str, values: tuple[object, ...]) -> str:
    cells = "".join(f'<{tag} class="text">{_e(v)}</{tag}>' if k in TEXT_COLUMNS else f"<{tag}>{_e(v)}</{tag}>"
                    for k, v in enumerate(values))
    return f"<tr>{cells}</tr>"


def _step(step: object) -> object:
    return "–" if step is None else step


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)
