"""The live report file, rewritten at each monitored step without
re-serialising the whole run each time.

A live report grows by one pair per monitored step, and an old pair's JSON
(its per-head metrics above all) does not change: the metrics are fixed once
computed, and the series rules judge each point from earlier points only.
So each pair's JSON text is kept and reused while the parts that judging
writes (statuses, findings, judgements) are unchanged; a pair whose
judgement did change (a lone first pair, judged like `diff`, becomes
warm-up) is serialised again, and so, under per_head "newest" (or
"flagged+newest"), is the pair that was the newest. The file is byte-for-byte what
`report_json(report, per_head)` gives (tested), written atomically. A long
report (past `parts.PARTS_LAYERS` layer results) is written as `--json`
writes it, schema 2, each monitored step appending its new pair.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from ckptscan.system.atomic import write_atomic
from ckptscan.errors import CkptScanError
from ckptscan.document import parts
from ckptscan.document.plain import check_per_head, plain_pair, report_dict
from ckptscan.document.writing import compact, report_json
from ckptscan.schema.results import PairResult, ScanReport

# report_json's layout: indent 2, pairs one level down (a long report: no indentation).
INDENT = 2


class ReportFile:
    def __init__(self, path: Path, per_head: str = "all"):
        check_per_head(per_head)
        self.path, self.per_head = path, per_head
        # (the pair, what judging wrote in it, its JSON text). The same pair object is not
        # compared again: a judged pair is never judged again in place (`SeriesJudge`), so
        # a write costs nothing per old pair but joining its text.
        self._pairs: list[tuple[PairResult | None, Any, str]] = []
        self._compact = False  # report_json's layout of the texts kept (`document.writing.compact`)
        self._newest: int | None = None  # under per_head "newest" (or "flagged+newest"): the pair written as the newest

    def write(self, report: ScanReport) -> None:
        try:
            if parts.uses_parts(report, self.path):
                # Long: schema 2, as `--json` writes it; each step appends its new pair.
                parts.write_parts(report, self.path, self.per_head)
                return
            write_atomic(self.path, self.text(report))
        except OSError as e:
            raise CkptScanError(f"cannot write the JSON report: {e.strerror or e}", path=self.path) from None

    def text(self, report: ScanReport) -> str:
        if compact(report, self.per_head) != self._compact:
            self._pairs, self._compact, self._newest = [], compact(report, self.per_head), None
        del self._pairs[len(report.pairs):]
        newest = len(report.pairs) - 1
        if self.per_head in ("newest", "flagged+newest") and self._newest != newest:
            # The pair written as the newest loses its heads, the newest gains them.
            for i in (self._newest, newest):
                if i is not None and i < len(self._pairs):
                    self._pairs[i] = (None, self._pairs[i][1], "")
            self._newest = newest
        for i, pair in enumerate(report.pairs):
            if i < len(self._pairs) and self._pairs[i][0] is pair:
                continue
            judged = _judged(pair)
            if i == len(self._pairs):
                self._pairs.append((pair, judged, self._pair_text(report, i)))
            elif self._pairs[i][0] is None or self._pairs[i][1] != judged:
                self._pairs[i] = (pair, judged, self._pair_text(report, i))
        fields = report_dict(dataclasses.replace(report, pairs=[]), self.per_head)
        if self._compact:
            head, empty = json.dumps(fields, separators=(",", ":"), allow_nan=False), '"pairs":[]'
            pairs = "[" + ",".join(text for _, _, text in self._pairs) + "]"
        else:
            head, empty = json.dumps(fields, indent=INDENT, allow_nan=False), '"pairs": []'
            pad = "\n" + " " * (2 * INDENT)
            pairs = "[" + pad + ("," + pad).join(text for _, _, text in self._pairs) + "\n" + " " * INDENT + "]"
        if not self._pairs or head.count(empty) != 1:  # nothing to splice, or nowhere unambiguous to
            return report_json(report, self.per_head)
        return head.replace(empty, '"pairs":' + ("" if self._compact else " ") + pairs) + "\n"

    def _pair_text(self, report: ScanReport, index: int) -> str:
        """Pair `index` as report_json writes it inside the pairs list (two levels deep)."""
        plain = plain_pair(report.pairs[index], self.per_head, index == len(report.pairs) - 1)
        if self._compact:
            return json.dumps(plain, separators=(",", ":"), allow_nan=False)
        text = json.dumps(plain, indent=INDENT, allow_nan=False)
        return text.replace("\n", "\n" + " " * (2 * INDENT))


def report_due(written: tuple[int, str] | None, pairs: int, verdict: str, alerted: bool, spacing: int) -> bool:
    """Whether the report file is rewritten now (`live/monitor.py`'s module
    docstring): `written`, the (pairs, verdict) of the file as it is; `pairs`
    and `verdict`, the report's now. Geometric spacing makes the rewrites of a
    run of N pairs cost O(N · spacing) pair texts in all: a constant per pair."""
    if written is None or alerted:
        return True
    in_file, verdict_in_file = written
    return verdict != verdict_in_file or pairs - in_file >= max(1, in_file // spacing)


def _judged(pair: PairResult) -> tuple:
    """What `judge` writes into a pair; everything else in it is a metric."""
    return (pair.status, pair.loss,
            tuple((layer.status, tuple(layer.findings), tuple(sorted(layer.judgements.items())))
                  for layer in pair.layers))
