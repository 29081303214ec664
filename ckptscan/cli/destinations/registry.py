"""Every destination of the command line, once, and the groups of the
commands that offer them: adding a destination is its module and its lines
here.

`DESTINATIONS` is the order a command writes them in. Each group lists the
destinations of one kind of command in the order --help lists their options
(`cli.outputs`: `ReportOutputs` for diff, `TrendOutputs` for trend,
`WatchOutputs` for watch, `RenderOutputs` for `ckptscan report`,
`SweepOutputs` for a sweep's ranking).
"""

from __future__ import annotations

from ckptscan.cli.destinations.common import Asked

from ckptscan.cli.destinations.figures import Figures
from ckptscan.cli.destinations.github_annotations import Annotations
from ckptscan.cli.destinations.json_file import JsonFile
from ckptscan.cli.destinations.junit_file import JunitFile
from ckptscan.cli.destinations.markdown_summary import MarkdownSummary
from ckptscan.cli.destinations.metrics_endpoint import MetricsEndpoint
from ckptscan.cli.destinations.mlflow_run import MlflowRun
from ckptscan.cli.destinations.stdout_report import StdoutReport
from ckptscan.cli.destinations.sweep_json import SweepJson
from ckptscan.cli.destinations.sweep_page import SweepPage
from ckptscan.cli.destinations.sweep_ranking import SweepRanking
from ckptscan.cli.destinations.tensorboard_events import TensorBoardEvents
from ckptscan.cli.destinations.wandb_run import WandbRun
from ckptscan.cli.destinations.webhook import Webhook

Members = tuple[type[Asked], ...]

# Every destination, once, in the order a command writes them: the report on
# stdout and the files first, then the services (each failure one line on
# stderr, never the exit code), then the gauges of the newest report.
DESTINATIONS: Members = (StdoutReport, JsonFile, JunitFile, Annotations, MarkdownSummary, Figures,
                         TensorBoardEvents, WandbRun, MlflowRun, Webhook, MetricsEndpoint,
                         SweepRanking, SweepJson, SweepPage)

# diff's (and the first of trend's): the report and its files.
REPORT: Members = (JsonFile, JunitFile, TensorBoardEvents, StdoutReport, Annotations, MarkdownSummary, Figures)
# trend's: diff's, then the services that follow a run.
TREND: Members = (*REPORT, WandbRun, MlflowRun, Webhook)
# watch's: they follow the run, written again after each judged pair.
WATCH: Members = (JsonFile, MarkdownSummary, TensorBoardEvents, WandbRun, MlflowRun, Webhook, MetricsEndpoint)
# `ckptscan report`'s: renderings of a saved report.
RENDER: Members = (Figures, TensorBoardEvents, JunitFile, WandbRun, MlflowRun)
# A sweep's (`compare`, `trend SWEEP/`): the ranking, --json and --html.
SWEEP: Members = (SweepJson, SweepPage, SweepRanking)
