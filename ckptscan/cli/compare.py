"""`ckptscan compare RUN RUN ...`: a sweep's runs, each judged against the
others, ranked by health; `ckptscan trend SWEEP/` is the same for a directory
whose subdirectories are the runs (`ckptscan.pipeline.sweep`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Sequence

import typer

from ckptscan.cli.app import EXIT_GATE, EXIT_OK, command, err, head_overrides, note, scan_options, side_file, \
    user_errors
from ckptscan.cli.destinations.json_file import PER_HEAD
from ckptscan.cli.options import Base, FailOn
from ckptscan.cli.outputs import SweepOutputs
from ckptscan.cli.process import load_library

if TYPE_CHECKING:
    from ckptscan.caches.pair_cache import PairCache
    from ckptscan.pipeline.request import ScanRequest
    from ckptscan.storage import RemotePath
    from ckptscan.schema.results import SweepReport

AllowCorrupt = Annotated[bool, typer.Option(
    "--allow-corrupt", help="Judge the runs without their corrupt checkpoints (they fail the gate otherwise); they "
    "are still listed.")]


@command
def compare(
    # str, not Path: a URL prefix (s3://bucket/sweep/run1/) must keep its "//".
    run_dirs: Annotated[list[str], typer.Argument(
        metavar="RUN_DIR", help="Two or more runs of one model (directories or URL prefixes), e.g. the members of "
        "a sweep or several seeds.")],
    *,  # the options, in --help order; a bare name is a shared option (cli.options)
    stride, base, outputs: SweepOutputs, fail_on, config, set_, cache_dir, no_cache, quiet, num_heads, num_kv_heads,
    head_dim, model_config, layers, precision, device, heads, full_spectrum, tensor_map, no_probe, no_loss_log,
    allow_corrupt: AllowCorrupt = False,
) -> None:
    """Judge each run of a sweep against the others and rank them, healthiest first; exit by the worst run.

    Leave-one-out: each run against the band of all the others (against the other run alone when there are two).
    Each run is scanned once with its own probe and loss log (cached like trend's pairs); the ranking is by status
    (ok, warn, alert), then the later first alert. --json writes the ranking with every run's whole report.
    """
    with user_errors():
        load_library()
        from ckptscan.storage import as_path

        # A shell glob (sweep/*) names the sweep's files too (a README): a file is never a run.
        files = [run for run in run_dirs if as_path(run).is_file()]
        for name in files:
            note(f"ignoring {name}: a file, not a run directory", quiet=quiet)
        run_dirs = [run for run in run_dirs if run not in files]
        outputs.check()
        from ckptscan.pipeline.request import ScanRequest

        options = scan_options(precision, overrides=head_overrides(num_heads, num_kv_heads, head_dim, model_config),
                               layers=layers, device=device, heads=heads, full_spectrum=full_spectrum,
                               tensor_map=tensor_map)
        request = ScanRequest(options, stride=stride, base=Base(base).value, probe=side_file(None, no_probe),
                              loss_log=side_file(None, no_loss_log), config=side_file(config),
                              settings=tuple(set_ or ()), cache=_cache(cache_dir, no_cache))
        code = judge_sweep(run_dirs, request, outputs, fail_on=fail_on, quiet=quiet, allow_corrupt=allow_corrupt)
    raise typer.Exit(code)


def judge_sweep(run_dirs: Sequence[str | Path | RemotePath], request: ScanRequest, outputs: SweepOutputs, *,
                fail_on: FailOn | str | None, quiet: bool, allow_corrupt: bool) -> int:
    """Compare the runs, print the ranking (stdout; stderr when the JSON
    report goes to stdout), write --json and --html, and return the gate's
    exit code. The request's probe and loss log None: no run uses its own."""
    from ckptscan.document.plain import check_per_head
    from ckptscan.pipeline.sweep import compare_runs

    check_per_head(outputs[PER_HEAD])  # before any scan
    sweep = compare_runs(run_dirs, request, scanning=lambda run: note(f"scanning {run}", quiet=quiet))
    cache = request.cache
    if cache is not None:
        note(f"cache: {cache.hits} pair(s) reused, {cache.misses} computed ({cache.directory})", quiet=quiet)
    outputs.write(sweep, quiet)
    return sweep_gate(sweep, fail_on or sweep.fail_on, allow_corrupt)


def sweep_gate(sweep: SweepReport, fail_on: FailOn | str, allow_corrupt: bool = False) -> int:
    """The worst run's exit code, with the reason on stderr: 1 when a run's
    verdict reaches `fail_on`, or a run has a corrupt checkpoint (unless
    `allow_corrupt`); else 0."""
    from ckptscan.cli.gate import fails
    from ckptscan.pipeline.discovery import CORRUPT
    from ckptscan.document.sweep import sweep_message

    flags = f"--fail-on {FailOn(fail_on).value}"
    corrupt = [(run, item) for run in sweep.runs for item in run.report.skipped if item.get("kind") == CORRUPT]
    if corrupt and not allow_corrupt:
        run, item = corrupt[0]
        err().print(f"gate failed ({flags}): corrupt checkpoint skipped in {run.path}: {item['reason']} "
                    "(--allow-corrupt passes over it)", highlight=False)
        return EXIT_GATE
    failed = any(fails(run.report, fail_on) for run in sweep.runs)
    err().print(f"gate {'failed' if failed else 'passed'} ({flags}): {sweep_message(sweep)}", highlight=False)
    return EXIT_GATE if failed else EXIT_OK


def _cache(cache_dir: Path | None, no_cache: bool) -> PairCache | None:
    from ckptscan.caches.pair_cache import PairCache
    from ckptscan.system.paths import default_cache_dir

    return None if no_cache else PairCache(cache_dir or default_cache_dir())
