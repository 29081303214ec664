"""The judged-pair cache: each judged pair (findings, statuses, judgements)
and the judge state after the newest, beside the pair cache (`ckptscan.caches.pair_cache`).

A pair's judgement depends on everything before it, so it is filed under
everything it depends on (the pairs before it, the thresholds, the reference
run, the detection code): a re-run after one new checkpoint computes one
pair and judges one pair, and changed thresholds judge every pair afresh.
It lives apart from the pair cache because it needs detection, which the
metrics' cache must not. Like the pair cache, it keeps a run's judged pairs
together too, in one file a run and basis (`<dir>/judged-packs/`,
`caches/packs.py`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import operator
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ckptscan
from ckptscan.caches import tables
from ckptscan.caches.packs import PackError, common_prefix, pack_due, read_pack, write_pack
from ckptscan.caches.pair_cache import digest, tool_fingerprint
from ckptscan.detection.judge import Metrics, SeriesJudge, effective_thresholds
from ckptscan.detection.state import JudgeState
from ckptscan.detection.thresholds import Thresholds
from ckptscan.errors import CkptScanError
from ckptscan.monitors import registry
from ckptscan.system.collector import collector_paused
from ckptscan.system.output import write_output
from ckptscan.schema.results import Finding, LayerResult, PairResult, ScanReport, SeriesPoint, from_dict

JUDGE_FORMAT = 1
# Modules whose code decides a judgement besides the families' declarations,
# which the registry names (`_judge_sources`).
_JUDGE_SOURCES = ("detection", "schema/results.py", "monitors/spec.py", "monitors/registry.py",
                  "monitors/interventions.py")


_LAYER_VALUES = operator.attrgetter(*(f.name for f in dataclasses.fields(LayerResult)))
_STATUS, _FINDINGS, _JUDGEMENTS = ([f.name for f in dataclasses.fields(LayerResult)].index(name)
                                   for name in ("status", "findings", "judgements"))


@dataclass(slots=True)
class LayerJudgement:
    """What judging writes into a layer."""

    status: str
    findings: list[Finding]
    judgements: dict[str, SeriesPoint]


@dataclass(slots=True)
class PairJudgement:
    """What judging writes into a pair: a judged pair's entry in the cache."""

    status: str
    not_judged_reason: str | None
    layers: list[LayerJudgement]


def _code() -> dict[str, Any]:
    """What of the code decides a judgement: its sources and the families registered (with the source of
    those declared outside ckptscan, a test's)."""
    inside, outside = _family_sources()
    code: dict[str, Any] = {"sources": tool_fingerprint((*_JUDGE_SOURCES, *inside)),
                            "families": registry.family_names()}
    if outside:
        code["family_sources"] = {path: hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16] for path in outside}
    return code


