"""`--mlflow URI`: the report in an MLflow tracking store (a server's
http(s):// URI, `databricks`, or a local `sqlite:///mlflow.db`).

One MLflow run per scanned run, in the experiment `ckptscan` (or the one
named), found again on every re-run by its tag `ckptscan.run_id` (a hash of
the run's location, `destinations.run_key`). What is written:

- metrics per step, named as the TensorBoard scalars (`{monitor}/layer_{i}`,
  `ckptscan/{family}_severity`, `ckptscan/{family}_flagged_layers`,
  `ckptscan/status`, `ckptscan/loss`), at each pair's newer step; only the
  steps newer than the run's tag `ckptscan.newest_step`, so a nightly
  re-run appends what is new;
- tags: `ckptscan.verdict`, `ckptscan.first_alert_family` ("none" before an
  alert), `ckptscan.first_alert_step`, `ckptscan.rollback_candidate`;
- artifacts under `ckptscan/`: the JSON report, and the HTML report when
  matplotlib is installed; replaced by each scan (they cover the run so far).

Needs `mlflow-skinny` (`pip install 'ckptscan[mlflow]'`); a local sqlite
store also needs SQLAlchemy and alembic (or the full `mlflow`). MLflow puts
a local store's artifacts where its experiment says (`./mlruns` by default).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from pathlib import Path
from typing import Iterator

from ckptscan.report.destinations import require_package, run_key, run_location
from ckptscan.document.plain import report_dict
from ckptscan.document.writing import report_json
from ckptscan.report.tensorboard import report_points
from ckptscan.schema.results import ScanReport

DEFAULT_EXPERIMENT = "ckptscan"
RUN_TAG = "ckptscan.run_id"
NEWEST_TAG = "ckptscan.newest_step"
ARTIFACT_DIR = "ckptscan"
BATCH = 1000  # MLflow's limit on metrics per log_batch call
# MLflow retries an unreachable server for minutes by default (7 retries,
# doubling backoff, 120 s timeout); a destination must not hold the scan that
# long. Environment variables, so a user's own setting wins.
HTTP_BOUNDS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
               "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}


def require_mlflow() -> None:
    """Before any long scan: --mlflow needs the package (exit 2 with the fix)."""
    require_package("mlflow", "--mlflow", "mlflow-skinny", "mlflow")


def write_mlflow(report: ScanReport, tracking_uri: str, experiment: str = DEFAULT_EXPERIMENT,
                 html: bool = True) -> tuple[int, int]:
    """Append the report's new steps to its MLflow run (created on first use);
    `html`: also the HTML report (needs matplotlib; skipped without it).
    Returns (steps written, steps that were already there)."""
    require_mlflow()
    with _bounded_http():
        return _write(report, tracking_uri, experiment, html)


def _write(report: ScanReport, tracking_uri: str, experiment: str, html: bool) -> tuple[int, int]:
    from mlflow.entities import Metric, RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    found = client.get_experiment_by_name(experiment)
    experiment_id = found.experiment_id if found is not None else client.create_experiment(experiment)
    key = run_key(report)
    runs = client.search_runs([experiment_id], filter_string=f"tags.`{RUN_TAG}` = '{key}'", max_results=1)
    if runs:
        run_id, newest = runs[0].info.run_id, int(runs[0].data.tags.get(NEWEST_TAG, -1))
    else:
        location = run_location(report)
        run = client.create_run(experiment_id, run_name=Path(location.split(" ")[-1]).name or key,
                                tags={RUN_TAG: key, "ckptscan.run": location})
        run_id, newest = run.info.run_id, -1

    points = [p for p in report_points(report) if not isinstance(p.value, str)]
    new = [p for p in points if p.step > newest]
    now_ms = int(time.time() * 1000)
    metrics = [Metric(p.tag, p.value, now_ms, p.step) for p in new]
    for start in range(0, len(metrics), BATCH):
        client.log_batch(run_id, metrics=metrics[start:start + BATCH])
    steps = {p.step for p in points}
    new_steps = {p.step for p in new}
    s = report.summary
    first = s.first_alert_step.get(s.first_family) if s.first_family is not None else None
    tags = {
        "ckptscan.verdict": s.status,
        "ckptscan.first_alert_family": s.first_family or "none",
        "ckptscan.first_alert_step": "none" if first is None else str(first),
        "ckptscan.rollback_candidate": s.rollback_candidate.path if s.rollback_candidate is not None else "none",
        NEWEST_TAG: str(max(steps | {newest})),
    }
    client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
    with tempfile.TemporaryDirectory(prefix="ckptscan-mlflow-") as tmp:
        _report_files(report, Path(tmp), html)
        client.log_artifacts(run_id, tmp, artifact_path=ARTIFACT_DIR)
    client.set_terminated(run_id)
    return len(new_steps), len(steps - new_steps)


@contextlib.contextmanager
def _bounded_http() -> Iterator[None]:
    """HTTP_BOUNDS for the calls of one write, where the user set none; then
    the environment as it was (a training job's own MLflow calls keep theirs)."""
    added = {name: value for name, value in HTTP_BOUNDS.items() if name not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def _report_files(report: ScanReport, directory: Path, html: bool) -> None:
    (directory / "report.json").write_text(report_json(report))
    if not html:
        return
    try:
        import matplotlib  # noqa: F401 - the HTML report's figures
    except ImportError:
        return
    from ckptscan.report.html_page import write_report_files

    write_report_files(report_dict(report), html_path=directory / "report.html")
