"""`ckptscan trend RUN_DIR`: a whole run judged over time, and the CI gate."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from ckptscan.cli.app import command, err, head_overrides, note, scan_options, side_file, user_errors
from ckptscan.cli.options import Base, ExecutorName, FailOn, RunDir
from ckptscan.cli.outputs import SweepOutputs, TrendOutputs
from ckptscan.cli.process import load_library

if TYPE_CHECKING:
    from rich.progress import Progress

    from ckptscan.pipeline.request import ScanRequest


@command
def trend(
    run_dir: RunDir,
    *,  # the options, in --help order; a bare name is a shared option (cli.options)
    stride, base, reference,
    baseline: Annotated[Optional[Path], typer.Option("--baseline", hidden=True, metavar="FILE",
                                                     help="Deprecated alias of --reference.")] = None,
    loss_log, no_loss_log, outputs: TrendOutputs, fail_on, config, set_, cache_dir, no_cache, quiet, wide, num_heads,
    num_kv_heads, head_dim, model_config, layers, precision, probe, no_probe, device, heads, full_spectrum, tensor_map,
    allow_corrupt: Annotated[bool, typer.Option(
        "--allow-corrupt", help="Judge the run without its corrupt checkpoints (they fail the gate otherwise); "
        "they are still listed.")] = False,
    executor: Annotated[ExecutorName, typer.Option(
        "--executor", help="Where the layer tasks run: local (threads here) or ray (a Ray cluster; needs "
        "pip install 'ckptscan[ray]'). Workers read the checkpoints from the paths given.")] = ExecutorName.local,
    ray_address: Annotated[Optional[str], typer.Option(
        "--ray-address", metavar="ADDRESS", help="With --executor ray: 'auto' (the cluster this machine belongs to) or "
        "ray://host:port (default: a Ray already set up in this process, else a new local one).")] = None,
) -> None:
    """When did each layer become abnormal, through which mechanism, and does the run pass the gate?

    RUN_DIR may be a sweep: a directory whose subdirectories are runs. Each run is then judged against the others
    and the runs ranked, as by ckptscan compare.
    """
    with user_errors():
        load_library()
        from ckptscan.pipeline.api import resolve_references, scan
        from ckptscan.caches.pair_cache import PairCache
        from ckptscan.system.paths import default_cache_dir
        from ckptscan.errors import CkptScanError
        from ckptscan.executors import make_executor
        from ckptscan.pipeline.discovery import CORRUPT, sweep_runs
        from ckptscan.report.trend_table import print_trend, skipped_line
        from ckptscan.pipeline.request import ScanRequest
        from ckptscan.pipeline.run import resolve_run

        if baseline is not None:
            if reference is not None:
                raise CkptScanError("give --reference only (--baseline is its deprecated alias)")
            note("--baseline is deprecated: use --reference (a known-healthy run's report)", "yellow", quiet)
            reference = [str(baseline)]
        runs = sweep_runs(run_dir)
        if runs is None:
            outputs.check()
        options = scan_options(precision, overrides=head_overrides(num_heads, num_kv_heads, head_dim, model_config),
                               layers=layers, device=device, heads=heads, full_spectrum=full_spectrum,
                               tensor_map=tensor_map)
        cache = None if no_cache else PairCache(cache_dir or default_cache_dir())
        runner = make_executor(ExecutorName(executor).value, ray_address)
        request = ScanRequest(options, stride=stride, base=Base(base).value, probe=side_file(probe, no_probe),
                              loss_log=side_file(loss_log, no_loss_log), references=tuple(reference or ()),
                              config=side_file(config), settings=tuple(set_ or ()), cache=cache, executor=runner)
        try:  # the executor is closed however this ends (a reference run is scanned on it too)
            if runs is not None:
                raise typer.Exit(_sweep(runs, request, outputs, fail_on, quiet, allow_corrupt))
            request = resolve_references(request)
            spec = resolve_run(run_dir, request)
            for message in spec.notes:
                note(message, "yellow" if message.startswith("ignoring") else "dim", quiet)
            for item in spec.skipped:  # before the scan, and so before the verdict
                note(skipped_line(item), "yellow" if item.get("kind") == CORRUPT else "dim", quiet)
            with _progress(quiet) as progress:
                task = progress.add_task("scanning layers", total=None)
                report = scan(spec, request,
                              progress=lambda done, total: progress.update(task, completed=done, total=total))
        finally:
            runner.close()
        if cache is not None:
            note(f"cache: {cache.hits} pair(s) reused, {cache.misses} computed ({cache.directory})", quiet=quiet)
            if cache.write_error:  # not fatal (the cache only saves time), but never silent, even with --quiet
                note(f"warning: cache not written: {cache.write_error}", "yellow")
        code = outputs.write(report, fail_on or spec.config.fail_on, partial(print_trend, wide=wide), quiet,
                             allow_corrupt)
    raise typer.Exit(code)


# The destinations a sweep writes: its ranking (as a table or JSON), --json and --html.
SWEEP_FLAGS = ("--format json", "--json", "--html")


def _sweep(runs: list, request: ScanRequest, outputs: TrendOutputs, fail_on: FailOn | None, quiet: bool,
           allow_corrupt: bool) -> int:
    """`trend SWEEP/`: the sweep's runs judged against each other (`cli.compare`).
    What names one run's side files, or another reference, has no meaning here;
    --no-probe and --no-loss-log switch every run's own off."""
    from ckptscan.cli.compare import judge_sweep
    from ckptscan.errors import CkptScanError
    from ckptscan.pipeline.request import AUTO

    given = {"--reference": request.references, "--probe": request.probe not in (AUTO, None),
             "--loss-log": request.loss_log not in (AUTO, None)}
    unused = [flag for flag, value in given.items() if value]
    unused += [flag for destination in outputs.destinations() for flag in destination.named()
               if flag not in SWEEP_FLAGS]
    sweep_outputs = SweepOutputs(outputs.values)  # the same flags, asking for the sweep's own destinations
    sweep_outputs.check()
    if unused:
        raise CkptScanError(f"{', '.join(unused)}: not for a sweep (each of its {len(runs)} runs is judged against "
                            "the others with its own probe and loss log; --json and --html write the sweep report)")
    return judge_sweep(runs, request, sweep_outputs, fail_on=fail_on, quiet=quiet, allow_corrupt=allow_corrupt)


def _progress(quiet: bool) -> Progress:
    """A progress bar on stderr, only for a person watching a terminal."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=err(), transient=True, disable=quiet or not err().is_terminal)
