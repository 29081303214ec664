"""--notify URL against real local HTTP servers: one that records what it is
sent, one that never answers (the wait is bounded) and one that answers 500
(tried again, then one line on stderr); each notice goes out once per run."""

import copy
import http.server
import json
import socket
import threading
import time

import pytest

from ckptscan.errors import CkptScanError
from ckptscan.monitors.interventions import INTERVENTIONS
from ckptscan.report.destinations import deliver
from ckptscan.report.notify import Notifier, notice_payload, notices, write_notify

GUARD_S = 30  # a passing test is far below it; it only keeps a broken timeout from hanging the suite


class Server:
    """http.server in a thread answering every POST with `status`; records the bodies."""

    def __init__(self, status=200):
        self.bodies, self.status = [], status
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers["Content-Length"])
                outer.bodies.append((self.headers["Content-Type"], json.loads(self.rfile.read(length))))
                self.send_response(outer.status)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):  # quiet test output
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/hook"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


@pytest.fixture
def report(reports):
    return reports["loss"]  # the collapse run: attention warns and alerts at step 1000, layer 1


def warned_only(report):
    """The same run judged before its first alert: a warning, no alert yet."""
    warned = copy.deepcopy(report)
    s = warned.summary
    s.status, s.first_family, s.rollback_candidate = "warn", None, None
    s.first_alert_step = {family: None for family in s.first_alert_step}
    return warned


def test_the_alert_text_names_verdict_family_layers_heads_rollback_and_what_to_do(report):
    (alert,) = [n for n in notices(report) if n.kind == "alert"]
    payload = notice_payload(report, alert)
    text, facts = payload["text"], payload["ckptscan"]
    s = report.summary
    assert (alert.family, alert.step) == (s.first_family, s.first_alert_step[s.first_family]) == ("attention", 1000)
    assert text.startswith("ckptscan ALERT: attention at step 1000")
    assert s.message in text
    assert facts["layers"] == [1] and "layers: 1" in text
    worst_head = next(layer.attention.delta2_entropy_worst_head for pair in report.pairs if pair.to_step == 1000
                      for layer in pair.layers if layer.layer == 1)
    assert facts["heads"] == {"1": worst_head} and f"layer 1 head {worst_head}" in text
    assert f"rollback candidate: {s.rollback_candidate.path} (step {s.rollback_candidate.step})" in text
    assert text.index("rollback candidate") < text.index("what to do:")
    for intervention in INTERVENTIONS["attention"]:
        assert f"- {intervention.action} [{intervention.source}]" in text
    assert facts["interventions"][0]["family"] == "attention"
    json.dumps(payload)  # the body is plain JSON


def test_first_warning_then_first_alert_each_sent_once(server, report, tmp_path):
    notifier = Notifier(server.url, state_dir=tmp_path)
    assert [n.kind for n in notifier.update(warned_only(report))] == ["warn"]
    assert [n.kind for n in notifier.update(report)] == ["alert"]
    assert notifier.update(report) == []  # the watch's next event: nothing new
    # A re-run (a new process) remembers what was sent.
    assert write_notify(report, server.url, state_dir=tmp_path) == []
    assert [(ctype, body["ckptscan"]["kind"]) for ctype, body in server.bodies] == \
        [("application/json", "warn"), ("application/json", "alert")]
    assert "rollback candidate:" not in server.bodies[0][1]["text"]  # a warning has none yet
    # Another channel for the same run is told on its own.
    other = Server()
    try:
        assert [n.kind for n in write_notify(report, other.url, state_dir=tmp_path)] == ["alert"]
    finally:
        other.close()


def test_an_alert_that_comes_with_its_warning_is_one_message(server, report, tmp_path):
    assert [n.kind for n in write_notify(report, server.url, state_dir=tmp_path)] == ["alert"]
    assert write_notify(warned_only(report), server.url, state_dir=tmp_path) == []
    assert len(server.bodies) == 1


def test_which_notices_is_configurable(server, report, tmp_path):
    assert write_notify(warned_only(report), server.url, on=("alert",), state_dir=tmp_path) == []
    assert [n.kind for n in write_notify(report, server.url, on=("warn",), state_dir=tmp_path / "w")] == ["warn"]
    with pytest.raises(CkptScanError, match="--notify-on takes warn and/or alert, not page"):
        Notifier(server.url, on=("page",))


def test_a_healthy_run_sends_nothing(server, reports, tmp_path):
    assert write_notify(reports["healthy"], server.url, state_dir=tmp_path) == []
    assert server.bodies == []


def test_a_server_that_never_answers_costs_a_bounded_wait_and_one_line(report, tmp_path, capsys):
    with socket.socket() as hanging:  # accepts connections (the backlog), never reads or answers
        hanging.bind(("127.0.0.1", 0))
        hanging.listen(8)
        url = f"http://127.0.0.1:{hanging.getsockname()[1]}/hook"
        notifier = Notifier(url, state_dir=tmp_path, timeout=0.2, attempts=2, backoff=0.01)
        start = time.monotonic()
        assert deliver("--notify", notifier.update, report) is None
        assert time.monotonic() - start < GUARD_S
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("ckptscan: --notify not updated: notification to ") and "after 2 tries" in err
    assert "timed out" in err
    assert not list(tmp_path.iterdir())  # not sent, so not remembered: the next report tries again


def test_a_server_error_is_tried_again_then_one_line(report, tmp_path, capsys):
    failing = Server(status=500)
    try:
        notifier = Notifier(failing.url, state_dir=tmp_path, backoff=0.01)
        assert deliver("--notify", notifier.update, report) is None
        assert len(failing.bodies) == 3  # ATTEMPTS
    finally:
        failing.close()
    err = capsys.readouterr().err
    assert err == (f"ckptscan: --notify not updated: notification to {failing.url} failed after 3 tries: "
                   "HTTP 500 Internal Server Error\n")


def test_a_refused_webhook_is_not_tried_again(report, tmp_path):
    gone = Server(status=404)  # a revoked Slack webhook answers 404
    try:
        with pytest.raises(CkptScanError, match="after 1 tries: HTTP 404"):
            write_notify(report, gone.url, state_dir=tmp_path)
        assert len(gone.bodies) == 1
    finally:
        gone.close()


def test_not_an_http_url_is_one_line(report, tmp_path, capsys):
    assert deliver("--notify", write_notify, report, "hooks.slack.com/x", state_dir=tmp_path) is None
    assert capsys.readouterr().err == ("ckptscan: --notify not updated: --notify needs an http:// or https:// URL, "
                                       "not 'hooks.slack.com/x'\n")
