"""Schema 2 of the JSON report: a long report's pairs in an append-only file
beside it, so that a re-run writes only the pairs that are new.

`--json PATH` of a report with more than PARTS_LAYERS layer results, to a
regular file, writes two files (docs/json-schema.md):

* PATH, the document: every key of schema 1 but `pairs`, and `pairs`, an
  object: how many pairs, the newest pair (`newest`, rewritten at each
  run: it alone keeps its per-head results under `--per-head newest` or
  `flagged+newest`), and where the others are (`parts`);
* PATH.pairs-TOKEN, the parts: the other pairs, in chunks, each chunk one
  gzip member holding a JSON list of pairs as columns (`columns.py`).
  The document records each chunk's length and SHA-256 and the committed
  length of the file; a reader reads only that much.

A re-run whose report is the same run grown (same tool version, command,
model, settings, thresholds and probe — the `fingerprint` — and the same
pairs, judged alike, in front: `digest`) appends one chunk with the pairs
new since (the one that was the newest among them) and rewrites the
document; any other report writes new parts under a new TOKEN. Either way
the document is replaced atomically last: until then it names the parts and
the length it had, so a write cut short (Ctrl-C, a killed process, a full
disk) leaves the report as it was: the appended bytes past the committed
length are not read, and are cut off by the next append.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import secrets
from pathlib import Path
from typing import Any

from ckptscan import __version__
from ckptscan.system.atomic import write_atomic
from ckptscan.document import columns
from ckptscan.document.plain import plain_pair, report_dict
from ckptscan.schema.results import SCHEMA_VERSION, PairResult, ScanReport

PARTS_SCHEMA_VERSION = 2
ENCODING = "columns-gzip"
# A report with more layer results than this (a 16-layer run past 125 pairs,
# an 80-layer one past 25) written to a file is written as schema 2; a
# shorter one stays schema 1, one document (docs/json-schema.md).
PARTS_LAYERS = 2_000
GZIP_LEVEL = 6


def layer_results(report: ScanReport) -> int:
    return sum(len(pair.layers) for pair in report.pairs)


def uses_parts(report: ScanReport, path: Path) -> bool:
    """Whether `report` to `path` is written as schema 2: long, to a regular
    file or to a path that does not exist yet (never a pipe or a device)."""
    if layer_results(report) <= PARTS_LAYERS:
        return False
    try:
        return path.is_file() or not path.exists()
    except OSError:
        return False


def parts_name(path: Path, token: str) -> str:
    return f"{path.name}.pairs-{token}"


def write_parts(report: ScanReport, path: Path, per_head: str) -> None:
    """`report` to `path` as schema 2, appending to its parts where the file
    already holds this run's report up to some pair (see the module docstring).
    OSError propagates, the report at `path` left as it was."""
    # The document's every key but its pairs, made once: the fingerprint reads it, the commit writes it.
    head = report_dict(dataclasses.replace(report, pairs=[]), per_head)
    fingerprint = run_fingerprint(head, per_head)
    old = _previous(path, fingerprint)
    parted = report.pairs[:-1]
    if old is not None:
        done = old["count"]
        if done <= len(parted):
            before, digest = _digests(parted, done)
            if before == old["digest"]:
                _commit(report, head, path, per_head, fingerprint, parted, old, digest)
                return
    token = secrets.token_hex(4)
    fresh: dict[str, Any] = {"file": parts_name(path, token), "bytes": 0, "count": 0, "chunks": [],
                             "digest": _digests([], 0)[0]}
    (path.parent / fresh["file"]).parent.mkdir(parents=True, exist_ok=True)
    (path.parent / fresh["file"]).write_bytes(b"")
    try:
        _commit(report, head, path, per_head, fingerprint, parted, fresh, _digests(parted, 0)[1])
    except BaseException:
        (path.parent / fresh["file"]).unlink(missing_ok=True)
        raise
    remove_stale_parts(path, keep=fresh["file"])


def _commit(report: ScanReport, head: dict[str, Any], path: Path, per_head: str, fingerprint: str,
            parted: list[PairResult], parts: dict[str, Any], digest: str) -> None:
    """Append parted[parts.count:] to the parts as one chunk (if any), then
    replace the document (`head` with its pairs), which commits it. `digest`:
    `_digests(parted, …)[1]`."""
    new = parted[parts["count"]:]
    chunks, committed = list(parts["chunks"]), parts["bytes"]
    if new:
        chunk = gzip.compress(_chunk_text(new, per_head).encode(), GZIP_LEVEL, mtime=0)
        _append(path.parent / parts["file"], committed, chunk)
        chunks.append([len(new), len(chunk), hashlib.sha256(chunk).hexdigest()])
        committed += len(chunk)
    document = dict(head)
    document["schema_version"] = PARTS_SCHEMA_VERSION
    document["pairs"] = {
        "count": len(report.pairs),
        "encoding": ENCODING,
        "fingerprint": fingerprint,
        "newest": columns.encode([plain_pair(report.pairs[-1], per_head, True)]),
        "parts": {"file": parts["file"], "bytes": committed, "count": len(parted), "chunks": chunks,
                  "digest": digest},
    }
    text = json.dumps(document, separators=(",", ":"), allow_nan=False) + "\n"
    write_atomic(path, gzip.compress(text.encode(), GZIP_LEVEL, mtime=0) if path.name.endswith(".gz") else text)


def _append(file: Path, committed: int, chunk: bytes) -> None:
    """`chunk` at `committed` in `file`, on disk before the document names it."""
    with open(file, "r+b") as f:
        f.truncate(committed)  # what a write cut short left past the committed length
        f.seek(committed)
        f.write(chunk)
        f.flush()
        os.fsync(f.fileno())


def _chunk_text(pairs: list[PairResult], per_head: str) -> str:
    return json.dumps(columns.encode([plain_pair(pair, per_head, False) for pair in pairs]),
                      separators=(",", ":"), allow_nan=False)


def run_fingerprint(head: dict[str, Any], per_head: str) -> str:
    """What makes two reports the same run judged alike, but for its pairs:
    the tool's version, the command, the model, the settings (`--per-head`
    among them), the thresholds and the probe. `head`: the report's document
    (`report_dict`), whose pairs it does not read."""
    same = {"tool": __version__, "encoding": ENCODING, "command": head["command"], "per_head": per_head,
            **{name: head[name] for name in ("model", "settings", "thresholds", "probe")}}
    return hashlib.sha256(json.dumps(same, sort_keys=True, allow_nan=False).encode()).hexdigest()


def _digests(pairs: list[PairResult], at: int) -> tuple[str, str]:
    """The digest of `pairs[:at]` and of `pairs`, in one pass: the pairs as
    far as a re-run could change them: their steps, loss and learning rate,
    what judging decided (each layer's status and findings) and each layer's
    headline Δ2 entropy (a metric computed otherwise). Judgements are left
    out: they follow from the same points as the statuses, and are most of a
    pair's repr (a re-run at 2,000 pairs would spend a second on them)."""
    h = hashlib.sha256()
    before = h.hexdigest() if at == 0 else ""
    for index, pair in enumerate(pairs, 1):
        h.update(repr((pair.from_step, pair.to_step, pair.status, pair.loss, pair.lr,
                       [(layer.layer, layer.status, layer.findings,
                         layer.attention.delta2_entropy if layer.attention is not None else None)
                        for layer in pair.layers])).encode())
        if index == at:
            before = h.hexdigest()  # the hash goes on: hexdigest does not end it
    return before, h.hexdigest()


def _previous(path: Path, fingerprint: str) -> dict[str, Any] | None:
    """The parts of the schema-2 report at `path` if it is this run's and its
    parts file is there, whole up to its committed length; else None."""
    try:
        raw = path.read_bytes()
        document = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
        pairs = document["pairs"]
        if document.get("schema_version") != PARTS_SCHEMA_VERSION or pairs.get("fingerprint") != fingerprint:
            return None
        parts = pairs["parts"]
        if Path(parts["file"]).name != parts["file"] or not parts["file"].startswith(f"{path.name}.pairs-"):
            return None
        if (path.parent / parts["file"]).stat().st_size < parts["bytes"]:
            return None
        return {"file": parts["file"], "bytes": int(parts["bytes"]), "count": int(parts["count"]),
                "chunks": list(parts["chunks"]), "digest": parts["digest"]}
    except (OSError, ValueError, KeyError, TypeError, AttributeError, EOFError):
        return None


def remove_stale_parts(path: Path, keep: str | None = None) -> None:
    """Remove the parts files of `path` other than `keep` (a report written
    whole since, or cut short before it named them); best effort."""
    try:
        stale = [p for p in path.parent.glob(f"{_glob_escape(path.name)}.pairs-*") if p.name != keep]
    except OSError:
        return
    for p in stale:
        try:
            p.unlink()
        except OSError:
            pass


def _glob_escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def expand(document: dict[str, Any], path: Path | Any) -> dict[str, Any]:
    """A schema-2 document with its pairs read back: the dict its schema-1
    file would hold (`pairs` a list, `schema_version` 1), so that `ckptscan
    report FILE --html` draws what `trend --html` drew. `path`: the
    document's (a local path or a RemotePath); raises ValueError where the
    parts are missing, cut or not the ones the document names, OSError
    where they cannot be read."""
    pairs = [pair for column in pair_columns(document, path) for pair in columns.decode(column)]
    return {**document, "schema_version": SCHEMA_VERSION, "pairs": pairs}


def pair_columns(document: dict[str, Any], path: Path | Any) -> list[dict[str, Any]]:
    """The columns of a schema-2 document's pairs, in order: each chunk of
    its parts file, checked against the document, then the newest pair."""
    pairs = document["pairs"]
    if pairs.get("encoding") != ENCODING:
        raise ValueError(f"unknown pairs encoding {pairs.get('encoding')!r}")
    parts = pairs["parts"]
    name = parts["file"]
    if not isinstance(name, str) or "/" in name or "\\" in name or name in ("", ".", ".."):
        raise ValueError(f"bad parts file name {name!r}")
    raw = (path.parent / name).read_bytes()[:parts["bytes"]]  # FileNotFoundError: the caller reads the document again
    if len(raw) < parts["bytes"]:
        raise ValueError(f"its pairs file {name} is cut short ({len(raw)} of {parts['bytes']} bytes)")
    found: list[dict[str, Any]] = []
    start, total = 0, 0
    for count, size, sha in parts["chunks"]:
        chunk = raw[start:start + size]
        start += size
        if hashlib.sha256(chunk).hexdigest() != sha:
            raise ValueError(f"its pairs file {name} does not hold the pairs it names (a chunk differs)")
        column = json.loads(gzip.decompress(chunk))
        if _rows(column) != count:
            raise ValueError(f"a chunk of {name} holds {_rows(column)} pairs, not {count}")
        found.append(column)
        total += count
    found.append(pairs["newest"])
    if total + _rows(pairs["newest"]) != pairs["count"]:
        raise ValueError(f"it names {pairs['count']} pairs and holds {total + _rows(pairs['newest'])}")
    return found


def _rows(column: dict[str, Any]) -> int:
    """How many pairs a column of pairs holds (a table of them, or a raw list)."""
    return int(column["n"]) if "obj" in column else len(columns.decode(column))
