"""`ckptscan diff CKPT_A CKPT_B`: the per-layer health table of one update."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

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
    Probe,
    SetThreshold,
    TensorMapFile,
    app,
    emit,
    gate,
    load_settings,
    scan_options,
    user_errors,
)
from ckptscan.report.table import print_model, print_pair, print_summary
from ckptscan.results import ScanReport
from ckptscan.scan import scan_pair


@app.command()
def diff(
    # str, not Path: a URL (s3://bucket/run/checkpoint-1000) must keep its "//".
    ckpt_a: str = typer.Argument(..., help="Older checkpoint (directory, .safetensors file or URL: s3://, gs://, …)."),
    ckpt_b: str = typer.Argument(..., help="Newer checkpoint."),
    json_path: Optional[Path] = JsonOut,
    output: str = Format,
    markdown_summary: Optional[Path] = MarkdownSummary,
    fail_on: Optional[str] = FailOn,
    config: Optional[Path] = ConfigFile,
    set_: Optional[list[str]] = SetThreshold,
    num_heads: Optional[int] = NumHeads,
    num_kv_heads: Optional[int] = NumKvHeads,
    head_dim: Optional[int] = HeadDim,
    layers: Optional[str] = Layers,
    precision: str = Precision,
    probe: Optional[Path] = Probe,
    device: str = Device,
    heads: Optional[str] = Heads,
    full_spectrum: bool = FullSpectrum,
    tensor_map: Optional[Path] = TensorMapFile,
) -> None:
    """Per-layer health table of the update from CKPT_A to CKPT_B."""
    with user_errors():
        options = scan_options(precision, num_heads, num_kv_heads, head_dim, layers, probe, device, heads,
                               full_spectrum, tensor_map)
        settings = load_settings(config, set_)
        options.thresholds = settings.thresholds
        report = scan_pair(ckpt_a, ckpt_b, options)
        emit(report, output, json_path, markdown_summary, _print_table)
        code = gate(report, fail_on or settings.fail_on)
    raise typer.Exit(code)


def _print_table(console: Console, report: ScanReport) -> None:
    print_model(console, report)
    print_pair(console, report, report.pairs[0])
    print_summary(console, report)
