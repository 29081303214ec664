"""`ckptscan diff CKPT_A CKPT_B`: the per-layer health table of one update."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ckptscan.cli.app import (
    FailOn,
    HeadDim,
    JsonOut,
    Layers,
    NumHeads,
    NumKvHeads,
    Precision,
    app,
    gate,
    out,
    scan_options,
    user_errors,
)
from ckptscan.report.json import write_json
from ckptscan.report.table import print_model, print_pair, print_summary
from ckptscan.scan import scan_pair


@app.command()
def diff(
    ckpt_a: Path = typer.Argument(..., help="Older checkpoint (directory or .safetensors file)."),
    ckpt_b: Path = typer.Argument(..., help="Newer checkpoint."),
    json_path: Optional[Path] = JsonOut,
    fail_on: str = FailOn,
    num_heads: Optional[int] = NumHeads,
    num_kv_heads: Optional[int] = NumKvHeads,
    head_dim: Optional[int] = HeadDim,
    layers: Optional[str] = Layers,
    precision: str = Precision,
) -> None:
    """Per-layer health table of the update from CKPT_A to CKPT_B."""
    with user_errors():
        options = scan_options(precision, num_heads, num_kv_heads, head_dim, layers)
        report = scan_pair(ckpt_a, ckpt_b, options)
        print_model(out, report)
        print_pair(out, report, report.pairs[0])
        print_summary(out, report)
        if json_path is not None:
            write_json(report, json_path)
        code = gate(report, fail_on)
    raise typer.Exit(code)
