"""The shared pieces of every command: the app, options, consoles, the gate.

Exit codes (a public interface): 0 healthy, 1 the gate failed (the verdict
reached --fail-on), 2 usage or input error, 130 interrupted.

This module and the command modules import neither torch nor the library at
import time: `ckptscan --help`, `--version` and shell completion answer in a
fraction of a second. Each command imports what it runs inside its body.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Callable, Iterator, Optional

import typer

from ckptscan import __version__
from ckptscan.errors import CkptScanError

if TYPE_CHECKING:
    from rich.console import Console

    from ckptscan.layouts import HeadOverrides
    from ckptscan.results import ScanReport
    from ckptscan.scan import ScanOptions

app = typer.Typer(
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Plain click formatting: help and usage errors without rich's panels
    # (a usage error stays a few plain lines that logs and greps keep), and
    # without importing rich just to print --help.
    rich_markup_mode=None,
    help="Catch LLM training instability in saved checkpoints before the loss curve shows it.",
)

EXIT_OK, EXIT_GATE, EXIT_INPUT, EXIT_INTERRUPT = 0, 1, 2, 130


class Format(str, Enum):
    table = "table"
    json = "json"
    markdown = "markdown"
    junit = "junit"


class Precision(str, Enum):
    float32 = "float32"
    float64 = "float64"


class FailOn(str, Enum):
    warn = "warn"
    alert = "alert"


class Base(str, Enum):
    previous = "previous"
    first = "first"


class ExecutorName(str, Enum):
    local = "local"
    ray = "ray"


_consoles: dict[str, Console] = {}


def out() -> Console:
    """stdout. Piped output (CI logs, files) has no width to respect: the
    table is not squeezed. markup=False: printed names come from files."""
    if "out" not in _consoles:
        from rich.console import Console

        _consoles["out"] = Console(markup=False) if Console().is_terminal else Console(width=160, markup=False)
    return _consoles["out"]


def err() -> Console:
    """stderr; soft_wrap: an error is one line however long its path."""
    if "err" not in _consoles:
        from rich.console import Console

        _consoles["err"] = Console(stderr=True, soft_wrap=True, markup=False)
    return _consoles["err"]


def note(message: str, style: str = "dim", quiet: bool = False) -> None:
    if not quiet:
        err().print(message, highlight=False, style=style)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn input problems and Ctrl-C into one clear line and an exit code."""
    try:
        yield
    except CkptScanError as e:
        from rich.text import Text

        # Text, not markup: a tensor or path named "[/x]" must print as itself.
        err().print(Text.assemble(("error:", "bold red"), f" {e}"), highlight=False)
        raise typer.Exit(EXIT_INPUT) from None
    except KeyboardInterrupt as e:
        from ckptscan.interrupts import Terminated

        # SIGTERM arrives as Terminated, a KeyboardInterrupt (ckptscan.interrupts).
        how = "interrupted by SIGTERM" if isinstance(e, Terminated) else "interrupted"
        err().print(f"{how}: no report was written", highlight=False)
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
    precision: Precision | str = Precision.float32,
    num_heads: int | None = None,
    num_kv_heads: int | None = None,
    head_dim: int | None = None,
    layers: str | None = None,
    device: str = "cpu",
    heads: str | None = None,
    full_spectrum: bool = False,
    tensor_map: Path | None = None,
    model_config: Path | None = None,
) -> ScanOptions:
    """The flags that decide how metrics are computed, as ScanOptions."""
    import torch

    from ckptscan.layouts import load_tensor_map
    from ckptscan.scan import ScanOptions, resolve_device

    precision = Precision(precision)
    return ScanOptions(
        compute_dtype=torch.float64 if precision is Precision.float64 else torch.float32,
        overrides=head_overrides(num_heads, num_kv_heads, head_dim, model_config),
        layers=parse_indices(layers),
        device=resolve_device(device),
        heads=parse_indices(heads, "--heads"),
        full_spectrum=full_spectrum,
        tensor_map=load_tensor_map(tensor_map) if tensor_map is not None else None,
    )


def head_overrides(num_heads: int | None, num_kv_heads: int | None, head_dim: int | None,
                   model_config: Path | None) -> HeadOverrides:
    """The geometry flags, with --model-config read and checked up front."""
    from ckptscan.layouts import HeadOverrides, load_model_config

    return HeadOverrides(num_heads, num_kv_heads, head_dim,
                         load_model_config(model_config) if model_config is not None else None)


