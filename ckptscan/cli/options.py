"""Every option more than one command takes, declared once.

A command names the shared options it takes as bare parameters (no
annotation, no default) and `shared_options` gives each one its declaration
from `SHARED`: its flag, help, metavar and default are then the same in every
command, and the command's signature still says which options it takes and in
which order --help lists them. An option only one command takes stays declared
in that command. An option whose help says more in one command than in
another is declared here in both forms, under two names (`loss_log` and
`live_loss_log` for --loss-log).

A parameter annotated with a `Group` (`cli.outputs.TrendOutputs`: a command's
destinations) stands for the options its members declare (`Option`, beside
each destination's write, in `cli.destinations`), in member order; the command
receives their values as one instance of that group.

Every path option reaches the command with `~` and `$VAR` expanded
(`ckptscan.system.paths`): the shell leaves `--cache-dir '~/c'` and `--json=~/r.json`
as typed. Arguments that may be URLs are `str` and expanded by the library.

Only typer (and `ckptscan.system.paths`, which needs os alone) is imported here:
`ckptscan --help` must not wait for torch or rich.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Callable, ClassVar, Generic, Iterator, Optional, TypeVar, get_type_hints

import typer

from ckptscan.system.paths import expand_path


class Format(str, Enum):
    table = "table"
    json = "json"
    markdown = "markdown"
    junit = "junit"


class Precision(str, Enum):
    float32 = "float32"
    float64 = "float64"


class FailOn(str, Enum):
    """The gate's levels, in their order (ckptscan.schema.results.GATE_ORDER)."""

    warn = "warn"
    not_judged = "not_judged"
    alert = "alert"


class Base(str, Enum):
    previous = "previous"
    first = "first"


class ExecutorName(str, Enum):
    local = "local"
    ray = "ray"


NumHeads = Annotated[Optional[int], typer.Option(
    "--num-heads", metavar="N", help="Query heads, when the checkpoint carries no config.")]
NumKvHeads = Annotated[Optional[int], typer.Option(
    "--num-kv-heads", metavar="N", help="KV heads (GQA/MQA), when the checkpoint carries no config.")]
# --per-head's default: a long run's per-head results where they explain a verdict,
# and the newest pair's (`document.plain.keeps_heads`; docs/json-schema.md).
DEFAULT_PER_HEAD = "flagged+newest"
ModelConfigFile = Annotated[Optional[Path], typer.Option(
    "--model-config", metavar="FILE", help="The model's config when the checkpoint carries none: a Hugging Face "
    "config.json, a litgpt model_config.yaml or a torchtitan job .toml (its model name and flavor); it takes "
    "precedence over a config found with the checkpoint.")]
HeadDim = Annotated[Optional[int], typer.Option(
    "--head-dim", metavar="N", help="Head dimension, when it is not hidden/heads.")]
TensorMapFile = Annotated[Optional[Path], typer.Option(
    "--tensor-map", metavar="FILE", help="TOML/JSON file mapping tensor-name regexes to roles (q, k, q_norm, k_norm, "
    "router, ...) for naming schemes ckptscan does not know.")]
Layers = Annotated[Optional[str], typer.Option("--layers", metavar="LAYERS",
                                               help="Only these layers, e.g. '0,3,8-11'.")]
PrecisionOpt = Annotated[Precision, typer.Option("--precision", help="Gram products in float32 (fast) or float64 "
                                                 "(exact path).")]
FailOnOpt = Annotated[Optional[FailOn], typer.Option(
    "--fail-on", help="Exit 1 when the verdict reaches this level, in the order warn < not_judged < alert: warn "
    "fails any warning, not_judged an alert or a run no pair of which could be judged yet (warm-up, no baseline), "
    "alert only an alert (default: fail_on from the config, else alert).")]
ConfigFile = Annotated[Optional[Path], typer.Option(
    "--config", metavar="FILE", help="Thresholds file: ckptscan.toml, or pyproject.toml with a [tool.ckptscan] table "
    "(default: the nearest one from the current directory up).")]
SetThreshold = Annotated[Optional[list[str]], typer.Option(
    "--set", metavar="KEY=VALUE", help="Override a setting (repeatable), e.g. --set alert_sigma=5.")]
Wide = Annotated[bool, typer.Option(
    "--wide", help="Every column of the terminal table (each monitor's newest value and its baseline or ceiling "
    "in trend, every monitor of the pair in diff); by default it fits 80-120 columns, and the JSON and HTML reports "
    "have every value.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar and no notes on stderr.")]
Device = Annotated[str, typer.Option("--device", metavar="[cpu|cuda|cuda:N|auto]",
                                     help="Where the math runs (auto: cuda when present).")]
Heads = Annotated[Optional[str], typer.Option(
    "--heads", metavar="HEADS", help="Only these query heads (and their KV heads), e.g. '0-3,17'; only their rows are "
    "read.")]
FullSpectrum = Annotated[bool, typer.Option("--full-spectrum", help="Also whole-matrix ΔW_q/ΔW_k spectra (O(d³) "
                                            "per layer: slow on large models).")]
