"""What to scan and how to judge it, as one value: `ScanRequest`.

    request = ScanRequest(ScanOptions(device="cuda"), stride=2, references=("runs/seed1",))

Built once by whoever asks (a command from its flags, `scan_run` and
`scan_pair` from their keyword arguments, `watch_run`, a sweep) and passed
whole down to where each part is used: the pairing (`stride`, `base`) to
`run.plan_pairs`, the side files and the config to `run.run_spec`, the
options (the device among them) to `compute`, the thresholds to the judge.

The references are resolved once, up front (`api.resolve_references`): a
reference given as a run is scanned, a report file read, before the judged
run's spec is made, so that nothing below the library's entry points calls
back up to scan. A resolved reference is a `ReferenceRun` (its report, and
where it came from), the one type the run spec holds and the judge is
given; `Reference`, its old name here, still imports (deprecated).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence, Union

from ckptscan.detection.reference import ReferenceRun
from ckptscan.schema.results import ScanReport
from ckptscan.scan import ScanOptions
from ckptscan.storage import RemotePath

if TYPE_CHECKING:
    from ckptscan.caches.pair_cache import PairCache
    from ckptscan.detection.thresholds import Thresholds
    from ckptscan.executors import Executor
    from ckptscan.inputs.probe import Probe


class _Auto:
    """The run's own file, found with the documented default."""

    def __repr__(self) -> str:
        return "AUTO"


AUTO = _Auto()
SideFile = Union[str, Path, _Auto, None]
# What `--reference` names: a report file, a run directory, a URL of either,
# or an already loaded report; one, or several for a band.
ReferenceSource = Union[str, Path, RemotePath, ScanReport]
# A resolved `ReferenceRun` may be given too (resolved already: taken as it is).
ReferenceSources = Union[ReferenceSource, ReferenceRun, Sequence[Union[ReferenceSource, ReferenceRun]], None]


@dataclass(frozen=True)
class ScanRequest:
    """What to scan and how to judge it, besides which checkpoints.

    `options`: how the numbers are computed (layers, heads, precision,
    device). `stride`, `base`: the pairing (`run.plan_pairs`). `probe`,
    `loss_log`, `config`: each `AUTO` (the run's own, or the nearest
    ckptscan.toml), None (off) or a path; `probe` may also be a loaded
    `Probe`. `references`: known-healthy runs or their reports, several for
    a band; each a `ReferenceRun` once resolved. `settings`: "KEY=VALUE" overrides of
    the config's thresholds; `thresholds` replaces them. `cache`, `executor`:
    where pairs are cached and where the layer tasks run."""

    options: ScanOptions = field(default_factory=ScanOptions)
    stride: int = 1
    base: str = "previous"
    probe: SideFile | Probe = AUTO
    loss_log: SideFile = AUTO
    references: tuple[ReferenceSource | ReferenceRun, ...] = ()
    config: SideFile = AUTO
    settings: tuple[str, ...] = ()
    thresholds: Thresholds | None = None
    cache: PairCache | None = None
    executor: Executor | None = None

    @classmethod
    def of(cls, options: ScanOptions | None = None, *, reference: ReferenceSources = None,
           settings: Sequence[str] = (), **fields: Any) -> ScanRequest:
        """From the library's keyword arguments: `reference` one source or
        several (or None), `settings` any sequence, the rest as the fields."""
        return cls(options or ScanOptions(), references=reference_sources(reference), settings=tuple(settings),
                   **fields)

    @classmethod
    def given(cls, request: ScanRequest | ScanOptions | None, fields: dict[str, Any]) -> ScanRequest:
        """What a function that takes a request was given: the request, or
        the one its options (or none) and keyword fields make (the keywords
        the library has always taken); not both."""
        if not isinstance(request, ScanRequest):
            return cls.of(request, **fields)
        if fields:
            raise TypeError(f"give a ScanRequest or its fields, not both: {', '.join(sorted(fields))}")
        return request


def reference_sources(sources: ReferenceSources) -> tuple[ReferenceSource | ReferenceRun, ...]:
    """One source, several or None, as a tuple."""
    if sources is None:
        return ()
    if isinstance(sources, (str, Path, RemotePath, ScanReport, ReferenceRun)):
        return (sources,)
    return tuple(sources)


def __getattr__(name: str) -> Any:
    """`Reference`, the resolved reference's old name (a second class of that
    name was the judge's expectations): `ReferenceRun` itself, with a
    DeprecationWarning."""
    if name == "Reference":
        warnings.warn("ckptscan.pipeline.request.Reference is deprecated: it is "
                      "ckptscan.detection.reference.ReferenceRun", DeprecationWarning, stacklevel=2)
        return ReferenceRun
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