def run_arguments(stride: int, base: Base | str, probe: str | Path | None, no_probe: bool, loss_log: str | Path | None,
                  no_loss_log: bool, reference: Path | None, config: Path | None, settings: list[str] | None
                  ) -> dict[str, object]:
    """The flags of a run command (trend, watch) as `resolve_run`'s arguments:
    a side file not given is the run's own (AUTO), --no-X switches it off."""
    from ckptscan.run import AUTO

    return {"stride": stride, "base": Base(base).value, "probe": None if no_probe else probe or AUTO,
            "loss_log": None if no_loss_log else loss_log or AUTO, "reference": reference,
            "config": config if config is not None else AUTO, "settings": settings or ()}


def gate(report: ScanReport, fail_on: FailOn | str) -> int:
    """Exit code of the CI gate, with the reason printed either way."""
    from ckptscan.results import SEVERITIES

    fail_on = FailOn(fail_on).value
    status = report.summary.status
    failed = status in SEVERITIES and SEVERITIES.index(status) >= SEVERITIES.index(fail_on)
    verdict = "failed" if failed else "passed"
    err().print(f"gate {verdict} (--fail-on {fail_on}): {report.summary.message}", highlight=False)
    return EXIT_GATE if failed else EXIT_OK


def emit(report: ScanReport, output: Format | str, json_path: Path | None, markdown_path: Path | None,
         print_table: Callable[[Console, ScanReport], None], junit_path: Path | None = None,
         fail_on: FailOn | str = FailOn.alert) -> None:
    """The report on stdout in the chosen format, the JSON and JUnit files, the
    Markdown summary (appended to --markdown-summary, else to $GITHUB_STEP_SUMMARY
    when set), and GitHub annotations on stderr when GITHUB_ACTIONS=true.
    `fail_on` (the gate level) decides what a JUnit failure and an error annotation are.

    `--json -` puts the JSON report on stdout, alone, for a pipe; the chosen
    format then goes to stderr (nothing more for --format json). Every write
    goes through `ckptscan.output`; a failed one is one line and exit 2.
    """
    from rich.console import Console

    from ckptscan.output import STDOUT, own_descriptor, write_output
    from ckptscan.report.annotations import github_annotations
    from ckptscan.report.json import report_json, write_json
    from ckptscan.report.junit import junit_xml, write_junit
    from ckptscan.report.markdown import append_markdown, markdown_report

    output, fail_on = Format(output), FailOn(fail_on).value
    junit = junit_xml(report, fail_on) if output is Format.junit or junit_path is not None else ""
    json_to_stdout = json_path is not None and own_descriptor(str(json_path)) == 1
    text_path = "/dev/stderr" if json_to_stdout else STDOUT
    try:
        if output is Format.json and not json_to_stdout:
            write_output(STDOUT, report_json(report))
        elif output is Format.markdown:
            write_output(text_path, markdown_report(report))
        elif output is Format.junit:
            write_output(text_path, junit)
        elif output is Format.table:
            console = (Console(stderr=True, markup=False) if err().is_terminal else
                       Console(stderr=True, width=160, markup=False)) if json_to_stdout else out()
            print_table(console, report)
            console.file.flush()
    except OSError as e:
        where = "stdout" if text_path == STDOUT else text_path
        raise CkptScanError(f"cannot write the report: {e.strerror or e}", path=where) from None
    if json_path is not None:
        write_json(report, json_path)
    if junit_path is not None:
        write_junit(junit, junit_path)
    if os.environ.get("GITHUB_ACTIONS") == "true":
        # Raw lines: the runner must see each command whole, unwrapped and unstyled.
        sys.stderr.write("".join(line + "\n" for line in github_annotations(report, fail_on)))
        sys.stderr.flush()
    summary_path = markdown_path or os.environ.get("GITHUB_STEP_SUMMARY")
    if summary_path:
        try:
            append_markdown(report, summary_path)
        except OSError as e:
            raise CkptScanError(f"cannot append the Markdown summary: {e.strerror or e}", path=summary_path) from None


# One declaration per option, shared by every command that takes it, so an
# option has the same name, default and meaning everywhere.
NumHeads = Annotated[Optional[int], typer.Option("--num-heads", help="Query heads, when the checkpoint carries "
                                                 "no config.")]
NumKvHeads = Annotated[Optional[int], typer.Option("--num-kv-heads", help="KV heads (GQA/MQA), when the checkpoint "
                                                   "carries no config.")]
ModelConfigFile = Annotated[Optional[Path], typer.Option(
    "--model-config", help="The model's config when the checkpoint carries none: a Hugging Face config.json, a "
    "litgpt model_config.yaml or a torchtitan job .toml (its model name and flavor); it takes precedence over a "
    "config found with the checkpoint.")]
