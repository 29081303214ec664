"""The shared pieces of every command: the app, exit codes, consoles, errors,
and the flags read as the library's arguments (the options themselves are
declared in `cli.options`, the groups of outputs in `cli.outputs`, what they
write in `cli.destinations`, the gate in `cli.gate`).

Exit codes (a public interface, the same for every command): 0 healthy; 1
the gate failed (the verdict reached --fail-on), its reason on stderr; 2 a
usage, input or internal error, in one line on stderr (an unexpected
exception too: `ckptscan.cli.crash`; `--debug` shows its traceback); 130
interrupted (Ctrl-C, SIGTERM). A reader of stdout that goes away (`| head`)
changes none of them: the command finishes quietly with its own
(`ckptscan.cli.streams`).

This module and the command modules import neither torch nor the library at
import time: `ckptscan --help`, `--version` and shell completion answer in a
fraction of a second. Each command imports what it runs inside its body.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Iterator

import typer
# typer parses with its own copy of click: its usage errors and contexts are these, not the click package's.
from typer._click.core import Context as ClickContext
from typer._click.exceptions import ClickException, UsageError
from typer.core import TyperCommand, TyperGroup

from ckptscan import __version__
from ckptscan.cli.options import Command, Precision, shared_options
from ckptscan.errors import CkptScanError

if TYPE_CHECKING:
    from rich.console import Console

    from ckptscan.layouts import HeadOverrides
    from ckptscan.pipeline.request import SideFile
    from ckptscan.scan import ScanOptions

# Options that take several values after one flag (--reference A/ B/ C/).
MANY_VALUED = ("--reference",)


def spread_values(command: Any, args: list[str]) -> list[str]:
    """`args` of `command` with each MANY_VALUED flag's values repeated as
    flags (`--reference A B` -> `--reference A --reference B`), as click
    parses them. A flag's values are the words after it up to the next
    option; the command's arguments keep theirs: `trend --reference A RUN`
    is one reference and the run, as before, `trend RUN --reference A B`
    two references. `command`: a click command (typer's own click's)."""
    takes_value = {name for p in command.params if p.param_type_name == "option" and not p.is_flag and not p.count
                   for name in p.opts}
    arguments = sum(1 for p in command.params if p.param_type_name == "argument" and p.required)
    words: list[tuple[str, str | None]] = []  # (word, the many-valued flag it is a value of)
    positional, i = 0, 0
    while i < len(args):
        word = args[i]
        if word == "--":
            words += [(w, None) for w in args[i:]]
            positional += len(args) - i - 1
            break
        if word in MANY_VALUED:
            i += 1
            while i < len(args) and not args[i].startswith("-"):
                words.append((args[i], word))
                i += 1
            continue
        words.append((word, None))
        if word in takes_value and i + 1 < len(args):
            words.append((args[i + 1], None))
            i += 1
        elif not word.startswith("-"):
            positional += 1
        i += 1
    # Too few arguments left for the command: the last values were its arguments.
    for k in range(len(words) - 1, -1, -1):
        if positional >= arguments:
            break
        word, flag = words[k]
        if flag is not None and k > 0 and words[k - 1][1] == flag:  # a flag keeps its first value
            words[k] = (word, None)
            positional += 1
    spread: list[str] = []
    for word, flag in words:
        spread += [flag, word] if flag is not None else [word]
    return spread


class Commands(TyperGroup):
    """The app's commands, their MANY_VALUED flags spread before parsing."""

    def resolve_command(self, ctx: ClickContext, args: list[str]) -> tuple[str | None, Any, list[str]]:
        name, found, rest = super().resolve_command(ctx, args)
        return name, found, spread_values(found, rest) if found is not None else rest


class OneLineUsageError(UsageError):
    """A usage error as one line on stderr, `error: ...` like every other input error (exit 2)."""

    def show(self, file: Any = None) -> None:
        typer.echo(f"error: {self.message} (see --help)", file=file, err=True)


class OneLineErrors(TyperCommand):
    """A command whose bad options and arguments are one line: click's usage preamble and the
    validator's prefix ("Value error, " from typer's pydantic conversion) are not the user's business."""

    def make_context(self, info_name: str | None, args: list[str], parent: ClickContext | None = None,
                     **extra: Any) -> ClickContext:
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except UsageError as e:
            message = e.format_message().replace("Value error, ", "").rstrip(".")
            raise OneLineUsageError(message, e.ctx) from None


app = typer.Typer(
    cls=Commands,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Plain click formatting: help and usage errors without rich's panels
    # (a usage error stays a few plain lines that logs and greps keep), and
    # without importing rich just to print --help.
    rich_markup_mode=None,
    help="Catch LLM training instability in saved checkpoints before the loss curve shows it.",
)

EXIT_OK, EXIT_GATE, EXIT_INPUT, EXIT_INTERRUPT = 0, 1, 2, 130


def command(function: Command) -> Command:
    """Register `function` as the command of its name, its bare parameters
    being shared options (`cli.options.shared_options`). The command list of
    `ckptscan --help` shows its docstring's first paragraph whole (click
    would cut it at ~45 characters with "...")."""
    summary = " ".join((function.__doc__ or "").strip().split("\n\n")[0].split())
    return app.command(short_help=summary, cls=OneLineErrors)(shared_options(function))


