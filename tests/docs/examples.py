"""The examples of README.md and docs/**/*.md, as the docs test runs them.

Fenced blocks, by language:

- ``console``: lines starting with ``$ `` are commands (a line ending in ``\\``,
  or with a quote still open, continues on the next); the lines after a command, up to the next one, are
  its output (stdout and stderr together, as a terminal shows them). A command
  must exit 0 unless its comment says ``# exit N``.
- ``python``: a script, run as it stands; it must exit 0.
- ``pycon``: a doctest session (``>>>`` lines and their output).
- ``bash``, ``sh``, ``shell``: not allowed unless the line before the fence is
  ``*Not executed: needs X.*``, the marker that the rendered docs show too, or
  ``<!-- Not executed: needs X. -->``, the same marker hidden (the README, which
  GitHub shows to users, for whom the docs harness's words are noise).
  ``python`` blocks can carry the same marker. Everything else (toml, yaml,
  xml, text, an output block) is data, not an example.
- an indented code block (four spaces after a blank line, outside a fence) is
  reported with the language ``indented``: examples are fenced, so that they
  are run or marked.

Expected output is compared after normalising what depends on the machine:
runs of whitespace (terminal width and wrapping, table padding) count as one
space and a table's rule (a run of ─) counts as one ─, the session's
temporary directories read as in the docs (``~/.cache``
for the cache), and ``…`` in the expected output stands for any text (a line
of only ``…`` for any number of lines).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOT_EXECUTED = re.compile(r"^(?:\*Not executed: needs (?P<reason>.+?)\.\*|"
                          r"<!-- Not executed: needs (?P<hidden>.+?)\. -->)$")
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)\s*$")
SHELL = {"bash", "sh", "shell"}
EXIT = re.compile(r"#.*\bexit (\d+)\b")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    not_executed: str | None  # the reason given by the marker, when there is one

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


@dataclass(frozen=True)
class Command:
    command: str
    expected: str
    exit_code: int


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """Every fenced block of `path`, with the not-executed marker before it."""
    lines = path.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            if lines[i].startswith("    ") and lines[i].strip() and (i == 0 or not lines[i - 1].strip()):
                found.append(Block(path, i + 1, "indented", lines[i].strip(), None))
            i += 1
            continue
        indent, body, j = len(opening["indent"]), [], i + 1
        while j < len(lines) and not re.match(r"^ *```\s*$", lines[j]):
            body.append(lines[j][indent:])
            j += 1
        before = next((lines[k].strip() for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        marker = NOT_EXECUTED.match(before)
        reason = (marker["reason"] or marker["hidden"]) if marker else None
        found.append(Block(path, i + 1, opening["lang"], "\n".join(body), reason))
        i = j + 1
    return found


def commands(block: Block) -> list[Command]:
    """The commands of a console block with their expected output and exit code."""
    parsed: list[Command] = []
    lines = block.text.splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].startswith("$ "):
            raise ValueError(f"{block.where}: output before the first `$ ` command: {lines[i]!r}")
        command = lines[i][2:]
        while (command.endswith("\\") or not closed(command)) and i + 1 < len(lines):
            i += 1
            command += "\n" + lines[i]
        output = []
        i += 1
        while i < len(lines) and not lines[i].startswith("$ "):
            output.append(lines[i])
            i += 1
        code = EXIT.search(command)
        parsed.append(Command(command, "\n".join(output), int(code[1]) if code else 0))
    return parsed


def closed(command: str) -> bool:
    """Whether `command`'s quotes are all closed (else it goes on on the next line)."""
    try:
        shlex.split(command, comments=True)
    except ValueError:
        return False
    return True


def flat(text: str) -> str:
    """`text` without what the terminal's width decides: wrapping, padding, rule lengths."""
    return " ".join(re.sub("─+", "─", text).split())


def matches(expected: str, actual: str) -> bool:
    """`actual` is `expected` up to width, with `…` standing for any text."""
    pattern = r"\s*(?:.*?)\s*".join(re.escape(flat(piece)).replace(r"\ ", r"\s+") for piece in expected.split("…"))
    return re.fullmatch(pattern, flat(actual), flags=re.DOTALL) is not None
