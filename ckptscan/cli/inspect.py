"""`ckptscan inspect CKPT_OR_RUN`: what ckptscan sees, to debug a mapping.

Prints the format, the model family, layers, heads / KV heads / head_dim,
experts and top-k with where each number came from, and the exact tensors
each layer reads (role, shape, stored dtype); for a run directory also the
checkpoints in step order and what was skipped. When no layout fits, it
prints the tensor-name patterns and exits 2.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ckptscan.cli.app import (
    HeadDim,
    JsonOut,
    Layers,
    NumHeads,
    NumKvHeads,
    TensorMapFile,
    app,
    err,
    out,
    parse_indices,
    user_errors,
)
from ckptscan.errors import CkptScanError
from ckptscan.inspect import inspect_path
from ckptscan.layouts import HeadOverrides, load_tensor_map
from ckptscan.output import own_descriptor, write_output


@app.command()
def inspect(
    path: Path = typer.Argument(..., help="A checkpoint (directory or file) or a run directory of checkpoints."),
    json_path: Optional[Path] = JsonOut,
    output: str = typer.Option("table", "--format", help="Print as 'table' or 'json'."),
    num_heads: Optional[int] = NumHeads,
    num_kv_heads: Optional[int] = NumKvHeads,
    head_dim: Optional[int] = HeadDim,
    layers: Optional[str] = Layers,
    tensor_map: Optional[Path] = TensorMapFile,
) -> None:
    """Show the format, model family, head geometry and the tensors each layer reads."""
    with user_errors():
        if output not in ("table", "json"):
            raise CkptScanError(f"--format must be 'table' or 'json', not {output!r}")
        description = inspect_path(
            path,
            HeadOverrides(num_heads, num_kv_heads, head_dim),
            load_tensor_map(tensor_map) if tensor_map is not None else None,
            parse_indices(layers),
        )
        text = json.dumps(description, indent=2, default=str) + "\n"
        to_stdout = json_path is not None and own_descriptor(str(json_path)) == 1
        if json_path is not None:
            try:
                write_output(json_path, text)
            except OSError as e:
                raise CkptScanError(f"cannot write the JSON file: {e.strerror or e}", path=json_path) from None
        if output == "json" and not to_stdout:
            out.print(text, end="", highlight=False, markup=False, soft_wrap=True)
        elif output != "json":
            # With --json -, stdout carries the JSON alone; the table goes to stderr.
            _print(err if to_stdout else out, description)
        error = description["checkpoint"].get("error")
        if error is not None:
            raise CkptScanError(error)
    raise typer.Exit(0)


def _print(console: Console, description: dict[str, Any]) -> None:
    if description["kind"] == "run":
        _print_run(console, description)
    _print_checkpoint(console, description["checkpoint"], newest=description["kind"] == "run")


def _print_run(console: Console, description: dict[str, Any]) -> None:
    run = description["run"]
    table = Table(title=f"run {description['path']}: {len(run['checkpoints'])} checkpoint(s) in step order",
                  title_justify="left")
    for column in ("step", "format", "path"):
        table.add_column(column)
    for c in run["checkpoints"]:
        table.add_row(str(c["step"]), c["format"], c["path"])
    console.print(table)
    for skipped in run["skipped"]:
        reason = skipped["reason"]  # reader errors already start with the path
        where = "" if reason.startswith(skipped["path"]) else f"{skipped['path']}: "
        console.print(Text.assemble(("skipped ", "yellow"), where + reason))


def _print_checkpoint(console: Console, c: dict[str, Any], newest: bool) -> None:
    which = "newest checkpoint" if newest else "checkpoint"
    step = f", step {c['step']}" if c["step"] is not None else ""
    console.print(Text.assemble((which, "bold"), f" {c['path']} ({c['format']}{step}, {c['num_tensors']} tensors "
                                f"in {len(c['files'])} file(s))"))
    if c["meta"]:
        console.print("metadata  " + ", ".join(f"{k} {v}" for k, v in c["meta"].items()), highlight=False)
    if "error" in c:
        console.print(f"model_type {c['config_model_type'] or '(no config.json)'}; tensor names (layer numbers "
                      "as N):", highlight=False)
        for entry in c["name_patterns"]:
            console.print(f"  {entry['pattern']}" + (f"  x{entry['count']}" if entry["count"] > 1 else ""),
                          highlight=False)
        return
    m = c["model"]
    moe = ""
    if m["num_experts"]:
        moe = f" · {m['num_experts']} experts, top-{m['top_k'] or '?'}, {m['router_scoring'] or 'scoring unknown'}"
    rope = f" (+ shared rope key of {m['rope_head_dim']} dims)" if m.get("rope_head_dim") else ""
    console.print(Text.assemble(("model", "bold"), f" {m['family']} · {m['num_layers']} layers · hidden "
                                f"{m['hidden_size']} · {m['num_heads']} heads / {m['num_kv_heads']} KV heads · "
                                f"head_dim {m['head_dim']}{rope}{moe}"))
    for note in c["notes"]:
        console.print(f"  {note}", highlight=False)
    table = Table(title="tensors read per layer", title_justify="left")
    for column in ("layer", "role", "tensor", "shape", "dtype"):
        table.add_column(column)
    for layer in c["layers"]:
        for i, t in enumerate(layer["tensors"]):
            table.add_row(str(layer["layer"]) if i == 0 else "", t["role"], t["name"], "x".join(map(str, t["shape"])),
                          t["dtype"])
    console.print(table)
