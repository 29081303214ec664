"""`watch --metrics-port N`: the watched run's health for Prometheus.

    server = MetricsServer(9108)          # serves http://HOST:9108/metrics
    for event in watch_run(run, options):
        server.update(event.report)

Gauges, each labelled with the run (its directory or URL):

- `ckptscan_newest_step`: the newer step of the last pair judged;
- `ckptscan_pairs_scanned`: pairs judged so far;
- `ckptscan_family_severity{family=...}`: 0 ok, 1 warned, 2 alerted, over
  the run so far (the summary's first warning / first alert per family);
- `ckptscan_flagged_layers`: layers at warn or above;
- `ckptscan_first_alert_step`: the run's first alert, NaN before one;
- `ckptscan_last_update_timestamp_seconds`: when the watch last judged (a
  watch that stopped seeing checkpoints shows here).

An alerting rule (docs/guides/alert-destinations.md, "Prometheus"):

    - alert: CheckpointInstability
      expr: max by (run, family) (ckptscan_family_severity) >= 2

The metrics live in the server's own registry, not the client library's
global one, so a training process that already exports metrics keeps its
own. Needs `prometheus_client` (`pip install 'ckptscan[prometheus]'`).
"""

from __future__ import annotations

import math
import time

from ckptscan.errors import CkptScanError
from ckptscan.monitors import registry
from ckptscan.report.destinations import require_package, run_location
from ckptscan.schema.results import ScanReport

DEFAULT_ADDR = "127.0.0.1"  # the endpoint has no authentication: exposing it (0.0.0.0) is the caller's choice


def require_prometheus() -> None:
    """Before a watch starts: --metrics-port needs the package (exit 2 with the fix)."""
    require_package("prometheus_client", "--metrics-port", "prometheus_client", "prometheus")


def family_severity(report: ScanReport, family: str) -> int:
    """0 ok, 1 the family warned, 2 it alerted, in the run so far."""
    s = report.summary
    if s.first_alert_step.get(family) is not None:
        return 2
    return 1 if s.first_warn_step.get(family) is not None else 0


class MetricsServer:
    """An HTTP endpoint serving the gauges of the newest report it was given."""

    def __init__(self, port: int, addr: str = DEFAULT_ADDR) -> None:
        require_prometheus()
        from prometheus_client import CollectorRegistry, Gauge, start_http_server

        self.registry = CollectorRegistry(auto_describe=True)
        run = ["run"]
        self.newest_step = Gauge("ckptscan_newest_step", "Newer step of the last pair judged", run,
                                 registry=self.registry)
        self.pairs = Gauge("ckptscan_pairs_scanned", "Checkpoint pairs judged so far", run, registry=self.registry)
        self.severity = Gauge("ckptscan_family_severity", "0 ok, 1 warned, 2 alerted, over the run so far",
                              ["run", "family"], registry=self.registry)
        self.flagged = Gauge("ckptscan_flagged_layers", "Layers at warn or above", run, registry=self.registry)
        self.first_alert = Gauge("ckptscan_first_alert_step", "Step of the run's first alert (NaN before one)", run,
                                 registry=self.registry)
        self.updated = Gauge("ckptscan_last_update_timestamp_seconds", "When the watch last judged the run", run,
                             registry=self.registry)
        try:
            self.httpd, self._thread = start_http_server(port, addr, registry=self.registry)
        except OSError as e:
            raise CkptScanError(f"--metrics-port {port}: cannot listen on {addr}:{port}: {e.strerror or e}") from None

    @property
    def port(self) -> int:
        """The port served (the one the OS chose when asked for port 0)."""
        return self.httpd.server_port

    def update(self, report: ScanReport) -> None:
        run = run_location(report)
        s = report.summary
        steps = [p.to_step for p in report.pairs if p.to_step is not None]
        self.newest_step.labels(run).set(max(steps) if steps else math.nan)
        self.pairs.labels(run).set(len(report.pairs))
        for family in registry.finding_families():
            self.severity.labels(run, family).set(family_severity(report, family))
        self.flagged.labels(run).set(len(s.flagged_layers))
        first = s.first_alert_step.get(s.first_family) if s.first_family is not None else None
        self.first_alert.labels(run).set(first if first is not None else math.nan)
        self.updated.labels(run).set(time.time())

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
