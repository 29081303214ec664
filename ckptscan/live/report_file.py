"""The live report file, rewritten at each monitored step without
re-serialising the whole run each time.

A live report grows by one pair per monitored step, and an old pair's JSON
(its per-head metrics above all) does not change: the metrics are fixed once
computed, and the series rules judge each point from earlier points only.
So each pair's JSON text is kept and reused while the parts that judging
writes (statuses, findings, judgements) are unchanged; a pair whose
judgement did change (a lone first pair, judged like `diff`, becomes
warm-up) is serialised again. The file is byte-for-byte what
`report_json(report)` gives (tested), written atomically.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from ckptscan.atomic import write_atomic
from ckptscan.errors import CkptScanError
from ckptscan.report.json import compact, report_dict, report_json
from ckptscan.results import PairResult, ScanReport

# report_json's layout: indent 2, pairs one level down (a long report: no indentation).
INDENT = 2


class ReportFile:
    def __init__(self, path: Path):
        self.path = path
        # (the pair, what judging wrote in it, its JSON text). The same pair object is not
        # compared again: a judged pair is never judged again in place (`SeriesJudge`), so
        # a write costs nothing per old pair but joining its text.
        self._pairs: list[tuple[PairResult, Any, str]] = []
        self._compact = False  # report_json's layout of the texts kept (`report.json.compact`)

    def write(self, report: ScanReport) -> None:
        try:
            write_atomic(self.path, self.text(report))
        except OSError as e:
            raise CkptScanError(f"cannot write the JSON report: {e.strerror or e}", path=self.path) from None

    def text(self, report: ScanReport) -> str:
        if compact(report) != self._compact:
            self._pairs, self._compact = [], compact(report)
        del self._pairs[len(report.pairs):]
        for i, pair in enumerate(report.pairs):
            if i < len(self._pairs) and self._pairs[i][0] is pair:
                continue
            judged = _judged(pair)
            if i == len(self._pairs):
                self._pairs.append((pair, judged, _pair_text(report, pair, self._compact)))
            elif self._pairs[i][1] != judged:
                self._pairs[i] = (pair, judged, _pair_text(report, pair, self._compact))
        head = report_dict(dataclasses.replace(report, pairs=[]))
        if self._compact:
            head, empty = json.dumps(head, separators=(",", ":"), allow_nan=False), '"pairs":[]'
            pairs = "[" + ",".join(text for _, _, text in self._pairs) + "]"
        else:
            head, empty = json.dumps(head, indent=INDENT, allow_nan=False), '"pairs": []'
            pad = "\n" + " " * (2 * INDENT)
            pairs = "[" + pad + ("," + pad).join(text for _, _, text in self._pairs) + "\n" + " " * INDENT + "]"
        if not self._pairs or head.count(empty) != 1:  # nothing to splice, or nowhere unambiguous to
            return report_json(report)
        return head.replace(empty, '"pairs":' + ("" if self._compact else " ") + pairs) + "\n"


def _judged(pair: PairResult) -> tuple:
    """What `judge` writes into a pair; everything else in it is a metric."""
    return (pair.status, pair.loss,
            tuple((layer.status, tuple(layer.findings), tuple(sorted(layer.judgements.items())))
                  for layer in pair.layers))


def _pair_text(report: ScanReport, pair: PairResult, compact: bool) -> str:
    """The pair as report_json writes it inside the pairs list (two levels deep)."""
    plain = report_dict(dataclasses.replace(report, pairs=[pair], checkpoints=[]))["pairs"][0]
    if compact:
        return json.dumps(plain, separators=(",", ":"), allow_nan=False)
    text = json.dumps(plain, indent=INDENT, allow_nan=False)
    return text.replace("\n", "\n" + " " * (2 * INDENT))
