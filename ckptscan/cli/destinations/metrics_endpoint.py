"""--metrics-port PORT (--metrics-addr ADDR): Prometheus gauges of the newest
report, served for as long as the watch runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Optional

from ckptscan.cli.app import note
from ckptscan.cli.destinations.common import Asked
from ckptscan.cli.options import Group, Option
from ckptscan.report.destinations import Delivery

if TYPE_CHECKING:
    from ckptscan.report.prometheus import MetricsServer

METRICS_PORT: Option[int | None] = Option(
    "metrics_port", "--metrics-port", Optional[int], None, metavar="PORT", min=0, max=65535, help="Serve the run's "
    "health as Prometheus metrics on http://ADDR:PORT/metrics while watching (needs pip install "
    "'ckptscan[prometheus]').")
METRICS_ADDR: Option[str] = Option(
    "metrics_addr", "--metrics-addr", str, "127.0.0.1", metavar="ADDR", help="Address --metrics-port listens on. "
    "Default: this machine only; the endpoint has no authentication, so exposing it (0.0.0.0, for a Prometheus on "
    "another host) is your choice.")


@dataclass
class MetricsEndpoint(Asked):
    """--metrics-port N: Prometheus gauges of the newest report, served for
    as long as the watch runs (a port in use: exit 2 before anything is judged)."""

    flag: ClassVar[str] = "--metrics-port"
    options = (METRICS_PORT, METRICS_ADDR)
    port: int
    addr: str
    server: MetricsServer | None = None

    @classmethod
    def asked(cls, given: Group) -> MetricsEndpoint | None:
        port = given[METRICS_PORT]
        return None if port is None else cls(port, given[METRICS_ADDR])

    def check(self) -> None:
        from ckptscan.report.prometheus import require_prometheus

        require_prometheus()

    def open(self, quiet: bool) -> None:
        from ckptscan.report.prometheus import MetricsServer

        self.server = MetricsServer(self.port, self.addr)
        note(f"serving metrics on http://{self.addr}:{self.server.port}/metrics", quiet=quiet)

    def write(self, delivery: Delivery) -> None:
        from ckptscan.report.destinations import deliver

        if self.server is not None:
            deliver(self.flag, self.server.update, delivery.report)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