_consoles: dict[str, Console] = {}


# The width of a report written to a pipe or a file without COLUMNS: wide
# enough that no line is ever wrapped (each is as long as it is; the trend
# table's sparklines stop growing at their full length).
UNWRAPPED_WIDTH = 10_000


def out() -> Console:
    """stdout, for the report (`report_console`)."""
    if "out" not in _consoles:
        _consoles["out"] = report_console()
    return _consoles["out"]


def report_console(stderr: bool = False) -> Console:
    """A console for a report: a terminal's width, or COLUMNS when set (as
    rich reads it); piped output (CI logs, files) has no width to respect and
    is not wrapped at all. markup=False: printed names come from files."""
    import os

    from ckptscan.cli.streams import Console  # quiet, not exit 1, when the reader leaves (`| head`)

    console = Console(stderr=stderr, markup=False)
    if console.is_terminal or os.environ.get("COLUMNS", "").isdigit():
        return console
    return Console(stderr=stderr, markup=False, width=UNWRAPPED_WIDTH, soft_wrap=True)


def err() -> Console:
    """stderr; soft_wrap: an error is one line however long its path."""
    if "err" not in _consoles:
        from ckptscan.cli.streams import Console

        _consoles["err"] = Console(stderr=True, soft_wrap=True, markup=False)
    return _consoles["err"]


def note(message: str, style: str = "dim", quiet: bool = False) -> None:
    if not quiet:
        err().print(message, highlight=False, style=style)


# The report files this command has written so far (`wrote`), for the line
# an interrupt prints: Ctrl-C while the HTML renders comes after the JSON.
_written: list[str] = []


def wrote(path: object) -> None:
    """Record a report file as written (`user_errors` names it if interrupted)."""
    _written.append(str(path))


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn input problems, Ctrl-C and unexpected exceptions (a bug, here or
    in a worker thread) into one clear line and an exit code: 2, 130, 2.
    Entered once per command: its consoles are made afresh (COLUMNS and
    whether stdout is a terminal are read for each command run in-process)."""
    _written.clear()
    _consoles.clear()
    try:
        yield
    except (typer.Exit, typer.Abort, ClickException):  # the command's own exit code, click's usage errors
        raise
    except CkptScanError as e:
        from rich.text import Text

        # Text, not markup: a tensor or path named "[/x]" must print as itself.
        err().print(Text.assemble(("error:", "bold red"), f" {e}"), highlight=False)
        raise typer.Exit(EXIT_INPUT) from None
    except KeyboardInterrupt as e:
        from ckptscan.system.interrupts import Terminated

        # SIGTERM arrives as Terminated, a KeyboardInterrupt (ckptscan.system.interrupts).
        how = "interrupted by SIGTERM" if isinstance(e, Terminated) else "interrupted"
        done = f"only {', '.join(_written)} written" if _written else "no report was written"
        err().print(f"{how}: {done}", highlight=False)
        raise typer.Exit(EXIT_INTERRUPT) from None
    except Exception as e:  # noqa: BLE001  a bug is one line and exit 2, never the gate's 1 with a traceback
        from ckptscan.cli import crash

        raise typer.Exit(crash.report(e, _command_name())) from None


def _command_name() -> str:
    """"ckptscan diff", for the command running now."""
    from typer._click.globals import get_current_context

    context = get_current_context(silent=True)  # the command's (click's command_path starts with how Python ran)
    return f"ckptscan {context.info_name}" if context is not None and context.parent is not None else "ckptscan"


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
    *,
    overrides: HeadOverrides | None = None,
    layers: str | None = None,
    device: str = "cpu",
    heads: str | None = None,
    full_spectrum: bool = False,
    tensor_map: Path | None = None,
) -> ScanOptions:
    """The flags that decide how metrics are computed, as ScanOptions
    (`overrides`: the geometry flags, `head_overrides`)."""
    import torch

    from ckptscan.layouts import HeadOverrides, load_tensor_map
    from ckptscan.scan import ScanOptions, resolve_device

    precision = Precision(precision)
    return ScanOptions(
        compute_dtype=torch.float64 if precision is Precision.float64 else torch.float32,
        overrides=overrides or HeadOverrides(),
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


def side_file(given: str | Path | None, off: bool = False) -> SideFile:
    """A side file's flags as the request's value: --no-X switches it off
    (None), one not given is the run's own (AUTO)."""
    from ckptscan.pipeline.request import AUTO

    return None if off else given or AUTO


def _version(value: bool) -> None:
    if value:
        print(f"ckptscan {__version__}")
        raise typer.Exit(EXIT_OK)


EXIT_CODES = ("Exit codes, for every command: 0 healthy; 1 the gate failed (the verdict reached --fail-on), "
              "its reason on stderr; 2 a usage, input or internal error, in one line on stderr; 130 interrupted. "
              "A reader of stdout that stops early (| head) changes none of them.")


@app.callback(epilog=EXIT_CODES)
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
    debug: Annotated[bool, typer.Option(
        "--debug", help="On an internal error, print its traceback before the one line (also: CKPTSCAN_DEBUG=1).")
    ] = False,
) -> None:
    """Catch LLM training instability in saved checkpoints before the loss curve shows it."""
    from ckptscan.cli import crash

    crash.debug = debug  # set for every command run, in-process runs too
