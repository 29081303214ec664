"""--mlflow against a real local tracking store (sqlite, in tmp_path), read
back with MlflowClient: the TensorBoard scalars as metrics per step, the
verdict tags, the JSON and HTML reports as artifacts; a re-run over the
grown run appends only the new steps to the same MLflow run."""

import copy
import json
import os
import shutil

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # tests never reach the network; read at import

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

from ckptscan.report.destinations import deliver, run_key  # noqa: E402
from ckptscan.document.plain import report_dict  # noqa: E402
from ckptscan.document.writing import report_json  # noqa: E402
from ckptscan.report.mlflow import NEWEST_TAG, RUN_TAG, write_mlflow  # noqa: E402

from report.test_tensorboard import expected_scalars  # noqa: E402


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory):
    """A new sqlite tracking store, its tables created once (MLflow's migrations take seconds)."""
    path = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def store(empty_store, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a local store's artifacts go to ./mlruns
    shutil.copy(empty_store, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def earlier(report, pairs):
    """The run as a scan saw it `pairs` pairs ago (the rules look only backward)."""
    shorter = copy.deepcopy(report)
    shorter.pairs = shorter.pairs[:pairs]
    return shorter


def the_run(client, report):
    experiment = client.get_experiment_by_name("ckptscan")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1 and runs[0].data.tags[RUN_TAG] == run_key(report)
    return runs[0]


def test_metrics_tags_and_artifacts_read_back(store, reports, tmp_path):
    report = reports["loss"]
    data = report_dict(report)
    assert write_mlflow(report, store) == (len(report.pairs), 0)
    client = MlflowClient(tracking_uri=store)
    run = the_run(client, report)
    expected = expected_scalars(data)
    assert set(run.data.metrics) == set(expected)
    for name, by_step in expected.items():
        history = client.get_metric_history(run.info.run_id, name)
        assert {m.step: np.float32(m.value) for m in history} == by_step, name
        assert len(history) == len(by_step), f"{name}: a step written twice"
    tags = run.data.tags
    assert tags["ckptscan.verdict"] == "alert"
    assert tags["ckptscan.first_alert_family"] == "attention" and tags["ckptscan.first_alert_step"] == "1000"
    assert tags["ckptscan.rollback_candidate"] == report.summary.rollback_candidate.path
    assert tags[NEWEST_TAG] == str(report.pairs[-1].to_step)
    assert sorted(a.path for a in client.list_artifacts(run.info.run_id, "ckptscan")) == \
        ["ckptscan/report.html", "ckptscan/report.json"]
    local = client.download_artifacts(run.info.run_id, "ckptscan/report.json", str(tmp_path / "back"))
    assert json.load(open(local)) == json.loads(report_json(report))


def test_a_rerun_over_the_grown_run_appends_only_new_steps(store, reports):
    report = reports["loss"]
    assert write_mlflow(earlier(report, 6), store, html=False) == (6, 0)
    assert write_mlflow(report, store, html=False) == (len(report.pairs) - 6, 6)
    assert write_mlflow(report, store, html=False) == (0, len(report.pairs))  # nothing new: nothing written
    client = MlflowClient(tracking_uri=store)
    run = the_run(client, report)
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "ckptscan/attention_severity")]
    assert steps == [p.to_step for p in report.pairs]
    assert run.data.tags["ckptscan.verdict"] == "alert"  # the newest scan's verdict


def test_a_bad_store_is_one_line_and_changes_nothing(reports, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report = reports["loss"]
    before = report_json(report)
    (tmp_path / "a-file").write_text("")
    unreachable = f"sqlite:///{tmp_path / 'a-file' / 'mlflow.db'}"  # under a file: no store can be made
    assert deliver("--mlflow", write_mlflow, report, unreachable) is None
    err = capsys.readouterr().err
    assert err.startswith("ckptscan: --mlflow not updated: ") and err.count("\n") == 1
    assert report_json(report) == before
