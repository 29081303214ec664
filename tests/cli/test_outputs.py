"""The services of `cli.outputs` on the command line, each against the real
thing: --wandb in offline mode read back from its transaction log, --mlflow
in a sqlite store read back with MlflowClient, --notify posting to a local
HTTP server, watch --metrics-port scraped over HTTP while a writer process
adds checkpoints. A service that fails is one line on stderr and changes
neither the exit code nor the --json bytes; one asked for wrongly is exit 2
before the scan."""

import json
import os
import pty
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import wandb
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from ckptscan.cli import app
from ckptscan.document.reading import load_report

from report.test_mlflow import empty_store, the_run  # noqa: F401 - the sqlite store fixture
from report.test_notify import Server
from report.test_prometheus import scrape
from report.test_wandb import offline_runs
from run_factory import write_run
from writer_process import GUARD_S, Lines, Writer, environment

runner = CliRunner()
SAMPLES = Path(__file__).parent.parent.parent / "sample_checkpoints"
FAULTY = SAMPLES / "attention_fault"  # attention alerts at step 1400 (the logit scale's ceiling)
HEALTHY = SAMPLES / "healthy"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """One pair cache for the module: each sample run is computed once."""
    return tmp_path_factory.mktemp("pair-cache")


def trend(*args, cache_dir):
    return runner.invoke(app, ["trend", *map(str, args), "--cache-dir", str(cache_dir)])


@pytest.fixture
def faulty_report(cache_dir, tmp_path):
    """The faulty run's report as trend writes it with no service."""
    path = tmp_path / "plain.json"
    result = trend(FAULTY, "--json", path, "-q", cache_dir=cache_dir)
    assert result.exit_code == 1, result.output
    return load_report(path)


@pytest.fixture
def offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    wandb.teardown()  # wandb keeps its first settings in the process; start from this environment
    yield tmp_path / "wandb"
    wandb.teardown()


@pytest.fixture
def store(empty_store, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.chdir(tmp_path)  # a local store's artifacts go to ./mlruns
    shutil.copy(empty_store, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


@pytest.fixture
def hook():
    server = Server()
    yield server
    server.close()


def test_trend_wandb_writes_the_steps_and_the_first_alert(offline, faulty_report, cache_dir):
    result = trend(FAULTY, "--wandb", "ckptscan-tests/attention", cache_dir=cache_dir)
    assert result.exit_code == 1, result.output
    steps = [p.to_step for p in faulty_report.pairs]
    assert f"wandb: {len(steps)} new step(s) written to ckptscan-tests/attention, 0 already there" in result.stderr
    ((_, history, summary, _),) = offline_runs(offline)
    assert sorted(history) == steps
    assert history[1400]["ckptscan/attention_severity"] == 3  # alert
    assert summary["ckptscan/verdict"] == "alert" and summary["ckptscan/first_alert_step"] == 1400
    assert summary["ckptscan/first_alert_family"] == "attention"


def test_report_wandb_renders_a_saved_report(offline, faulty_report, tmp_path, cache_dir):
    saved = tmp_path / "saved.json"
    assert trend(FAULTY, "--json", saved, "-q", cache_dir=cache_dir).exit_code == 1
    result = runner.invoke(app, ["report", str(saved), "--wandb", "ckptscan-tests"])
    assert result.exit_code == 0, result.output
    ((_, history, summary, _),) = offline_runs(offline)
    assert sorted(history) == [p.to_step for p in faulty_report.pairs]
    assert summary["ckptscan/first_alert_step"] == 1400


def test_trend_mlflow_logs_metrics_tags_and_the_report(store, faulty_report, cache_dir):
    result = trend(FAULTY, "--mlflow", store, "--mlflow-experiment", "nightly", cache_dir=cache_dir)
    assert result.exit_code == 1, result.output
    client = MlflowClient(tracking_uri=store)
    experiment = client.get_experiment_by_name("nightly")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.data.tags["ckptscan.verdict"] == "alert"
    assert run.data.tags["ckptscan.first_alert_step"] == "1400"
    history = client.get_metric_history(run.info.run_id, "ckptscan/attention_severity")
    assert sorted(m.step for m in history) == [p.to_step for p in faulty_report.pairs]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "ckptscan")}
    assert "ckptscan/report.json" in artifacts


def test_report_mlflow_renders_a_saved_report(store, faulty_report, tmp_path, cache_dir):
    saved = tmp_path / "saved.json"
    assert trend(FAULTY, "--json", saved, "-q", cache_dir=cache_dir).exit_code == 1
    result = runner.invoke(app, ["report", str(saved), "--mlflow", store])
    assert result.exit_code == 0, result.output
    run = the_run(MlflowClient(tracking_uri=store), faulty_report)
    assert run.data.tags["ckptscan.first_alert_family"] == "attention"


