"""`ckptscan diff CKPT_A CKPT_B`: the per-layer health table of one update."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from ckptscan.cli.app import (
    ConfigFile,
    Device,
    FailOnOpt,
    Format,
    FormatOpt,
    FullSpectrum,
    HeadDim,
    Heads,
    HtmlOut,
    JsonOut,
    JunitOut,
    Layers,
    MarkdownSummary,
    ModelConfigFile,
    NumHeads,
    NumKvHeads,
    Precision,
    PrecisionOpt,
    Quiet,
    Reference,
    SetThreshold,
    TensorBoardDir,
    TensorMapFile,
    app,
    emit,
    gate,
    scan_options,
    user_errors,
    PngDir,
)
from ckptscan.cli.process import load_library

if TYPE_CHECKING:
    from rich.console import Console

    from ckptscan.results import ScanReport


@app.command()
def diff(
    # str, not Path: a URL (s3://bucket/run/checkpoint-1000) must keep its "//".
    ckpt_a: Annotated[str, typer.Argument(help="Older checkpoint (directory, file or URL: s3://, gs://, ...).")],
    ckpt_b: Annotated[str, typer.Argument(help="Newer checkpoint.")],
    json_path: JsonOut = None,
    junit: JunitOut = None,
    tensorboard: TensorBoardDir = None,
    output: FormatOpt = Format.table,
    markdown_summary: MarkdownSummary = None,
    html: HtmlOut = None,
    png: PngDir = None,
    fail_on: FailOnOpt = None,
    config: ConfigFile = None,
    set_: SetThreshold = None,
    quiet: Quiet = False,
    num_heads: NumHeads = None,
    num_kv_heads: NumKvHeads = None,
    head_dim: HeadDim = None,
    model_config: ModelConfigFile = None,
    layers: Layers = None,
    precision: PrecisionOpt = Precision.float32,
    probe: Annotated[Optional[str], typer.Option(  # str: a URL keeps its "//"
        "--probe", help="Router inputs (safetensors, keys layers.{i}.router_input [T, d]): adds routing entropy "
        "and expert load per MoE layer.")] = None,
    reference: Reference = None,
    device: Device = "cpu",
    heads: Heads = None,
    full_spectrum: FullSpectrum = False,
    tensor_map: TensorMapFile = None,
) -> None:
    """Per-layer health table of the update from CKPT_A to CKPT_B."""
    with user_errors():
        load_library()
        from ckptscan.api import scan
        from ckptscan.cli.report import check_figure_outputs, check_tensorboard_output, write_figure_outputs, \
            write_tensorboard_output
        from ckptscan.run import AUTO, resolve_pair

        check_figure_outputs(html, png)
        check_tensorboard_output(tensorboard)
        options = scan_options(precision, num_heads, num_kv_heads, head_dim, layers, device, heads,
                               full_spectrum, tensor_map, model_config)
        spec = resolve_pair(ckpt_a, ckpt_b, probe=probe, reference=reference,
                            config=config if config is not None else AUTO, settings=set_ or ())
        report = scan(spec, options)
        level = fail_on or spec.config.fail_on
        emit(report, output, json_path, markdown_summary, _print_table, junit, level)
        write_figure_outputs(report, html, png, quiet)
        write_tensorboard_output(report, tensorboard, quiet)
        code = gate(report, level)
    raise typer.Exit(code)


def _print_table(console: Console, report: ScanReport) -> None:
    from ckptscan.report.table import print_model, print_pair, print_summary

    print_model(console, report)
    print_pair(console, report, report.pairs[0])
    print_summary(console, report)