def _family_sources() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The files that declare the families a finding may name (`FamilySpec.module`): those in ckptscan,
    relative to its root, and those outside it, as paths; a module without a file is left out."""
    root = Path(ckptscan.__file__).parent
    inside: list[str] = []
    outside: list[str] = []
    for family in registry.finding_specs():
        module = sys.modules.get(family.module)
        file = getattr(module, "__file__", None)
        if file is None:
            continue
        path = Path(file).resolve()
        if path.is_relative_to(root.resolve()):
            inside.append(str(path.relative_to(root.resolve())))
        else:
            outside.append(str(path))
    return tuple(dict.fromkeys(inside)), tuple(dict.fromkeys(outside))


class JudgeCache:
    """Judged pairs, and the judge state after the newest, beside the pair cache.

    Pair k's judgement depends on its metrics, on every pair before it and
    on the basis (the effective thresholds, the reference run, the detection
    code), so it is filed under a chain digest: c_0 = digest(basis),
    c_k = digest(c_{k-1}, pair k's cache identity). `<dir>/judged/<c_k>.json`
    holds pair k's judgement, `<dir>/judge-state/<c_k>.json` the state after
    it (only the newest is kept), `<dir>/screened/<digest(basis)>.json`
    which references were left out (`detection/screening.py`). A run whose
    pairs extend a judged one finds the state of its longest judged prefix
    and judges only the rest; any other change (thresholds, a pair
    recomputed, a restart) misses, and the series is judged from the first
    pair. An unreadable entry is a miss.
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.reused = 0  # judged pairs taken from the cache by the last `report`
        self.write_error: str | None = None
        # The last chain (basis, pair keys, links): a watch's next look extends it by its new pairs.
        self._chain: tuple[dict[str, Any], list[str], list[str]] | None = None
        self._packed = 0  # how many judged pairs of the last chain its pack held

    def report(self, judging: SeriesJudge, metrics: Metrics) -> ScanReport:
        """`judging.report(metrics)`, going on from the cache's judged prefix
        when `judging` holds no state of its own yet, and filing what it adds."""
        if len(metrics.pair_keys) != len(metrics.pairs):
            return judging.report(metrics)
        thresholds, _ = effective_thresholds(metrics, judging.thresholds)
        basis = judging.basis(thresholds)
        self._screen(judging, thresholds, basis)
        chain = self.chain(basis, metrics.pair_keys)
        if judging.state is None or judging.state.basis != basis:
            self._resume(judging, metrics, thresholds, basis, chain)
        state, before = judging.state, len(judging.judged)
        self.reused = before
        report = judging.report(metrics)
        if judging.state is not state:
            before = 0  # judged again from the first pair
        for index in range(before, len(judging.judged)):
            self._write(self._judged(chain[index]), dataclasses.asdict(_judgement(judging.judged[index])))
        if judging.state is not None and len(judging.judged) > before:  # report() always leaves a state
            self._write(self._state(chain[len(judging.judged) - 1]), judging.state.to_dict())
            if before:
                self._state(chain[before - 1]).unlink(missing_ok=True)
        if not before:
            self._packed = 0
        self._pack(self._judged_pack(metrics, basis), chain, judging.judged)
        return report

    def _pack(self, path: Path, chain: list[str], judged: list[PairResult]) -> None:
        """The judged pairs in the chain's pack, when enough are past it (`pack_due`)."""
        if not judged or not pack_due(self._packed, len(judged)):
            return
        try:
            write_pack(path, chain[:len(judged)],
                       tables.encode(PairJudgement, [_judgement(pair) for pair in judged]))
        except OSError as e:
            self.write_error = f"{self.directory}: {e.strerror or e}"
            return
        self._packed = len(judged)

    def chain(self, basis: dict[str, Any], pair_keys: list[str]) -> list[str]:
        """The chain digests of `pair_keys` under `basis` (`_chain`), extending
        the last one when these keys extend its keys under the same basis."""
        if self._chain is not None:
            known_basis, keys, links = self._chain
            if known_basis == basis and pair_keys[:len(keys)] == keys:
                links = links + _chain(basis, pair_keys[len(keys):], links[-1] if links else None)
                self._chain = (basis, list(pair_keys), links)
                return links
        links = _chain(basis, pair_keys)
        self._chain = (basis, list(pair_keys), links)
        return links

    def _screen(self, judging: SeriesJudge, thresholds: Thresholds, basis: dict[str, Any]) -> None:
        """`judging`'s screening of its references (`SeriesJudge.screened`)
        from `<dir>/screened/`, filed under the basis, or worked out and filed:
        it judges every reference, as costly as judging them."""
        if not judging.screens:
            return
        key = digest({"format": JUDGE_FORMAT, "code": _code(), "basis": basis})
        path = self.directory / "screened" / f"{key}.json"
        try:
            judging.screened(thresholds, _read(path))
            return
        except (OSError, ValueError, KeyError, TypeError):
            pass
        screened = judging.screened(thresholds)
        if screened is not None:
            self._write(path, screened.as_dict())

    def _resume(self, judging: SeriesJudge, metrics: Metrics, thresholds: Thresholds, basis: dict[str, Any],
                chain: list[str]) -> None:
        """Start `judging` from the state of the longest prefix of the chain on disk, if any."""
        for count in range(len(chain), 0, -1):
            path = self._state(chain[count - 1])
            if not path.is_file():
                continue
            try:
                state = JudgeState.from_dict(_read(path), thresholds, judging.expected(thresholds, metrics), basis)
                with collector_paused():
                    packed = self._read_pack(self._judged_pack(metrics, basis), chain[:count])
                    self._packed = len(packed)
                    saved = [*packed, *(from_dict(PairJudgement, _read(self._judged(link)))
                                        for link in chain[len(packed):count])]
                    judged = [_annotated(pair, judgement) for pair, judgement in zip(metrics.pairs, saved)]
            except (OSError, ValueError, KeyError, TypeError, CkptScanError):
                return
            if state.count == count:
                judging.start(state, judged)
            return

    def _read_pack(self, path: Path, links: list[str]) -> list[PairJudgement]:
        """The judgements of the chain's pack as far as its links are `links`'."""
        try:
            packed, rows = read_pack(path)
            judgements = tables.decode(PairJudgement, rows)
            if len(judgements) != len(packed):
                raise PackError(f"{path}: {len(judgements)} judged pairs for {len(packed)} links")
            return judgements[:common_prefix(packed, links)]
        except (OSError, PackError, ValueError, KeyError, TypeError, IndexError, StopIteration):
            return []

    def _write(self, path: Path, data: dict[str, Any]) -> None:
        try:
            write_output(path, json.dumps(data, allow_nan=True))
        except OSError as e:
            self.write_error = f"{self.directory}: {e.strerror or e}"

    def _judged(self, link: str) -> Path:
        return self.directory / "judged" / f"{link}.json"

    def _state(self, link: str) -> Path:
        return self.directory / "judge-state" / f"{link}.json"

    def _judged_pack(self, metrics: Metrics, basis: dict[str, Any]) -> Path:
        """The judged pack of a run under a basis: one a run and basis, replaced
        as the run grows (a pack of another chain shares no link with it)."""
        name = digest({"format": JUDGE_FORMAT, "code": _code(), "basis": basis, "run": metrics.settings.get("run"),
                       "kind": metrics.kind})
        return self.directory / "judged-packs" / f"{name}.pack"


def _chain(basis: dict[str, Any], pair_keys: list[str], link: str | None = None) -> list[str]:
    """c_1 … c_k of `pair_keys` (see JudgeCache), going on from `link` when given."""
    if link is None:
        link = digest({"format": JUDGE_FORMAT, "code": _code(), "basis": basis})
    chain = []
    for key in pair_keys:
        link = hashlib.sha256(f"{link} {key}".encode()).hexdigest()
        chain.append(link)
    return chain


def _read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def _judgement(pair: PairResult) -> PairJudgement:
    """What judging wrote into a pair."""
    return PairJudgement(pair.status, pair.not_judged_reason,
                         [LayerJudgement(layer.status, layer.findings, layer.judgements) for layer in pair.layers])


def _annotated(pair: PairResult, judgement: PairJudgement) -> PairResult:
    """A copy of a metrics pair with the judgement `_judgement` kept of it."""
    if len(judgement.layers) != len(pair.layers):
        raise ValueError("the judged pair has other layers")
    layers = []
    for layer, saved in zip(pair.layers, judgement.layers):
        # A copy by its fields in order (`dataclasses.replace` took 4x as long: 32,000 layers at 2,000 pairs).
        values = list(_LAYER_VALUES(layer))
        values[_STATUS], values[_FINDINGS], values[_JUDGEMENTS] = saved.status, saved.findings, saved.judgements
        layers.append(LayerResult(*values))
    return dataclasses.replace(pair, layers=layers, status=judgement.status,
                               not_judged_reason=judgement.not_judged_reason)
