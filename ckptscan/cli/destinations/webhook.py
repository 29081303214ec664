"""--notify URL (--notify-on warn,alert): a JSON message at the run's first
warning and first alert, once each (a service: a failure is one line on
stderr)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from ckptscan.cli.app import note
from ckptscan.cli.destinations.common import Asked
from ckptscan.cli.options import Group, Option
from ckptscan.report.destinations import Delivery

NOTIFY: Option[str | None] = Option(
    "notify", "--notify", Optional[str], None, metavar="URL", help="POST a JSON message to this webhook at the run's "
    "first warning and first alert, once each per run (a 'text' field Slack and Teams incoming webhooks show as "
    "is).")
NOTIFY_ON: Option[str] = Option("notify_on", "--notify-on", str, "warn,alert", metavar="warn,alert",
                                help="Which of the run's firsts --notify posts: warn, alert, or both.")


@dataclass
class Webhook(Asked):
    """--notify URL: a JSON message at the run's first warning and first alert, once each."""

    flag: ClassVar[str] = "--notify"
    options = (NOTIFY, NOTIFY_ON)
    url: str
    events: tuple[str, ...]

    @classmethod
    def asked(cls, given: Group) -> Webhook | None:
        url = given[NOTIFY]
        return None if url is None else cls(url, notify_events(given[NOTIFY_ON]))

    def check(self) -> None:
        from ckptscan.report.notify import Notifier

        Notifier(self.url, self.events)  # checks the URL's scheme and the events

    def write(self, delivery: Delivery) -> None:
        from ckptscan.report.destinations import deliver
        from ckptscan.report.notify import write_notify

        for notice in deliver(self.flag, write_notify, delivery.report, self.url, self.events) or ():
            note(f"notify: posted the first {notice.kind} ({notice.family}, step {notice.step})", quiet=delivery.quiet)


def notify_events(notify_on: str) -> tuple[str, ...]:
    """--notify-on 'warn,alert' -> ('warn', 'alert')."""
    return tuple(event.strip() for event in notify_on.split(",") if event.strip())
