"""The destinations a report is written to, one module each: stdout in
--format (`stdout_report`), --json (`json_file`), --junit, GitHub annotations,
--markdown-summary, --html and --png (`figures`), --tensorboard; the services
--wandb, --mlflow, --notify (`webhook`) and watch's --metrics-port; a
sweep's ranking, --json and --html (`sweep_*`).

Each module declares the options that ask for its destination (`Option`:
flag, help, default, metavar) beside the destination itself, an `Asked`
(`common`, on the protocol of `report.destinations`): made from a command's
group of options when its flag was given, it checks its target before any
long scan (what it needs installed, a well-formed target: exit 2 with the
fix) and writes after, by the renderer in `report/`. Every file write goes
through `ckptscan.system.output`; a failed one is one line and exit 2. A
service is not a file the user asked for but a place the scan is also
shown: each is written through `report.destinations.deliver`, so one that
fails (no network, a bad store, a full disk) is one line on stderr and
changes neither the exit code nor the JSON report.

A new destination (say --wandb) is one module here and its lines in
`registry`: once in `DESTINATIONS` (the order a command writes them), and in
the group of each command that offers it, where --help lists its options.
The commands themselves do not change.
"""

from __future__ import annotations

from typing import Any

from ckptscan.cli.destinations.common import check_file_outputs, json_to_stdout

__all__ = ["check_file_outputs", "json_to_stdout"]

# The names this module held when it was one file, each where it lives now (imported when first asked for).
_MOVED = {
    "DESTINATIONS": "registry", "StdoutReport": "stdout_report", "JsonFile": "json_file", "JunitFile": "junit_file",
    "Annotations": "github_annotations", "MarkdownSummary": "markdown_summary", "Figures": "figures",
    "TensorBoardEvents": "tensorboard_events", "WandbRun": "wandb_run", "write_wandb_unprompted": "wandb_run",
    "MlflowRun": "mlflow_run", "check_mlflow_uri": "mlflow_run", "Webhook": "webhook", "notify_events": "webhook",
    "MetricsEndpoint": "metrics_endpoint",
}


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{_MOVED[name]}"), name)
