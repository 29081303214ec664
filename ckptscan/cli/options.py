"""Every option more than one command takes, declared once.

A command names the shared options it takes as bare parameters (no
annotation, no default) and `shared_options` gives each one its declaration
from `SHARED`: its flag, help, metavar and default are then the same in every
command, and the command's signature still says which options it takes and in
which order --help lists them. An option only one command takes stays declared
in that command. An option whose help says more in one command than in
another is declared here in both forms, under two names (`loss_log` and
`live_loss_log` for --loss-log).

A parameter annotated with a dataclass stands for a group of shared options,
one per field, in field order (`cli.outputs.ReportOutputs`: the report's
destinations); the command receives them as one instance of that dataclass.

Every path option reaches the command with `~` and `$VAR` expanded
(`ckptscan.system.paths`): the shell leaves `--cache-dir '~/c'` and `--json=~/r.json`
as typed. Arguments that may be URLs are `str` and expanded by the library.

Only typer (and `ckptscan.system.paths`, which needs os alone) is imported here:
`ckptscan --help` must not wait for torch or rich.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Callable, Optional, TypeVar, get_type_hints

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
# and the newest pair's (`report.json.keeps_heads`; docs/json-schema.md).
DEFAULT_PER_HEAD = "flagged+newest"
PerHead = Annotated[str, typer.Option(
    "--per-head", metavar="flagged+newest|all|flagged|newest", help="Which layers keep their per-head results in "
    "the JSON report: flagged+newest (the default: layers at warn or alert, and the newest pair's), all, flagged or "
    "newest. They are most of a long run's report (a report over 2,000 layer and head results is also written "
    "without indentation; FILE.json.gz: gzip).")]
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
JsonOut = Annotated[Optional[Path], typer.Option(
    "--json", metavar="FILE", help="Write the JSON report here (atomically; '-' for stdout, the table then going to "
    "stderr).")]
ConfigFile = Annotated[Optional[Path], typer.Option(
    "--config", metavar="FILE", help="Thresholds file: ckptscan.toml, or pyproject.toml with a [tool.ckptscan] table "
    "(default: the nearest one from the current directory up).")]
SetThreshold = Annotated[Optional[list[str]], typer.Option(
    "--set", metavar="KEY=VALUE", help="Override a setting (repeatable), e.g. --set alert_sigma=5.")]
FormatOpt = Annotated[Format, typer.Option("--format", help="Report on stdout as a table, JSON, Markdown or JUnit "
                                           "XML.")]
JunitOut = Annotated[Optional[Path], typer.Option(
    "--junit", metavar="FILE", help="Write a JUnit XML report here (atomically; '-' for stdout): one test case per "
    "layer and family, failing at the gate level.")]
TensorBoardDir = Annotated[Optional[Path], typer.Option(
    "--tensorboard", metavar="DIR", help="Append the monitors, per-family summaries and findings to TensorBoard event "
    "files in this directory (new steps only; needs pip install 'ckptscan[tensorboard]').")]
MarkdownSummary = Annotated[Optional[Path], typer.Option(
    "--markdown-summary", metavar="FILE", help="Append a Markdown summary here (default: $GITHUB_STEP_SUMMARY when "
    "set).")]
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
HtmlOut = Annotated[Optional[Path], typer.Option(
    "--html", metavar="FILE", help="Write a self-contained HTML report with figures here (needs matplotlib: pip "
    "install 'ckptscan[report]').")]
PngDir = Annotated[Optional[Path], typer.Option(
    "--png", metavar="DIR", help="Write the report's figures as PNG files into this directory.")]
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

# The services a run's health is followed in (cli.outputs: written after the
# report files, each failure one line on stderr, never the exit code).
WandbTarget = Annotated[Optional[str], typer.Option(
    "--wandb", metavar="PROJECT[/RUN]", help="Append the per-step scalars, the verdict and the findings to a "
    "Weights & Biases run in PROJECT, one per scanned run (RUN names it). Mode and credentials are W&B's own "
    "(WANDB_MODE=offline, WANDB_API_KEY); never asks for a login. Needs pip install 'ckptscan[wandb]'.")]
MlflowUri = Annotated[Optional[str], typer.Option(
    "--mlflow", metavar="URI", help="Log the per-step metrics, verdict tags and the JSON/HTML report to an MLflow "
    "tracking store: http(s)://server, databricks or sqlite:///mlflow.db (one MLflow run per scanned run; needs "
    "pip install 'ckptscan[mlflow]').")]
MlflowExperiment = Annotated[str, typer.Option("--mlflow-experiment", metavar="NAME",
                                               help="The MLflow experiment of --mlflow.")]
NotifyUrl = Annotated[Optional[str], typer.Option(
    "--notify", metavar="URL", help="POST a JSON message to this webhook at the run's first warning and first alert, "
    "once each per run (a 'text' field Slack and Teams incoming webhooks show as is).")]
NotifyOn = Annotated[str, typer.Option("--notify-on", metavar="warn,alert",
                                       help="Which of the run's firsts --notify posts: warn, alert, or both.")]
MetricsPort = Annotated[Optional[int], typer.Option(
    "--metrics-port", metavar="PORT", min=0, max=65535, help="Serve the run's health as Prometheus metrics on "
    "http://ADDR:PORT/metrics while watching (needs pip install 'ckptscan[prometheus]').")]
MetricsAddr = Annotated[str, typer.Option(
    "--metrics-addr", metavar="ADDR", help="Address --metrics-port listens on. Default: this machine only; the "
    "endpoint has no authentication, so exposing it (0.0.0.0, for a Prometheus on another host) is your choice.")]

# Parameter name -> (declaration, default). The name is the one every command
# (and every option group's field) uses for the option.
SHARED: dict[str, tuple[Any, Any]] = {
    "json_path": (JsonOut, None), "per_head": (PerHead, DEFAULT_PER_HEAD), "junit": (JunitOut, None),
    "tensorboard": (TensorBoardDir, None),
    "format": (FormatOpt, Format.table), "markdown_summary": (MarkdownSummary, None), "html": (HtmlOut, None),
    "png": (PngDir, None), "fail_on": (FailOnOpt, None), "config": (ConfigFile, None), "set_": (SetThreshold, None),
    "quiet": (Quiet, False), "wide": (Wide, False), "num_heads": (NumHeads, None), "num_kv_heads": (NumKvHeads, None),
    "head_dim": (HeadDim, None), "model_config": (ModelConfigFile, None), "layers": (Layers, None),
    "precision": (PrecisionOpt, Precision.float32), "device": (Device, "cpu"), "heads": (Heads, None),
    "full_spectrum": (FullSpectrum, False), "tensor_map": (TensorMapFile, None), "reference": (Reference, None),
    "stride": (Stride, 1), "base": (BaseOpt, Base.previous), "loss_log": (LossLog, None),
    "live_loss_log": (LiveLossLog, None), "no_loss_log": (NoLossLog, False), "probe": (RunProbe, None),
    "no_probe": (NoProbe, False), "cache_dir": (CacheDir, None), "no_cache": (NoCache, False),
    "no_disk_cache": (NoDiskCache, False),
    "wandb": (WandbTarget, None), "mlflow": (MlflowUri, None), "mlflow_experiment": (MlflowExperiment, "ckptscan"),
    "notify": (NotifyUrl, None), "notify_on": (NotifyOn, "warn,alert"), "metrics_port": (MetricsPort, None),
    "metrics_addr": (MetricsAddr, "127.0.0.1"),
}

Command = TypeVar("Command", bound=Callable[..., Any])


def shared_options(command: Command) -> Command:
    """`command` as typer sees it: each bare parameter declared by `SHARED`, each
    dataclass-typed one spread into its fields' options (and gathered back into
    one instance when the command runs); the other parameters as written."""
    hints = get_type_hints(command, include_extras=True)
    parameters: list[inspect.Parameter] = []
    groups: dict[str, type] = {}
    for name, parameter in inspect.signature(command).parameters.items():
        hint = hints.get(name)
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            groups[name] = hint
            parameters.extend(_declared(field.name) for field in dataclasses.fields(hint))
        elif hint is None:
            parameters.append(_declared(name))
        else:
            parameters.append(parameter.replace(annotation=hint, kind=inspect.Parameter.KEYWORD_ONLY))

    @functools.wraps(command)
    def run(**flags: Any) -> Any:
        flags = {name: expand_path(value) if isinstance(value, Path) else value for name, value in flags.items()}
        for name, group in groups.items():
            flags[name] = group(**{field.name: flags.pop(field.name) for field in dataclasses.fields(group)})
        return command(**flags)

    # typer reads the parameters from __signature__, which functions do not declare as an attribute.
    run.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in parameters}
    return run  # type: ignore[return-value]  # the wrapper stands for the command, as typer sees it


def _declared(name: str) -> inspect.Parameter:
    if name not in SHARED:
        raise TypeError(f"{name!r} is not a shared option: declare it in ckptscan.cli.options.SHARED")
    annotation, default = SHARED[name]
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