HeadDim = Annotated[Optional[int], typer.Option("--head-dim", help="Head dimension, when it is not hidden/heads.")]
TensorMapFile = Annotated[Optional[Path], typer.Option(
    "--tensor-map", help="TOML/JSON file mapping tensor-name regexes to roles (q, k, q_norm, k_norm, router, ...) "
    "for naming schemes ckptscan does not know.")]
Layers = Annotated[Optional[str], typer.Option("--layers", help="Only these layers, e.g. '0,3,8-11'.")]
PrecisionOpt = Annotated[Precision, typer.Option("--precision", help="Gram products in float32 (fast) or float64 "
                                                 "(exact path).")]
FailOnOpt = Annotated[Optional[FailOn], typer.Option("--fail-on", help="Exit 1 when the verdict reaches this "
                                                     "(default: fail_on from the config, else alert).")]
JsonOut = Annotated[Optional[Path], typer.Option("--json", help="Write the JSON report here (atomically; '-' for "
                                                "stdout, the table then going to stderr).")]
ConfigFile = Annotated[Optional[Path], typer.Option(
    "--config", help="Thresholds file: ckptscan.toml, or pyproject.toml with a [tool.ckptscan] table "
    "(default: the nearest one from the current directory up).")]
SetThreshold = Annotated[Optional[list[str]], typer.Option(
    "--set", help="Override a setting, KEY=VALUE (repeatable), e.g. --set alert_sigma=5.")]
FormatOpt = Annotated[Format, typer.Option("--format", help="Report on stdout as a table, JSON, Markdown or JUnit "
                                           "XML.")]
JunitOut = Annotated[Optional[Path], typer.Option(
    "--junit", help="Write a JUnit XML report here (atomically): one test case per layer and family, failing at the "
    "gate level.")]
TensorBoardDir = Annotated[Optional[Path], typer.Option(
    "--tensorboard", help="Append the monitors, per-family summaries and findings to TensorBoard event files in "
    "this directory (new steps only; needs pip install 'ckptscan[tensorboard]').")]
MarkdownSummary = Annotated[Optional[Path], typer.Option(
    "--markdown-summary", help="Append a Markdown summary here (default: $GITHUB_STEP_SUMMARY when set).")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar and no notes on stderr.")]
Device = Annotated[str, typer.Option("--device", metavar="[cpu|cuda|cuda:N|auto]",
                                     help="Where the math runs (auto: cuda when present).")]
Heads = Annotated[Optional[str], typer.Option("--heads", help="Only these query heads (and their KV heads), e.g. "
                                              "'0-3,17'; only their rows are read.")]
FullSpectrum = Annotated[bool, typer.Option("--full-spectrum", help="Also whole-matrix ΔW_q/ΔW_k spectra (O(d³) "
                                            "per layer: slow on large models).")]
HtmlOut = Annotated[Optional[Path], typer.Option("--html", help="Write a self-contained HTML report with figures "
                                                 "here (needs matplotlib: pip install 'ckptscan[report]').")]
PngDir = Annotated[Optional[Path], typer.Option("--png", help="Write the report's figures as PNG files into this "
                                                "directory.")]
Stride = Annotated[int, typer.Option("--stride", help="Use every N-th checkpoint (from the first).")]
BaseOpt = Annotated[Base, typer.Option("--base", help="previous: each checkpoint against the one before; first: each "
                                       "against the first.")]
NoLossLog = Annotated[bool, typer.Option("--no-loss-log", help="Use no loss log, not even the run's own.")]
NoProbe = Annotated[bool, typer.Option("--no-probe", help="Use no probe, not even the run's own.")]
# str, not Path: a URL (s3://bucket/run/probe.safetensors) must keep its "//".
RunProbe = Annotated[Optional[str], typer.Option(
    "--probe", help="Router inputs (safetensors, keys layers.{i}.router_input [T, d]) for routing entropy "
    "and expert load (default: RUN_DIR/probe.safetensors when present).")]
CacheDir = Annotated[Optional[Path], typer.Option(
    "--cache-dir", help="Where per-pair results are cached (default: $XDG_CACHE_HOME/ckptscan or ~/.cache/ckptscan).")]
Reference = Annotated[Optional[Path], typer.Option(
    "--reference", help="JSON report (ckptscan trend --json) of a known-healthy run of the same model and schedule "
    "to compare with.")]


def _version(value: bool) -> None:
    if value:
        print(f"ckptscan {__version__}")
        raise typer.Exit(EXIT_OK)


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """Catch LLM training instability in saved checkpoints before the loss curve shows it."""
