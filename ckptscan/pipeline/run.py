"""What to scan: a run spec, resolved once from what the user named.

    spec = resolve_run("runs/main")              # checkpoints, probe, loss log, config
    spec = resolve_pair("ckpt-1000", "ckpt-1100")

A `RunSpec` is everything a scan reads besides its options: the checkpoints
in step order, the (older, newer) pairs to compare, and the run's side files.
The defaults are the ones the CLI documents, and the CLI only maps its flags
onto these arguments, so the library and the command line see the same run:

- probe: `RUN/probe.safetensors` when present (routing entropy, expert load);
- loss log: `RUN/train_log.jsonl` when present (lead time, LR warm-up);
  both found the same way under a URL prefix (s3://bucket/run/), and either
  may be named as a local file or a URL;
- config: the nearest `ckptscan.toml` / `pyproject.toml [tool.ckptscan]` from
  the current directory up (thresholds, the gate's `fail_on`);
- reference: none. When given, one known-healthy run or several (a band),
  resolved before the spec is made (`api.resolve_references`: a run is
  scanned as the judged run is, a JSON report read); a report file named
  here is read, a run named here unresolved is an error. The spec holds
  each as a `ReferenceRun` (its report and where it came from), as the
  judge is given them.

What to scan besides the checkpoints is a `ScanRequest` (`ckptscan.pipeline.request`);
the keyword arguments of `resolve_run` and `resolve_pair` are its fields.
Each side file is `AUTO` (the default above), `None` (off) or a path. A file
found by default that cannot be used is skipped with a note (it was not asked
for); a file named explicitly that cannot be used is an error.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence, Union

from ckptscan.pipeline.config import Config, load_config
from ckptscan.pipeline.discovery import discover_run, run_directory
from ckptscan.errors import CkptScanError
from ckptscan.inputs.loss_log import DEFAULT_LOSS_LOG, LossLog, read_loss_log
from ckptscan.pipeline.opened import OpenedRecord
from ckptscan.inputs.probe import Probe, load_probe
from ckptscan.readers import Checkpoint, open_checkpoints
from ckptscan.document.reading import load_report
from ckptscan.detection.reference import ReferenceRun, reference_runs
from ckptscan.pipeline.request import AUTO, ReferenceSource, ReferenceSources, ScanRequest, SideFile, _Auto
from ckptscan.schema.results import ScanReport
from ckptscan.storage import RemotePath, as_path

__all__ = ["AUTO", "BASES", "ReferenceRun", "ReferenceSources", "RunSpec", "SideFile", "check_pair", "load_reference",
           "plan_pairs", "reference_run", "resolve_pair", "resolve_run", "run_spec"]


# Files a run directory may carry that a scan uses without being told.
DEFAULT_PROBE = "probe.safetensors"
BASES = ("previous", "first")


# The spec's references in their older shape (`RunSpec.reference`, `.reference_path`): one report and the
# file or run directory it came from, lists of them when several were given (a band), None without any.
OldReports = Union[ScanReport, list[ScanReport], None]
OldPaths = Union[str, list[Union[str, None]], None]


@dataclass(init=False)
class RunSpec:
    kind: str  # "pair" (two checkpoints) | "run" (a run directory)
    path: str  # the run directory, or the newer checkpoint of a pair, as the user named it
    checkpoints: list[Checkpoint]  # oldest first
    pairs: list[tuple[int, int]]  # (older, newer) indices into `checkpoints`
    probe: Probe | None = None
    loss_log: LossLog | None = None
    references: tuple[ReferenceRun, ...] = ()  # known-healthy runs to judge against (several: a band)
    config: Config = field(default_factory=Config)
    skipped: list[dict[str, str]] = field(default_factory=list)  # checkpoints that looked usable but were not
    pairing: dict[str, object] = field(default_factory=dict)  # how `pairs` were formed (stride, base, pending)
    notes: list[str] = field(default_factory=list)  # which side files were used or ignored, and why
    run_notes: list[str] = field(default_factory=list)  # discovery's notes, e.g. steps that are save indices

    def __init__(self, kind: str, path: str, checkpoints: list[Checkpoint], pairs: list[tuple[int, int]],
                 probe: Probe | None = None, loss_log: LossLog | None = None,
                 reference: OldReports = None, reference_path: OldPaths = None, config: Config | None = None,
                 skipped: list[dict[str, str]] | None = None, pairing: dict[str, object] | None = None,
                 notes: list[str] | None = None, run_notes: list[str] | None = None, *,
                 references: Sequence[ReferenceRun] = ()) -> None:
        """The fields, in their old order: `reference` and `reference_path`
        (the older shape, deprecated) where `references` (keyword only) was
        added."""
        self.kind, self.path, self.checkpoints, self.pairs = kind, path, checkpoints, pairs
        self.probe, self.loss_log, self.references = probe, loss_log, tuple(references)
        self.config = config if config is not None else Config()
        self.skipped = skipped if skipped is not None else []
        self.pairing = pairing if pairing is not None else {}
        self.notes = notes if notes is not None else []
        self.run_notes = run_notes if run_notes is not None else []
        if reference is not None or reference_path is not None:
            _old_shape_warning(3)
            self.references = reference_runs(reference, reference_path)

    @property
    def reference(self) -> OldReports:
        """The references' reports in the older shape: the one reference's
        report, a list of them (a band), or None (what `judge`'s `reference`
        takes, with `reference_path`)."""
        reports = [run.report for run in self.references]
        return reports[0] if len(reports) == 1 else reports or None

    @reference.setter
    def reference(self, reports: OldReports) -> None:
        _old_shape_warning(3)
        self.references = reference_runs(reports, self.reference_path)

    @property
    def reference_path(self) -> OldPaths:
        """Where each reference came from, in the older shape: a path (None
        for a report object) with one reference, a list with several, None
        without any."""
        paths = [run.path for run in self.references]
        return paths[0] if len(paths) == 1 else paths or None

    @reference_path.setter
    def reference_path(self, paths: OldPaths) -> None:
        _old_shape_warning(3)
        self.references = reference_runs(self.reference, paths)


def _old_shape_warning(stacklevel: int) -> None:
    warnings.warn("a RunSpec's reference and reference_path (reports and paths, one or lists) are deprecated: "
                  "give its references, a tuple of ReferenceRun", DeprecationWarning, stacklevel=stacklevel)


def resolve_run(run_dir: str | Path | RemotePath, request: ScanRequest | None = None, *,
                cache_dir: str | Path | None = None, **fields: Any) -> RunSpec:
    """A run directory's checkpoints (step order), its pairs and side files.

    `request` (or its fields as keywords: stride, base, probe, loss_log,
    reference, config, settings): `stride` s: every s-th checkpoint from the
    first (a stable chain, so a growing run keeps its cached pairs);
    `base="first"`: each against the first. `cache_dir`: where to keep the
    record of the checkpoints found whole (`ckptscan.pipeline.opened`), so a re-run
    opens only new or changed ones; default, the request's cache's.
    """
    request = _request(request, fields)
    if cache_dir is None and request.cache is not None:
        cache_dir = request.cache.directory
    directory = run_directory(run_dir)
    run = discover_run(directory, OpenedRecord(cache_dir, directory) if cache_dir is not None else None)
    if len(run.checkpoints) < 2:
        raise CkptScanError(f"found {len(run.checkpoints)} usable checkpoint(s); a trend needs at least two",
                            path=directory)
    if not plan_pairs(len(run.checkpoints), request.stride, request.base):
        raise CkptScanError(f"--stride {request.stride} leaves no pair among {len(run.checkpoints)} checkpoints",
                            path=directory)
    return run_spec(directory, run.checkpoints, request, skipped=run.skipped, run_notes=run.notes)


def run_spec(run_dir: str | Path | RemotePath, checkpoints: list[Checkpoint], request: ScanRequest | None = None, *,
             skipped: Sequence[dict[str, str]] = (), run_notes: Sequence[str] = (), **fields: Any) -> RunSpec:
    """The spec of these checkpoints (step order) of `run_dir`, with the run's
    pairs and side files: `resolve_run` after discovery, and `ckptscan watch`
    each time a checkpoint of a live run is complete (the loss log has grown)."""
    request = _request(request, fields)
    directory = as_path(run_dir)
    pairs = plan_pairs(len(checkpoints), request.stride, request.base)
    newest = max((b for _, b in pairs), default=len(checkpoints) - 1)
    spec = RunSpec("run", str(directory), list(checkpoints), pairs, skipped=list(skipped),
                   config=_config(request.config, request.settings), run_notes=list(run_notes))
    _config_note(spec)
    spec.pairing = {"pairing": request.base, "stride": request.stride,
                    # Checkpoints newer than the newest scanned one: they wait for the stride.
                    "pending_steps": [c.step for c in checkpoints[newest + 1:]]}
    # The run's own side files, locally or under a URL prefix (known from
    # the listing discovery took: no request when absent).
    spec.probe = _side_file(request.probe, directory / DEFAULT_PROBE, _probe, "probe", spec.notes)
    spec.loss_log = _side_file(request.loss_log, directory / DEFAULT_LOSS_LOG, read_loss_log, "loss log", spec.notes)
    _reference(spec, request.references)
    return spec


def resolve_pair(older: str | Path, newer: str | Path, request: ScanRequest | None = None, **fields: Any) -> RunSpec:
    """Two checkpoints (older, newer) compared as one update. `request` (or
    its fields as keywords): `probe`, a probe file (or an already loaded
    `Probe`) for routing entropy; `probe` and `loss_log` default, as for a
    run, to the run's own files when both checkpoints sit in one run
    directory (so that `diff` of two checkpoints of a run judges what `trend`
    of it does). The same checkpoint twice, or steps in the wrong order, are
    errors (`check_pair`); steps that cannot tell the order are a note."""
    request = _request(request, fields)
    probe, loss_log = request.probe, request.loss_log
    checkpoints = open_checkpoints([older, newer])
    check_pair(*checkpoints)
    spec = RunSpec("pair", str(newer), checkpoints, [(0, 1)], config=_config(request.config, request.settings))
    _config_note(spec)
    run_dir = _shared_run_directory(*checkpoints)
    if run_dir is not None:
        spec.probe = _side_file(probe, run_dir / DEFAULT_PROBE, _probe, "probe", spec.notes)
        spec.loss_log = _side_file(loss_log, run_dir / DEFAULT_LOSS_LOG, read_loss_log, "loss log", spec.notes)
    else:
        spec.probe = None if isinstance(probe, _Auto) else _probe(probe)
        spec.loss_log = None if isinstance(loss_log, _Auto) or loss_log is None else read_loss_log(loss_log)
    if checkpoints[0].step is None or checkpoints[1].step is None:
        spec.notes.append("note: no step in the checkpoints' names: their order is not checked (give the older "
                          "one first)")
    _reference(spec, request.references)
    return spec


def _request(request: ScanRequest | None, fields: dict[str, Any]) -> ScanRequest:
    """The request given, or the one its fields make (the keyword arguments
    `resolve_run(run, stride=2)` has always taken). `scan_reference`, the
    callback that scanned a reference run, is deprecated: such a reference
    is resolved here, up front, as `api.resolve_references` does."""
    scan_reference = fields.pop("scan_reference", None)
    request = ScanRequest.given(request, fields)
    if scan_reference is None:
        return request
    warnings.warn("scan_reference is deprecated: resolve the references first "
                  "(ckptscan.pipeline.api.resolve_references)",
                  DeprecationWarning, stacklevel=3)
    return replace(request, references=tuple(
        ReferenceRun(scan_reference(str(as_path(s))), str(as_path(s)))
        if isinstance(s, (str, Path, RemotePath)) and as_path(s).is_dir() else s for s in request.references))


def _shared_run_directory(older: Checkpoint, newer: Checkpoint) -> Path | RemotePath | None:
    """The directory both checkpoints sit in (a run's), where its side files are; None when they are apart."""
    parent = older.path.parent
    return parent if _same_checkpoint(parent, newer.path.parent) else None


def check_pair(older: Checkpoint, newer: Checkpoint) -> None:
    """Refuse two checkpoints that cannot be an update of one run, as far as
    their paths and steps tell (docs/guides/misuse.md): the same checkpoint
    twice, the newer one first, or both at one step. What only the weights
    tell (different runs, a copy) is a finding (`detection/provenance.py`)."""
    if _same_checkpoint(older.path, newer.path):
        raise CkptScanError("the same checkpoint given twice; diff compares an older checkpoint with a newer one",
                            path=older.path)
    if older.step is None or newer.step is None or older.step < newer.step:
        return
    if older.step == newer.step:
        raise CkptScanError(f"{older.path} and {newer.path} are both step {older.step}: not two steps of one run")
    raise CkptScanError(f"{older.path} (step {older.step}) is newer than {newer.path} (step {newer.step}): give the "
                        "older checkpoint first")


def _same_checkpoint(a: Path | RemotePath, b: Path | RemotePath) -> bool:
    """One file or folder under two names (a symlink, `./x` and `x`), or one URL twice."""
    if isinstance(a, Path) and isinstance(b, Path):
        try:
            return os.path.samefile(a, b)
        except OSError:
            return False
    return str(a).rstrip("/") == str(b).rstrip("/")


def plan_pairs(count: int, stride: int = 1, base: str = "previous") -> list[tuple[int, int]]:
    """(older, newer) checkpoint index pairs of a run of `count` checkpoints."""
    if stride < 1:
        raise CkptScanError(f"--stride must be ≥ 1, not {stride}")
    if base not in BASES:
        raise CkptScanError(f"--base must be one of {list(BASES)}, not {base!r}")
    chain = list(range(0, count, stride))
    if base == "first":
        return [(0, j) for j in chain[1:]]
    return list(zip(chain, chain[1:]))


def _probe(probe: str | Path | Probe | None) -> Probe | None:
    return probe if probe is None or isinstance(probe, Probe) else load_probe(probe)


def _reference(spec: RunSpec, sources: Sequence[ReferenceSource | ReferenceRun]) -> None:
    """The spec's references, each a `ReferenceRun`, in the order given."""
    spec.references = tuple(reference_run(source) for source in sources)


def reference_run(source: ReferenceSource | ReferenceRun) -> ReferenceRun:
    """One reference, resolved: a `ReferenceRun` as it is, a JSON report file
    (local or a URL) read, a report object taken as it is (from no file). A
    run directory (or a URL prefix) is scanned before the spec is made
    (`api.resolve_references`): unresolved here, it is an error."""
    if isinstance(source, ReferenceRun):
        return source
    if isinstance(source, ScanReport):
        return ReferenceRun(source, None)
    path = as_path(source)
    if path.is_dir():
        raise CkptScanError("is a run: a reference run is scanned before the spec is made "
                            "(ckptscan.pipeline.api.resolve_references, or ckptscan.scan_run), or give its JSON report",
                            path=path)
    return ReferenceRun(load_report(path), str(path))


def load_reference(source: ReferenceSource | ReferenceRun) -> tuple[ScanReport, str | None]:
    """Deprecated: one reference's report and where it came from, as two
    values; `reference_run` gives them as one `ReferenceRun`."""
    warnings.warn("load_reference is deprecated: reference_run gives the report and its path as one ReferenceRun",
                  DeprecationWarning, stacklevel=2)
    run = reference_run(source)
    return run.report, run.path


def _config(config: SideFile, settings: Sequence[str]) -> Config:
    if config is None:  # off: the built-in defaults, plus any explicit overrides
        return load_config(None, settings, search=False)
    return load_config(None if isinstance(config, _Auto) else Path(config), settings)


def _config_note(spec: RunSpec) -> None:
    """Name the config file the thresholds came from: one found by searching upwards changes the
    verdict without being named on the command line."""
    if spec.config.source is not None:
        spec.notes.append(f"using config {spec.config.source}")


def _side_file(choice: SideFile | Probe, default: Path | RemotePath, read: Callable[[Any], Any], what: str,
               notes: list[str]) -> Any:
    """Load an explicitly named side file (errors are the user's to see), or
    the run's own one when present (an unusable one is skipped with a note)."""
    if choice is None:
        return None
    if not isinstance(choice, _Auto):
        return read(choice)
    if not default.is_file():
        return None
    try:
        loaded = read(default)
    except CkptScanError as e:
        notes.append(f"ignoring the run's {what}: {e}")
        return None
    notes.append(f"using the run's {what}: {default}")
    return loaded