def test_trend_notify_posts_the_first_alert_once(hook, cache_dir):
    assert trend(FAULTY, "--notify", hook.url, cache_dir=cache_dir).exit_code == 1
    ((ctype, body),) = hook.bodies  # the alert says more than its warning: one message
    assert ctype == "application/json" and body["ckptscan"]["kind"] == "alert"
    assert body["text"].startswith("ckptscan ALERT: attention at step 1400")
    assert body["ckptscan"]["run"] == str(FAULTY.resolve())
    assert trend(FAULTY, "--notify", hook.url, cache_dir=cache_dir).exit_code == 1
    assert len(hook.bodies) == 1  # a re-run does not repeat it


def test_notify_on_chooses_the_events(hook, cache_dir):
    result = trend(FAULTY, "--notify", hook.url, "--notify-on", "warn", cache_dir=cache_dir)
    assert result.exit_code == 1, result.output
    assert [body["ckptscan"]["kind"] for _, body in hook.bodies] == ["warn"]


def test_a_healthy_run_notifies_nothing(hook, cache_dir):
    assert trend(HEALTHY, "--notify", hook.url, cache_dir=cache_dir).exit_code == 0
    assert hook.bodies == []


@pytest.mark.parametrize("args, message", [
    (["--wandb", "a/b/c"], "--wandb takes PROJECT or PROJECT/RUN, not 'a/b/c'"),
    (["--mlflow", "nosuchscheme://x"], "--mlflow: 'nosuchscheme://x' is not a tracking URI"),
    (["--notify", "hooks.example.com/x"], "--notify needs an http:// or https:// URL"),
    (["--notify", "http://127.0.0.1:9/x", "--notify-on", "page"], "--notify-on takes warn and/or alert, not page"),
])
def test_a_malformed_target_is_exit_2_before_the_scan(args, message, tmp_path):
    result = runner.invoke(app, ["trend", str(tmp_path / "no-run"), *args])
    assert result.exit_code == 2 and result.stderr.startswith(f"error: {message}")
    assert result.stderr.count("\n") == 1


def refused_url():
    """A local port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/hook"


def test_failing_services_are_one_line_each_and_change_neither_exit_code_nor_json(cache_dir, tmp_path):
    """W&B online with no credentials (WANDB_MODE unset, no key, a terminal on
    stdin and stderr that never answers: a login prompt would hang here), an
    MLflow store under a file, a webhook nobody listens on."""
    args = [sys.executable, "-m", "ckptscan", "trend", str(FAULTY), "--cache-dir", str(cache_dir), "--json", "-",
            "-q"]
    env = {k: v for k, v in environment().items() if not k.startswith("WANDB_")}
    env.update(HOME=str(tmp_path), TERM="xterm", MLFLOW_DISABLE_TELEMETRY="true")
    plain = subprocess.run(args, capture_output=True, env=env, timeout=GUARD_S)
    (tmp_path / "a-file").write_text("")
    services = ["--wandb", "ckptscan-tests", "--mlflow", f"sqlite:///{tmp_path / 'a-file' / 'mlflow.db'}",
                "--notify", refused_url()]
    terminal, tty = pty.openpty()
    try:
        failing = subprocess.run(args + services, stdin=tty, stdout=subprocess.PIPE, stderr=tty, env=env,
                                 cwd=tmp_path, timeout=GUARD_S)
        os.close(tty)
        stderr = read_all(terminal).replace("\r\n", "\n")
    finally:
        os.close(terminal)
    assert (failing.returncode, failing.stdout) == (plain.returncode, plain.stdout) == (1, plain.stdout)
    json.loads(plain.stdout)
    lines = [line for line in stderr.splitlines() if line.startswith("ckptscan: ")]
    assert [line.split(" not updated: ")[0] for line in lines] == \
        ["ckptscan: --wandb", "ckptscan: --mlflow", "ckptscan: --notify"], stderr
    assert "no W&B credentials" in lines[0]
    gate_line = plain.stderr.decode().splitlines()[-1]
    assert gate_line.startswith("gate failed") and gate_line in stderr  # as without the services
    assert "Traceback" not in stderr and "wandb: " not in stderr  # no trace, no W&B chatter (the table may be here)


def read_all(fd):
    """What a pty's other end wrote, once it is closed (Linux answers EIO at the end)."""
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode()