# The run a command follows (str, not Path: a URL prefix, s3://bucket/run/, must keep its "//").
RunDir = Annotated[str, typer.Argument(
    metavar="RUN_DIR", help="Run directory holding checkpoint-N/ (or step-N/, iter_N/ ...) folders; local or a "
    "URL prefix (s3://, gs://, ...).")]
LiveRunDir = Annotated[str, typer.Argument(
    metavar="RUN_DIR", help="Run directory the training job saves checkpoint-N/ (or step-N/, iter_N/ ...) folders "
    "into.")]
Stride = Annotated[int, typer.Option("--stride", metavar="N", help="Use every N-th checkpoint (from the first).")]
BaseOpt = Annotated[Base, typer.Option("--base", help="previous: each checkpoint against the one before; first: each "
                                       "against the first.")]
NoLossLog = Annotated[bool, typer.Option("--no-loss-log", help="Use no loss log, not even the run's own.")]
NoProbe = Annotated[bool, typer.Option("--no-probe", help="Use no probe, not even the run's own.")]
# str, not Path: a URL (s3://bucket/run/probe.safetensors) must keep its "//".
RunProbe = Annotated[Optional[str], typer.Option(
    "--probe", metavar="FILE", help="Router inputs (safetensors, keys layers.{i}.router_input [T, d]) for routing "
    "entropy and expert load (default: RUN_DIR/probe.safetensors when present).")]
# --loss-log and --no-cache mean a little more in watch, which reads the log
# again at each new checkpoint and computes each pair once while it runs.
_LOSS_LOG = "Loss log (JSON Lines or CSV with step, loss; default: RUN_DIR/train_log.jsonl when present)"
LossLog = Annotated[Optional[str], typer.Option("--loss-log", metavar="FILE", help=_LOSS_LOG + ".")]
LiveLossLog = Annotated[Optional[str], typer.Option(
    "--loss-log", metavar="FILE", help=_LOSS_LOG + ", read again at each new checkpoint.")]
NoCache = Annotated[bool, typer.Option("--no-cache", help="Compute every pair; read and write no cache.")]
NoDiskCache = Annotated[bool, typer.Option("--no-cache", help="Read and write no cache on disk (each pair is "
                                           "still computed only once while watching).")]
CacheDir = Annotated[Optional[Path], typer.Option(
    "--cache-dir", metavar="DIR", help="Where per-pair results are cached (default: $XDG_CACHE_HOME/ckptscan or "
    "~/.cache/ckptscan).")]
# str, not Path: a URL (s3://bucket/run/) must keep its "//". Several values
# after one flag are spread into repeated flags before click parses them
# (`cli.app.spread_values`).
Reference = Annotated[Optional[list[str]], typer.Option(
    "--reference", metavar="RUN|REPORT", help="A known-healthy run of the same model and schedule to compare with: "
    "its JSON report (ckptscan trend --json), its run directory (scanned like this one, cached) or a URL (s3://, "
    "gs://, az://, hf://) of either. Several (--reference A/ B/ C/, or the flag repeated) make a band: the spread "
    "of healthy runs at each step. A reference that alerts itself (against the others; alone, on its own "
    "history) is left out, with a note.")]


# Parameter name -> (declaration, default). The name is the one every command
# uses for the option. A destination's options are declared with it instead
# (`Option`, in its module under `cli.destinations`).
SHARED: dict[str, tuple[Any, Any]] = {
    "fail_on": (FailOnOpt, None), "config": (ConfigFile, None), "set_": (SetThreshold, None),
    "quiet": (Quiet, False), "wide": (Wide, False), "num_heads": (NumHeads, None), "num_kv_heads": (NumKvHeads, None),
    "head_dim": (HeadDim, None), "model_config": (ModelConfigFile, None), "layers": (Layers, None),
    "precision": (PrecisionOpt, Precision.float32), "device": (Device, "cpu"), "heads": (Heads, None),
    "full_spectrum": (FullSpectrum, False), "tensor_map": (TensorMapFile, None), "reference": (Reference, None),
    "stride": (Stride, 1), "base": (BaseOpt, Base.previous), "loss_log": (LossLog, None),
    "live_loss_log": (LiveLossLog, None), "no_loss_log": (NoLossLog, False), "probe": (RunProbe, None),
    "no_probe": (NoProbe, False), "cache_dir": (CacheDir, None), "no_cache": (NoCache, False),
    "no_disk_cache": (NoDiskCache, False),
}

# A destination's options by name, as each declares itself: a command may also
# take one as a bare parameter (inspect's --json).
DECLARED: dict[str, Option[Any]] = {}
T = TypeVar("T")
Command = TypeVar("Command", bound=Callable[..., Any])


