"""`ckptscan trend RUN_DIR`: a whole run judged over time, and the CI gate."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ckptscan.cache import PairCache, default_cache_dir
from ckptscan.cli.app import (
    ConfigFile,
    Device,
    FailOn,
    Format,
    FullSpectrum,
    HeadDim,
    Heads,
    JsonOut,
    Layers,
    MarkdownSummary,
    NumHeads,
    NumKvHeads,
    Precision,
    Quiet,
    SetThreshold,
    TensorMapFile,
    app,
    emit,
    err,
    gate,
    load_settings,
    scan_options,
    user_errors,
)
from ckptscan.cli.report import HtmlOut, PngDir, check_figure_outputs, write_figure_outputs
from ckptscan.errors import CkptScanError
from ckptscan.loss_log import read_loss_log
from ckptscan.report.trend_table import print_trend
from ckptscan.scan import ScanOptions
from ckptscan.storage import as_path
from ckptscan.trend import TrendOptions, scan_run

# Files a run directory may carry that trend uses without being told.
DEFAULT_LOSS_LOG = "train_log.jsonl"
DEFAULT_PROBE = "probe.safetensors"


@app.command()
def trend(
    # str, not Path: a URL (s3://bucket/run/) must keep its "//".
    run_dir: str = typer.Argument(..., help="Run directory holding checkpoint-N/ (or "
                                            "step-N/, iter_N/ …) folders; local or a URL prefix (s3://, gs://, …)."),
    stride: int = typer.Option(1, "--stride", help="Use every N-th checkpoint (from the first)."),
    base: str = typer.Option("previous", "--base", help="'previous': each checkpoint against the one before; "
                             "'first': each against the first."),
    baseline: Optional[Path] = typer.Option(None, "--baseline", help="JSON report (ckptscan trend --json) of a "
                                            "known-healthy run of the same model and schedule to compare with."),
    loss_log: Optional[Path] = typer.Option(None, "--loss-log", help="Loss log (JSON Lines or CSV with step, loss; "
                                            f"default: RUN_DIR/{DEFAULT_LOSS_LOG} when present)."),
    json_path: Optional[Path] = JsonOut,
    output: str = Format,
    markdown_summary: Optional[Path] = MarkdownSummary,
    html: Optional[Path] = HtmlOut,
    png: Optional[Path] = PngDir,
    fail_on: Optional[str] = FailOn,
    config: Optional[Path] = ConfigFile,
    set_: Optional[list[str]] = SetThreshold,
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help="Where per-pair results are cached "
                                             "(default: $XDG_CACHE_HOME/ckptscan or ~/.cache/ckptscan)."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Compute every pair; read and write no cache."),
    quiet: bool = Quiet,
    num_heads: Optional[int] = NumHeads,
    num_kv_heads: Optional[int] = NumKvHeads,
    head_dim: Optional[int] = HeadDim,
    layers: Optional[str] = Layers,
    precision: str = Precision,
    probe: Optional[Path] = typer.Option(None, "--probe", help="Router inputs (safetensors, keys "
                                         "layers.{i}.router_input [T, d]) for routing entropy and expert load "
                                         f"(default: RUN_DIR/{DEFAULT_PROBE} when present)."),
    device: str = Device,
    heads: Optional[str] = Heads,
    full_spectrum: bool = FullSpectrum,
    tensor_map: Optional[Path] = TensorMapFile,
) -> None:
    """When did each layer become abnormal, through which mechanism, and does the run pass the gate?"""
    with user_errors():
        run_dir = as_path(run_dir)
        if not run_dir.is_dir():
            raise CkptScanError("not a run directory", path=run_dir)
        check_figure_outputs(html, png)
        # The run's own probe and loss log are picked up from local run directories only.
        local = isinstance(run_dir, Path)
        found_probe = probe is None and local and (run_dir / DEFAULT_PROBE).is_file()

        def options_with(probe_file: Path | None) -> ScanOptions:
            return scan_options(precision, num_heads, num_kv_heads, head_dim, layers, probe_file, device, heads,
                                full_spectrum, tensor_map)

        try:
            options = options_with(run_dir / DEFAULT_PROBE if found_probe else probe)
        except CkptScanError as e:
            if not found_probe:
                raise
            # The run's own probe was not asked for: an unusable one is skipped, not fatal.
            if not quiet:
                err.print(f"ignoring the run's probe: {e}", highlight=False, style="yellow")
            found_probe = False
            options = options_with(None)
        if found_probe and not quiet:
            err.print(f"using the run's probe: {run_dir / DEFAULT_PROBE}", highlight=False, style="dim")
        settings = load_settings(config, set_)
        options.thresholds = settings.thresholds
        if loss_log is None and local:
            loss_log = _usable_loss_log(run_dir / DEFAULT_LOSS_LOG, quiet)
        cache = None if no_cache else PairCache(cache_dir or default_cache_dir(), options)
        with _progress(quiet) as progress:
            task = progress.add_task("scanning layers", total=None)
            options.progress = lambda done, total: progress.update(task, completed=done, total=total)
            report = scan_run(run_dir, options, TrendOptions(stride, base, loss_log, baseline), cache)
        if cache is not None and not quiet:
            err.print(f"cache: {cache.hits} pair(s) reused, {cache.misses} computed ({cache.directory})",
                      highlight=False, style="dim")
            if cache.write_error:
                err.print(f"cache not written: {cache.write_error}", highlight=False, style="yellow")
        emit(report, output, json_path, markdown_summary, print_trend)
        write_figure_outputs(report, html, png, quiet)
        code = gate(report, fail_on or settings.fail_on)
    raise typer.Exit(code)


def _progress(quiet: bool) -> Progress:
    """A progress bar on stderr, only for a person watching a terminal."""
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=err, transient=True, disable=quiet or not err.is_terminal)


def _usable_loss_log(path: Path, quiet: bool) -> Path | None:
    """The run's own loss log when present and readable; an unreadable one is
    skipped with a note (it was not asked for), unlike an explicit --loss-log."""
    if not path.is_file():
        return None
    try:
        read_loss_log(path)
    except CkptScanError as e:
        if not quiet:
            err.print(f"ignoring the run's loss log: {e}", highlight=False, style="yellow")
        return None
    if not quiet:
        err.print(f"using the run's loss log: {path}", highlight=False, style="dim")
    return path
