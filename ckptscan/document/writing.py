"""Writing a JSON report: the versioned, stable schema users' CI scripts parse.

The document is `plain.report_dict`; here it becomes a file. Non-finite
floats never reach the file (JSON has no NaN): they become null, and the
rule that saw them has already recorded a finding. Files are written
through `ckptscan.system.output`: atomically to a file, so a reader never
sees half a report, and straight through to a pipe, a device or stdout
(`-`). A long report to a file is schema 2 (`parts.py`). The flow is one
way: this module calls `parts` and `plain`, `parts` calls `plain` and
`columns`, and none calls back.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from ckptscan.document import parts
from ckptscan.document.plain import check_per_head, keeps_heads, report_dict
from ckptscan.errors import CkptScanError
from ckptscan.schema.results import ScanReport
from ckptscan.system.output import write_output


# A report writing more layer and per-head results than this (a 16-layer
# run past ~120 pairs, an 80-layer, 64-head diff) is written without
# indentation: the same keys, 40 % fewer bytes, and json's C encoder, which
# cannot indent, instead of its Python one (10x slower; docs/json-schema.md).
COMPACT_RESULTS = 2_000


def compact(report: ScanReport, per_head: str = "all") -> bool:
    """Whether the report is long enough to be written without indentation:
    more than COMPACT_RESULTS layer and per-head results written."""
    results, newest = 0, len(report.pairs) - 1
    for index, pair in enumerate(report.pairs):
        for layer in pair.layers:
            results += 1
            if layer.attention is not None and keeps_heads(per_head, layer.status, index == newest):
                results += len(layer.attention.heads)
        if results > COMPACT_RESULTS:
            return True
    return False


def report_json(report: ScanReport, per_head: str = "all") -> str:
    data = report_dict(report, per_head)
    if compact(report, per_head):
        return json.dumps(data, separators=(",", ":"), allow_nan=False) + "\n"
    # The indenting encoder is Python's own (the C one cannot indent), 10x slower: for short reports only.
    return json.dumps(data, indent=2, allow_nan=False) + "\n"


def write_json(report: ScanReport, path: str | Path, per_head: str = "all") -> None:
    """The report to `path` (see the module docstring); gzip-compressed when
    the path ends in .gz (`load_report` reads either). A long report to a
    file is schema 2, its pairs in a file beside it that a re-run of the
    same run appends to (`parts.py`); a short one, or one to stdout,
    a pipe or a device, is schema 1."""
    check_per_head(per_head)
    try:
        if str(path) != "-" and parts.uses_parts(report, Path(path)):
            parts.write_parts(report, Path(path), per_head)
            return
        text = report_json(report, per_head)
        write_output(path, gzip.compress(text.encode(), 6, mtime=0) if str(path).endswith(".gz") else text)
    except OSError as e:
        raise CkptScanError(f"cannot write the JSON report: {e.strerror or e}", path=path) from None
    if str(path) != "-" and Path(path).is_file():
        parts.remove_stale_parts(Path(path))  # those of a schema-2 report this one replaced