class Option(Generic[T]):
    """One flag of a destination, declared beside its write: the parameter
    `name` a command receives it under, the `flag`, its type (`kind`), the
    `default`, the `help` --help shows and the `metavar`; `extra`: typer's
    other settings (min, max). Its value is read from a command's group by
    the option itself (`group[JSON]`), never by a name."""

    def __init__(self, name: str, flag: str, kind: Any, default: T, help: str, metavar: str | None = None,
                 **extra: Any) -> None:
        self.name, self.flag, self.default = name, flag, default
        declared = typer.Option(flag, help=help, metavar=metavar, **extra)
        self.annotation: Any = Annotated[kind, declared]
        if name in SHARED or DECLARED.setdefault(name, self) is not self:
            raise TypeError(f"the option {name!r} is declared twice")

    def __repr__(self) -> str:
        return f"Option({self.flag})"


class Group:
    """A command's group of destinations (`members`, in the order --help lists
    their options; `cli.outputs`), and, once parsed, the values of those
    options. Made from the values of the command line, or by keyword
    (`TrendOutputs(json_path=Path("r.json"))`: the options not named take their
    defaults); `values` may hold options of other groups too (`trend SWEEP/`
    hands its own to the sweep's group)."""

    members: ClassVar[tuple[Any, ...]] = ()

    def __init__(self, values: dict[Option[Any], Any] | None = None, /, **named: Any) -> None:
        by_name = {option.name: option for option in self.options()}
        unknown = set(named) - set(by_name)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no option {sorted(unknown)[0]!r}")
        self.values: dict[Option[Any], Any] = {option: option.default for option in self.options()}
        self.values.update(values or {})
        self.values.update({by_name[name]: value for name, value in named.items()})

    @classmethod
    def options(cls) -> list[Option[Any]]:
        """Every member's options, each once, in --help order."""
        return list(dict.fromkeys(option for member in cls.members for option in member.options))

    def __getitem__(self, option: Option[T]) -> T:
        value: T = self.values[option]
        return value

    def get(self, option: Option[T], otherwise: T) -> T:
        """The option's value, or `otherwise` where this group offers no such option."""
        return self.values.get(option, otherwise)

    def __contains__(self, option: Option[Any]) -> bool:
        return option in self.values

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Group) and type(other) is type(self) and other.values == self.values

    __hash__ = None  # type: ignore[assignment]  # mutable values: a group is no dictionary key

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{o.name}={v!r}' for o, v in self.values.items())})"

    @classmethod
    @contextlib.contextmanager
    def offering(cls, member: Any) -> Iterator[None]:
        """`member` (a destination) offered by this group while the block runs:
        its options appear in the commands that take the group (at the end of
        the group's), and it is written (after the registered ones). A
        destination of the package is offered by its line in
        `cli.destinations.registry` instead."""
        cls.members = (*cls.members, member)
        _refresh(cls)
        try:
            yield
        finally:
            cls.members = tuple(m for m in cls.members if m is not member)
            _refresh(cls)


# The commands that take each group: their signatures are made again when its members change.
_TAKEN_BY: dict[type, list[Callable[[], None]]] = {}


def _refresh(group: type) -> None:
    for refresh in [r for g, rs in _TAKEN_BY.items() if issubclass(g, group) for r in rs]:
        refresh()


def shared_options(command: Command) -> Command:
    """`command` as typer sees it: each bare parameter declared by `SHARED`, each
    `Group`-typed one spread into its members' options (and gathered back into
    one instance when the command runs); the other parameters as written."""
    hints = get_type_hints(command, include_extras=True)
    groups: dict[str, type[Group]] = {name: hint for name, hint in hints.items()
                                      if isinstance(hint, type) and issubclass(hint, Group)}

    def parameters() -> list[inspect.Parameter]:
        made: list[inspect.Parameter] = []
        for name, parameter in inspect.signature(command).parameters.items():
            hint = hints.get(name)
            if name in groups:
                made.extend(inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY, default=option.default,
                                              annotation=option.annotation) for option in groups[name].options())
            elif hint is None:
                made.append(_declared(name))
            else:
                made.append(parameter.replace(annotation=hint, kind=inspect.Parameter.KEYWORD_ONLY))
        return made

    @functools.wraps(command)
    def run(**flags: Any) -> Any:
        flags = {name: expand_path(value) if isinstance(value, Path) else value for name, value in flags.items()}
        for name, group in groups.items():
            flags[name] = group({option: flags.pop(option.name) for option in group.options()})
        return command(**flags)

    def refresh() -> None:
        made = parameters()
        # typer reads the parameters from __signature__, which functions do not declare as an attribute.
        run.__signature__ = inspect.Signature(made)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in made}

    refresh()
    for group in groups.values():
        _TAKEN_BY.setdefault(group, []).append(refresh)
    return run  # type: ignore[return-value]  # the wrapper stands for the command, as typer sees it


def _declared(name: str) -> inspect.Parameter:
    if name in DECLARED:
        return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=DECLARED[name].default,
                                 annotation=DECLARED[name].annotation)
    if name not in SHARED:
        raise TypeError(f"{name!r} is not a shared option: declare it in ckptscan.cli.options.SHARED")
    annotation, default = SHARED[name]
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
