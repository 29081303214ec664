"""watch --metrics-port: the exposition endpoint scraped over HTTP, parsed
with prometheus_client's own parser, against the reports it was given and
while a writer process adds checkpoints to a run `watch_run` follows."""

import copy
import os
import math
import queue
import threading
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ckptscan.errors import CkptScanError
from ckptscan.report.destinations import run_location
from ckptscan.report.prometheus import MetricsServer
from ckptscan.pipeline.watch import watch_run

from run_factory import write_run
from writer_process import GUARD_S, Writer


def scrape(port):
    """{(metric sample name, frozenset of labels): value} as Prometheus reads the page."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=GUARD_S) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.fixture
def server():
    s = MetricsServer(0, addr="127.0.0.1")  # port 0: the OS picks a free one
    yield s
    s.close()


def test_the_gauges_say_what_the_report_says(server, reports):
    report = reports["loss"]  # attention alerts at step 1000 in layer 1
    run = run_location(report)
    before = copy.deepcopy(report)  # the same run while it had only warned
    before.summary.first_alert_step = {f: None for f in before.summary.first_alert_step}
    before.summary.first_family = None
    server.update(before)
    page = scrape(server.port)
    assert page[("ckptscan_family_severity", frozenset({("run", run), ("family", "attention")}))] == 1
    assert math.isnan(page[("ckptscan_first_alert_step", frozenset({("run", run)}))])

    server.update(report)
    page = scrape(server.port)
    r = frozenset({("run", run)})
    assert page[("ckptscan_newest_step", r)] == report.pairs[-1].to_step
    assert page[("ckptscan_pairs_scanned", r)] == len(report.pairs)
    assert page[("ckptscan_flagged_layers", r)] == len(report.summary.flagged_layers) == 1
    assert page[("ckptscan_first_alert_step", r)] == 1000
    severities = {family: page[("ckptscan_family_severity", frozenset({("run", run), ("family", family)}))]
                  for family in ("attention", "router", "numeric")}
    assert severities == {"attention": 2, "router": 0, "numeric": 0}
    assert page[("ckptscan_last_update_timestamp_seconds", r)] > 0
    # Its own registry: none of the client library's default process/platform collectors.
    assert not any(name.startswith(("process_", "python_")) for name, _ in page)


def test_a_port_in_use_is_one_clear_error(server):
    with pytest.raises(CkptScanError, match=f"--metrics-port {server.port}: cannot listen on 127.0.0.1"):
        MetricsServer(server.port, addr="127.0.0.1")


def test_scraped_while_a_writer_process_adds_checkpoints(server, tmp_path):
    source = write_run(tmp_path / "source", count=4)
    writer = Writer(source, tmp_path / "run")
    try:
        for step in (0, 100):
            writer.publish(f"checkpoint-{step}")
        judged: queue.Queue = queue.Queue()

        def follow():  # what `ckptscan watch --metrics-port` does with each event
            try:
                for event in watch_run(writer.target, events=False, interval=0.05, settle=0.05, timeout=1):
                    server.update(event.report)
                    judged.put(len(event.report.pairs))
            except Exception as e:  # noqa: BLE001 - handed to the test
                judged.put(e)

        thread = threading.Thread(target=follow, daemon=True)
        thread.start()
        run = frozenset({("run", os.path.abspath(writer.target))})
        for pairs, step in ((1, 100), (2, 200), (3, 300)):
            if step > 100:
                writer.publish(f"checkpoint-{step}")
            assert judged.get(timeout=GUARD_S) == pairs
            page = scrape(server.port)
            assert page[("ckptscan_newest_step", run)] == step
            assert page[("ckptscan_pairs_scanned", run)] == pairs
        thread.join(GUARD_S)
    finally:
        writer.close()
