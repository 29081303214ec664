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
from ckptscan.report.json import report_dict, report_json
from ckptscan.results import PairResult, ScanReport

# report_json's layout: indent 2, pairs one level down.
INDENT = 2


class ReportFile:
    def __init__(self, path: Path):
        self.path = path
        self._pairs: list[tuple[Any, str]] = []  # (what judging wrote, the pair's JSON text)

    def write(self, report: ScanReport) -> None:
        try:
            write_atomic(self.path, self.text(report))
        except OSError as e:
            raise CkptScanError(f"cannot write the JSON report: {e.strerror or e}", path=self.path) from None

    def text(self, report: ScanReport) -> str:
        del self._pairs[len(report.pairs):]
        for i, pair in enumerate(report.pairs):
            judged = _judged(pair)
            if i == len(self._pairs):
                self._pairs.append((judged, _pair_text(report, pair)))
            elif self._pairs[i][0] != judged:
                self._pairs[i] = (judged, _pair_text(report, pair))
        head = json.dumps(report_dict(dataclasses.replace(report, pairs=[])), indent=INDENT, allow_nan=False)
        empty = '"pairs": []'
        if not self._pairs or head.count(empty) != 1:  # nothing to splice, or nowhere unambiguous to
            return report_json(report)
        pad = "\n" + " " * (2 * INDENT)
        pairs = "[" + pad + ("," + pad).join(text for _, text in self._pairs) + "\n" + " " * INDENT + "]"
        return head.replace(empty, '"pairs": ' + pairs) + "\n"


def _judged(pair: PairResult) -> tuple:
    """What `judge` writes into a pair; everything else in it is a metric."""
    return (pair.status, pair.loss,
            tuple((layer.status, tuple(layer.findings), tuple(sorted(layer.judgements.items())))
                  for layer in pair.layers))


def _pair_text(report: ScanReport, pair: PairResult) -> str:
    """The pair as report_json writes it inside the pairs list (two levels deep)."""
    plain = report_dict(dataclasses.replace(report, pairs=[pair], checkpoints=[]))["pairs"][0]
    text = json.dumps(plain, indent=INDENT, allow_nan=False)
    return text.replace("\n", "\n" + " " * (2 * INDENT))
