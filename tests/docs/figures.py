"""The numbers README.md and docs/**/*.md quote about the sample runs, as the figures test reads them.

A number the tool prints about `sample_checkpoints/` is bound to a fact of
docs/figures.json (written by scripts/docs_figures.py) by a marker right before
it, which neither GitHub nor MkDocs shows:

    the first alert at step <!-- fig: attention_fault.first_alert -->1400

An integer fact must be the number; a decimal one, rounded to the decimals the
page shows. Code blocks are left out (tests/docs/test_examples.py runs them),
and so are inline code spans (paths, commands).

The scan for unbound numbers: a step number (an integer of 3 to 5 digits that
is not a size, a time, a year, a share or a version) in a sentence about the
sample runs (one naming a sample run — `healthy` in backticks, the faulty ones
by their names —, `sample_checkpoints`, "sample run(s)" or the demo, and every
sentence of docs/sample-runs.md) must be bound, or the sentence says it is not
the tool's output with `<!-- not a figure: WHY -->` (the step a fault was
injected at, the pairs a sentence names).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from docs.examples import ROOT, documents

MARKER = re.compile(r"<!--\s*fig:\s*(?P<key>[\w.]+)\s*-->(?P<number>-?\d+(?:\.\d+)?)")
NOT_A_FIGURE = re.compile(r"<!--\s*not a figure:\s*(?P<why>\S[^>]*?)\s*-->")
ABOUT_SAMPLE_RUNS = re.compile(
    r"\b(?:attention_fault|router_fault|both_faults|silent_fault)\b|`healthy`|sample_checkpoints|"
    r"sample runs?\b|\bthe demo\b|make demo", re.I)
PAGES_ABOUT_SAMPLE_RUNS = {"docs/sample-runs.md"}
# An integer that could be a step: 3 to 5 digits, not part of a decimal, a word, a range of sizes or times.
STEP = re.compile(r"(?<![\w.,/#×-])(?P<number>\d{3,5})"
                  r"(?![\w.,]\d|\d|\s*(?:%|×|MB|GB|KB|MiB|GiB|ms|s\b|nats|tokens|columns|lines|characters))")
YEAR = re.compile(r"^(?:19|20)\d\d$")
LIST_ITEM = re.compile(r"^ *(?:[-*]|\d+\.) ")


@dataclass(frozen=True)
class Unit:
    """A paragraph of prose, an item of a list or a row of a table, with the line it starts on."""

    path: Path
    line: int
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def prose(path: Path) -> list[Unit]:
    """`path`'s paragraphs, list items, headings and table rows, without its fenced code blocks."""
    units: list[Unit] = []
    lines = path.read_text().splitlines()
    paragraph: list[str] = []
    start, fenced = 0, False

    def flush() -> None:
        if paragraph:
            units.append(Unit(path, start + 1, "\n".join(paragraph)))
            paragraph.clear()

    for i, line in enumerate(lines):
        if re.match(r"^ *```", line):
            flush()
            fenced = not fenced
            continue
        if fenced:
            continue
        if not line.strip() or line.lstrip().startswith(("|", "#")):
            flush()
            if line.strip():
                units.append(Unit(path, i + 1, line))
            continue
        if LIST_ITEM.match(line):  # each item of a list is a sentence of its own
            flush()
        if not paragraph:
            start = i
        paragraph.append(line)
    flush()
    return units


def bindings(unit: Unit) -> list[tuple[str, str]]:
    """(fact, number as written) for each marker of `unit`."""
    return [(m["key"], m["number"]) for m in MARKER.finditer(unit.text)]


def about_sample_runs(unit: Unit) -> bool:
    return str(unit.path.relative_to(ROOT)) in PAGES_ABOUT_SAMPLE_RUNS or bool(ABOUT_SAMPLE_RUNS.search(unit.text))


def unbound_steps(unit: Unit) -> list[str]:
    """The step numbers of a sentence about the sample runs that no marker binds."""
    if not about_sample_runs(unit) or NOT_A_FIGURE.search(unit.text):
        return []
    text = MARKER.sub(" ", unit.text)  # a bound number is accounted for
    text = re.sub(r"`[^`]*`", " ", text)  # paths, commands, tensor names
    text = re.sub(r"\]\([^)]*\)|arXiv:\S+|#\d+|issue #?\d+", " ", text)  # links, papers, issues
    return [m["number"] for m in STEP.finditer(text) if not YEAR.match(m["number"])]


def agrees(number: str, fact: object) -> bool:
    """Whether a page's `number` is `fact` as the page writes it (a decimal: to the page's decimals)."""
    if isinstance(fact, bool) or not isinstance(fact, (int, float)):
        return False
    if "." not in number:
        return isinstance(fact, int) and int(number) == fact
    return f"{fact:.{len(number.split('.')[1])}f}" == number


def all_units() -> list[Unit]:
    return [unit for path in documents() if path.name != "cli.md" for unit in prose(path)]
