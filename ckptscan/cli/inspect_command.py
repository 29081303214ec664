"""`ckptscan inspect CKPT_OR_RUN`: what ckptscan sees, to debug a mapping.

Prints the format, the model family, layers, heads / KV heads / head_dim,
experts and top-k with where each number came from, and the exact tensors
each layer reads (role, shape, stored dtype); for a run directory also the
checkpoints in step order, what was skipped, and its side files (the probe,
the loss log) named as what they are. When no layout fits, it
prints the tensor-name patterns and exits 2.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ckptscan.cli.app import command, err, head_overrides, out, parse_indices, user_errors

if TYPE_CHECKING:
    from rich.console import Console

# The `inspect --json` document's own schema version (keys: schema_version,
# tool, kind, path, checkpoint, and run for a run directory).
INSPECT_SCHEMA_VERSION = 1


@command
def inspect(
    # str, not Path: a URL (s3://bucket/run/) must keep its "//".
    path: Annotated[str, typer.Argument(
        metavar="PATH", help="A checkpoint (directory or file) or a run directory of checkpoints; local or a URL "
        "(s3://, gs://, ...).")],
    *,  # the options, in --help order; a bare name is a shared option (cli.options)
    json_path,
    output: Annotated[str, typer.Option("--format", metavar="[table|json]", help="Print as a table or JSON.")] =
    "table",
    num_heads, num_kv_heads, head_dim, model_config, layers, tensor_map,
) -> None:
    """Show the format, model family, head geometry and the tensors each layer reads."""
    with user_errors():
        from ckptscan import __version__
        from ckptscan.cli.destinations import json_to_stdout
        from ckptscan.system.output import write_output
        from ckptscan.errors import CkptScanError
        from ckptscan.pipeline.inspection import inspect_path
        from ckptscan.layouts import load_tensor_map

        if output not in ("table", "json"):
            raise CkptScanError(f"--format must be 'table' or 'json', not {output!r}")
        from ckptscan.cli.destinations import check_file_outputs

        check_file_outputs({"--json": json_path})
        description = inspect_path(
            path,
            head_overrides(num_heads, num_kv_heads, head_dim, model_config),
            load_tensor_map(tensor_map) if tensor_map is not None else None,
            parse_indices(layers),
        )
        document = {"schema_version": INSPECT_SCHEMA_VERSION, "tool": {"name": "ckptscan", "version": __version__},
                    **description}
        text = json.dumps(document, indent=2, default=str) + "\n"
        to_stdout = json_to_stdout(json_path)
        if json_path is not None:
            try:
                write_output(json_path, text)
            except OSError as e:
                raise CkptScanError(f"cannot write the JSON file: {e.strerror or e}", path=json_path) from None
            if not to_stdout:
                err().print(f"wrote {json_path}", highlight=False)
        if output == "json" and not to_stdout:
            out().print(text, end="", highlight=False, markup=False, soft_wrap=True)
        elif output != "json":
            # With --json -, stdout carries the JSON alone; the table goes to stderr.
            _print(err() if to_stdout else out(), description)
        error = description["checkpoint"].get("error")
        if error is not None:
            raise CkptScanError(error)
    raise typer.Exit(0)


def _print(console: Console, description: dict[str, Any]) -> None:
    if description["kind"] == "run":
        _print_run(console, description)
    _print_checkpoint(console, description["checkpoint"], newest=description["kind"] == "run")


def _print_run(console: Console, description: dict[str, Any]) -> None:
    from rich.table import Table
    from rich.text import Text

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
    for note in run.get("notes", []):
        console.print(Text.assemble(("note ", "cyan"), note))
    for side in run.get("side_files", []):
        console.print(Text.assemble(("side file ", "cyan"), f"{side['path']}: {side['role']}"), highlight=False)


def _print_checkpoint(console: Console, c: dict[str, Any], newest: bool) -> None:
    from rich.table import Table
    from rich.text import Text

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