def test_a_missing_package_names_the_extra(tmp_path):
    """Each service's package hidden from the import system: exit 2 with the pip extra, before the scan."""
    probe = ("import sys; sys.modules[{module!r}] = None; sys.argv = ['ckptscan', *{args!r}]\n"
             "from ckptscan.cli.console import main\nmain()")
    for module, args, extra in [
        ("wandb", ["trend", str(tmp_path), "--wandb", "p"], "ckptscan[wandb]"),
        ("mlflow", ["report", str(tmp_path / "r.json"), "--mlflow", "sqlite:///x.db"], "ckptscan[mlflow]"),
        ("prometheus_client", ["watch", str(tmp_path), "--metrics-port", "0"], "ckptscan[prometheus]"),
    ]:
        proc = subprocess.run([sys.executable, "-c", probe.format(module=module, args=args)], capture_output=True,
                              text=True, env=environment(), timeout=GUARD_S)
        assert proc.returncode == 2 and f"pip install '{extra}'" in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1, proc.stderr


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_watch_metrics_port_is_scraped_while_a_writer_adds_checkpoints(tmp_path, hook):
    source = write_run(tmp_path / "source", count=4, collapse_layer=1, collapse_from=300)
    writer = Writer(source, tmp_path / "run")
    port = free_port()
    try:
        writer.publish("checkpoint-0")
        watch = subprocess.Popen(
            [sys.executable, "-m", "ckptscan", "watch", str(writer.target), "--poll", "--interval", "0.05",
             "--settle", "0.05", "--no-cache", "--metrics-port", str(port), "--notify", hook.url],
            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environment())
        out, err = Lines(watch.stdout), Lines(watch.stderr)
        err.expect(rf"^serving metrics on http://127\.0\.0\.1:{port}/metrics$")
        run = frozenset({("run", os.path.abspath(writer.target))})
        for pairs, step in ((1, 100), (2, 200)):
            writer.publish(f"checkpoint-{step}")
            out.expect(rf"^\s*{step} \d+→{step}\s")
            page = scrape(port)
            assert page[("ckptscan_newest_step", run)] == step
            assert page[("ckptscan_pairs_scanned", run)] == pairs
        assert hook.bodies == []  # healthy so far
        writer.publish("checkpoint-300")
        out.expect(r"^\s*300 \d+→300\s")
        assert watch.wait(GUARD_S) == 1  # the first alert ends the watch
        assert [body["ckptscan"]["kind"] for _, body in hook.bodies] == ["alert"]
        out.rest(), err.rest()
    finally:
        writer.close()


def test_watch_closes_its_metrics_endpoint_when_it_ends(tmp_path):
    run = write_run(tmp_path / "run", count=2)
    port = free_port()
    result = runner.invoke(app, ["watch", str(run), "--timeout", "1", "--settle", "0.05", "--interval", "0.05",
                                 "--poll", "--no-cache", "--metrics-port", str(port)])
    assert result.exit_code == 0, result.output
    with socket.socket() as again:  # listening still, the port could not be taken
        again.bind(("127.0.0.1", port))


def test_watch_a_port_in_use_is_exit_2(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = runner.invoke(app, ["watch", str(tmp_path), "--metrics-port", str(port), "--timeout", "5"])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: --metrics-port {port}: cannot listen on 127.0.0.1:{port}")


def test_trend_keeps_the_flagged_and_the_newest_per_head_results_unless_told_all(tmp_path):
    run = write_run(tmp_path / "run", count=6, collapse_layer=1, collapse_from=300)
    runner = CliRunner()
    for flags, name in (([], "default.json"), (["--per-head", "all"], "all.json")):
        result = runner.invoke(app, ["trend", str(run), "--json", str(tmp_path / name), *flags])
        assert result.exit_code in (0, 1), result.output
    default, everything = load_report(tmp_path / "default.json"), load_report(tmp_path / "all.json")
    assert default.settings["per_head"] == "flagged+newest" and "per_head" not in everything.settings
    newest = len(default.pairs) - 1
    kept = [(i, layer.layer) for i, pair in enumerate(default.pairs) for layer in pair.layers if layer.attention.heads]
    assert kept == [(i, layer.layer) for i, pair in enumerate(everything.pairs) for layer in pair.layers
                    if i == newest or layer.status in ("warn", "alert")]
    assert any(i != newest for i, _ in kept) and len(kept) < sum(len(pair.layers) for pair in default.pairs)


def test_per_head_limits_the_json_report_and_a_bad_value_is_refused_before_the_scan(tmp_path):
    run = write_run(tmp_path / "run", count=4)
    runner = CliRunner()
    bad = runner.invoke(app, ["trend", str(run), "--json", str(tmp_path / "r.json"), "--per-head", "some"])
    assert bad.exit_code == 2 and "--per-head must be one of" in bad.output
    assert not (tmp_path / "r.json").exists()
    good = runner.invoke(app, ["trend", str(run), "--json", str(tmp_path / "r.json.gz"), "--per-head", "newest"])
    assert good.exit_code in (0, 1), good.output
    report = load_report(tmp_path / "r.json.gz")
    assert report.settings["per_head"] == "newest"
    assert [bool(layer.attention.heads) for pair in report.pairs for layer in pair.layers] == \
        [index == len(report.pairs) - 1 for index, pair in enumerate(report.pairs) for _ in pair.layers]
