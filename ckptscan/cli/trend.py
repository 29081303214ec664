"""`ckptscan trend RUN_DIR`: a whole run judged over time, and the CI gate."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from ckptscan.cli.app import command, err, note, run_arguments, scan_options, user_errors
from ckptscan.cli.options import ExecutorName, RunDir
from ckptscan.cli.outputs import TrendOutputs
from ckptscan.cli.process import load_library

if TYPE_CHECKING:
    from rich.progress import Progress


@command
def trend(
    run_dir: RunDir,
    *,  # the options, in --help order; a bare name is a shared option (cli.options)
    stride, base, reference,
    baseline: Annotated[Optional[Path], typer.Option("--baseline", hidden=True, metavar="FILE",
                                                     help="Deprecated alias of --reference.")] = None,
    loss_log, no_loss_log, outputs: TrendOutputs, fail_on, config, set_, cache_dir, no_cache, quiet, num_heads,
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
    """When did each layer become abnormal, through which mechanism, and does the run pass the gate?"""
    with user_errors():
        load_library()
        from ckptscan.api import scan
        from ckptscan.cache import PairCache, default_cache_dir
        from ckptscan.errors import CkptScanError
        from ckptscan.executors import make_executor
        from ckptscan.discovery import CORRUPT
        from ckptscan.report.trend_table import print_trend, skipped_line
        from ckptscan.run import resolve_run

        if baseline is not None:
            if reference is not None:
                raise CkptScanError("give --reference only (--baseline is its deprecated alias)")
            note("--baseline is deprecated: use --reference (a known-healthy run's report)", "yellow", quiet)
            reference = baseline
        outputs.check()
        options = scan_options(precision, num_heads, num_kv_heads, head_dim, layers, device, heads,
                               full_spectrum, tensor_map, model_config)
        spec = resolve_run(run_dir, **run_arguments(stride, base, probe, no_probe, loss_log, no_loss_log, reference,
                                                    config, set_))
        for message in spec.notes:
            note(message, "yellow" if message.startswith("ignoring") else "dim", quiet)
        for item in spec.skipped:  # before the scan, and so before the verdict
            note(skipped_line(item), "yellow" if item.get("kind") == CORRUPT else "dim", quiet)
        cache = None if no_cache else PairCache(cache_dir or default_cache_dir())
        runner = make_executor(ExecutorName(executor).value, ray_address)
        try:
            with _progress(quiet) as progress:
                task = progress.add_task("scanning layers", total=None)
                report = scan(spec, options, cache=cache, executor=runner,
                              progress=lambda done, total: progress.update(task, completed=done, total=total))
        finally:
            runner.close()
        if cache is not None:
            note(f"cache: {cache.hits} pair(s) reused, {cache.misses} computed ({cache.directory})", quiet=quiet)
            if cache.write_error:  # not fatal (the cache only saves time), but never silent, even with --quiet
                note(f"warning: cache not written: {cache.write_error}", "yellow")
        code = outputs.write(report, fail_on or spec.config.fail_on, print_trend, quiet, allow_corrupt)
    raise typer.Exit(code)


def _progress(quiet: bool) -> Progress:
    """A progress bar on stderr, only for a person watching a terminal."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=err(), transient=True, disable=quiet or not err().is_terminal)
