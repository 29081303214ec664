"""The shared pieces of every command: the app, consoles, options, the gate.

Exit codes (a public interface): 0 healthy, 1 the gate failed (the verdict
reached --fail-on), 2 usage or input error, 130 interrupted.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
import typer
from rich.console import Console

from ckptscan.errors import CkptScanError
from ckptscan.layouts import HeadOverrides
from ckptscan.results import SEVERITIES, ScanReport
from ckptscan.scan import ScanOptions

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Catch LLM training instability in saved checkpoints before the loss curve shows it.",
)
# Piped output (CI logs, files) has no width to respect: don't squeeze the table.
out = Console() if Console().is_terminal else Console(width=160)
# soft_wrap: an error is one line however long its path, so logs and greps keep it whole.
err = Console(stderr=True, soft_wrap=True)

EXIT_OK, EXIT_GATE, EXIT_INPUT, EXIT_INTERRUPT = 0, 1, 2, 130
PRECISIONS = {"float32": torch.float32, "float64": torch.float64}


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn input problems and Ctrl-C into one clear line and an exit code."""
    try:
        yield
    except CkptScanError as e:
        err.print(f"[bold red]error:[/] {e}", highlight=False, markup=True)
        raise typer.Exit(EXIT_INPUT) from None
    except KeyboardInterrupt:
        err.print("interrupted: no report was written", highlight=False)
        raise typer.Exit(EXIT_INTERRUPT) from None


def parse_layers(spec: str | None) -> list[int] | None:
    """'0,3,8-11' -> [0, 3, 8, 9, 10, 11]."""
    if not spec:
        return None
    layers: list[int] = []
    try:
        for part in spec.split(","):
            lo, _, hi = part.strip().partition("-")
            layers.extend(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise CkptScanError(f"--layers: cannot parse {spec!r} (expected e.g. '0,3,8-11')") from None
    return layers


def scan_options(
    precision: str, num_heads: int | None, num_kv_heads: int | None, head_dim: int | None, layers: str | None
) -> ScanOptions:
    if precision not in PRECISIONS:
        raise CkptScanError(f"--precision must be one of {sorted(PRECISIONS)}, not {precision!r}")
    return ScanOptions(
        compute_dtype=PRECISIONS[precision],
        overrides=HeadOverrides(num_heads, num_kv_heads, head_dim),
        layers=parse_layers(layers),
    )


def gate(report: ScanReport, fail_on: str) -> int:
    """Exit code of the CI gate, with the reason printed either way."""
    if fail_on not in ("warn", "alert"):
        raise CkptScanError(f"--fail-on must be 'warn' or 'alert', not {fail_on!r}")
    status = report.summary.status
    failed = status in SEVERITIES and SEVERITIES.index(status) >= SEVERITIES.index(fail_on)
    if failed:
        err.print(f"gate failed (--fail-on {fail_on}): {report.summary.message}", highlight=False)
    return EXIT_GATE if failed else EXIT_OK


NumHeads = typer.Option(None, "--num-heads", help="Query heads, when the checkpoint carries no config.")
NumKvHeads = typer.Option(None, "--num-kv-heads", help="KV heads (GQA/MQA), when the checkpoint carries no config.")
HeadDim = typer.Option(None, "--head-dim", help="Head dimension, when it is not hidden/heads.")
Layers = typer.Option(None, "--layers", help="Only these layers, e.g. '0,3,8-11'.")
Precision = typer.Option("float32", "--precision", help="Gram products in float32 (fast) or float64 (exact path).")
FailOn = typer.Option("alert", "--fail-on", help="Exit 1 when the verdict reaches 'warn' or 'alert'.")
JsonOut = typer.Option(None, "--json", help="Write the JSON report here (atomically).")


@app.callback()
def _root() -> None:
    """Catch LLM training instability in saved checkpoints before the loss curve shows it."""
