"""The shared pieces of every command: the app, consoles, options, the gate.

Exit codes (a public interface): 0 healthy, 1 the gate failed (the verdict
reached --fail-on), 2 usage or input error, 130 interrupted.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import torch
import typer
from rich.console import Console
from rich.text import Text

from ckptscan.config import Config, load_config
from ckptscan.errors import CkptScanError
from ckptscan.interrupts import Terminated
from ckptscan.layouts import HeadOverrides, load_tensor_map
from ckptscan.output import STDOUT, own_descriptor, write_output
from ckptscan.probe import load_probe
from ckptscan.report.json import report_json, write_json
from ckptscan.report.markdown import append_markdown, markdown_report
from ckptscan.results import SEVERITIES, ScanReport
from ckptscan.scan import ScanOptions, resolve_device

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Catch LLM training instability in saved checkpoints before the loss curve shows it.",
)
# Piped output (CI logs, files) has no width to respect: don't squeeze the table.
# markup=False: what is printed comes from files (paths, tensor names, skip
# reasons); "[/x]" in a name must print as itself, not crash or restyle the
# line. Styling goes through Text and style= instead.
out = Console(markup=False) if Console().is_terminal else Console(width=160, markup=False)
# soft_wrap: an error is one line however long its path, so logs and greps keep it whole.
err = Console(stderr=True, soft_wrap=True, markup=False)

EXIT_OK, EXIT_GATE, EXIT_INPUT, EXIT_INTERRUPT = 0, 1, 2, 130
PRECISIONS = {"float32": torch.float32, "float64": torch.float64}
FORMATS = ("table", "json", "markdown")


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn input problems and Ctrl-C into one clear line and an exit code."""
    try:
        yield
    except CkptScanError as e:
        # Text, not markup: a tensor or path named "[/x]" must print as itself.
        err.print(Text.assemble(("error:", "bold red"), f" {e}"), highlight=False)
        raise typer.Exit(EXIT_INPUT) from None
    except KeyboardInterrupt as e:
        # SIGTERM arrives as Terminated, a KeyboardInterrupt (ckptscan.interrupts).
        how = "interrupted by SIGTERM" if isinstance(e, Terminated) else "interrupted"
        err.print(f"{how}: no report was written", highlight=False)
        raise typer.Exit(EXIT_INTERRUPT) from None


def parse_indices(spec: str | None, flag: str = "--layers") -> list[int] | None:
    """'0,3,8-11' -> [0, 3, 8, 9, 10, 11]: the --layers and --heads lists."""
    if not spec:
        return None
    indices: list[int] = []
    try:
        for part in spec.split(","):
            lo, _, hi = part.strip().partition("-")
            indices.extend(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise CkptScanError(f"{flag}: cannot parse {spec!r} (expected e.g. '0,3,8-11')") from None
    return indices


def scan_options(
    precision: str,
    num_heads: int | None,
    num_kv_heads: int | None,
    head_dim: int | None,
    layers: str | None,
    probe: Path | None = None,
    device: str = "cpu",
    heads: str | None = None,
    full_spectrum: bool = False,
    tensor_map: Path | None = None,
) -> ScanOptions:
    if precision not in PRECISIONS:
        raise CkptScanError(f"--precision must be one of {sorted(PRECISIONS)}, not {precision!r}")
    return ScanOptions(
        compute_dtype=PRECISIONS[precision],
        overrides=HeadOverrides(num_heads, num_kv_heads, head_dim),
        layers=parse_indices(layers),
        probe=load_probe(probe) if probe is not None else None,
        device=resolve_device(device),
        heads=parse_indices(heads, "--heads"),
        full_spectrum=full_spectrum,
        tensor_map=load_tensor_map(tensor_map) if tensor_map is not None else None,
    )


def gate(report: ScanReport, fail_on: str) -> int:
    """Exit code of the CI gate, with the reason printed either way."""
    if fail_on not in ("warn", "alert"):
        raise CkptScanError(f"--fail-on must be 'warn' or 'alert', not {fail_on!r}")
    status = report.summary.status
    failed = status in SEVERITIES and SEVERITIES.index(status) >= SEVERITIES.index(fail_on)
    verdict = "failed" if failed else "passed"
    err.print(f"gate {verdict} (--fail-on {fail_on}): {report.summary.message}", highlight=False)
    return EXIT_GATE if failed else EXIT_OK


def load_settings(config: Path | None, overrides: list[str] | None) -> Config:
    """Thresholds and gate default: config file, then --set overrides."""
    return load_config(config, overrides or ())


def emit(report: ScanReport, output: str, json_path: Path | None, markdown_path: Path | None,
         print_table: Callable[[Console, ScanReport], None]) -> None:
    """The report on stdout in the chosen format, the JSON file, the Markdown
    summary (appended to --markdown-summary, else to $GITHUB_STEP_SUMMARY when set).

    `--json -` puts the JSON report on stdout, alone, for a pipe; the chosen
    format then goes to stderr (nothing more for --format json). Every write
    goes through `ckptscan.output`; a failed one is one line and exit 2.
    """
    if output not in FORMATS:
        raise CkptScanError(f"--format must be one of {list(FORMATS)}, not {output!r}")
    json_to_stdout = json_path is not None and own_descriptor(str(json_path)) == 1
    text_path = "/dev/stderr" if json_to_stdout else STDOUT
    try:
        if output == "json" and not json_to_stdout:
            write_output(STDOUT, report_json(report))
        elif output == "markdown":
            write_output(text_path, markdown_report(report))
        elif output == "table":
            console = (Console(stderr=True, markup=False) if err.is_terminal else
                       Console(stderr=True, width=160, markup=False)) if json_to_stdout else out
            print_table(console, report)
            console.file.flush()
    except OSError as e:
        where = "stdout" if text_path == STDOUT else text_path
        raise CkptScanError(f"cannot write the report: {e.strerror or e}", path=where) from None
    if json_path is not None:
        write_json(report, json_path)
    summary_path = markdown_path or os.environ.get("GITHUB_STEP_SUMMARY")
    if summary_path:
        try:
            append_markdown(report, summary_path)
        except OSError as e:
            raise CkptScanError(f"cannot append the Markdown summary: {e.strerror or e}", path=summary_path) from None


NumHeads = typer.Option(None, "--num-heads", help="Query heads, when the checkpoint carries no config.")
NumKvHeads = typer.Option(None, "--num-kv-heads", help="KV heads (GQA/MQA), when the checkpoint carries no config.")
HeadDim = typer.Option(None, "--head-dim", help="Head dimension, when it is not hidden/heads.")
TensorMapFile = typer.Option(None, "--tensor-map", help="TOML/JSON file mapping tensor-name regexes to roles (q, k, "
                             "q_norm, k_norm, router, …) for naming schemes ckptscan does not know.")
Layers = typer.Option(None, "--layers", help="Only these layers, e.g. '0,3,8-11'.")
Precision = typer.Option("float32", "--precision", help="Gram products in float32 (fast) or float64 (exact path).")
FailOn = typer.Option(None, "--fail-on", help="Exit 1 when the verdict reaches 'warn' or 'alert' "
                      "(default: fail_on from the config, else alert).")
JsonOut = typer.Option(None, "--json", help="Write the JSON report here (atomically; '-' for stdout, the table "
                       "then going to stderr).")
ConfigFile = typer.Option(None, "--config", help="Thresholds file (ckptscan.toml, or pyproject.toml with "
                          "[tool.ckptscan]); default: the nearest one from the current directory up.")
SetThreshold = typer.Option(None, "--set", help="Override a setting, KEY=VALUE (repeatable), e.g. --set alert_sigma=5.")
Format = typer.Option("table", "--format", help="Report on stdout as 'table', 'json' or 'markdown'.")
MarkdownSummary = typer.Option(None, "--markdown-summary", help="Append a Markdown summary here "
                               "(default: $GITHUB_STEP_SUMMARY when set).")
Quiet = typer.Option(False, "--quiet", "-q", help="No progress bar and no notes on stderr.")
Device = typer.Option("cpu", "--device", help="Where the math runs: cpu, cuda, cuda:N, or auto (cuda when present).")
Heads = typer.Option(None, "--heads", help="Only these query heads (and their KV heads), e.g. '0-3,17'; "
                     "only their rows are read.")
FullSpectrum = typer.Option(False, "--full-spectrum", help="Also whole-matrix ΔW_q/ΔW_k spectra (O(d³) per layer: "
                            "slow on large models).")
Probe = typer.Option(
    None, "--probe", help="Router inputs (safetensors, keys layers.{i}.router_input [T, d]): adds routing entropy "
    "and expert load per MoE layer.",
)


@app.callback()
def _root() -> None:
    """Catch LLM training instability in saved checkpoints before the loss curve shows it."""
