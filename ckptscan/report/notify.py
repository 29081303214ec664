"""`--notify URL`: one JSON POST when a run first warns and when it first alerts.

The body is what Slack's and Microsoft Teams' incoming webhooks display as
is, a `text` field (the verdict, family, layers, heads, rollback candidate
and what to do), and the same facts as fields under `ckptscan` for other
receivers:

    {"text": "ckptscan ALERT: attention at step 1500 in /runs/main ...",
     "ckptscan": {"kind": "alert", "step": 1500, "family": "attention", ...}}

Each notice is sent once per run and URL: what was sent is remembered in the
user cache directory (`$XDG_CACHE_HOME/ckptscan/notify/`), so a nightly
re-run or a restarted `watch` does not repeat it. A notice whose POST fails
is not recorded, and goes out with the next report.

A POST waits at most `timeout` seconds, and is tried `attempts` times with a
doubling pause between tries; a notice that still fails raises, and the
caller reports it as one line (`destinations.deliver`). The standard library
only: no dependency for a webhook.
"""

from __future__ import annotations

import hashlib
import json
import time
import urllib.error
import urllib.parse
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.request import Request, urlopen

from ckptscan import __version__
from ckptscan.system.atomic import write_atomic
from ckptscan.system.paths import default_cache_dir
from ckptscan.errors import CkptScanError
from ckptscan.monitors.interventions import interventions_of
from ckptscan.monitors import registry
from ckptscan.report.destinations import run_key, run_location
from ckptscan.schema.results import ScanReport

NOTIFY_ON = ("warn", "alert")  # the default: both the first warning and the first alert
TIMEOUT_S = 5.0
ATTEMPTS = 3
BACKOFF_S = 0.5  # pause after the first failed try; doubles after each


@dataclass(frozen=True)
class Notice:
    kind: str  # "warn" | "alert"
    step: int | None
    family: str


def notices(report: ScanReport, on: tuple[str, ...] = NOTIFY_ON) -> list[Notice]:
    """The run's first warning and first alert (those `on` names), as its summary says."""
    s = report.summary
    found = []
    if "warn" in on:
        warned = [(step, family) for family, step in s.first_warn_step.items() if step is not None]
        if warned:
            step, family = min(warned)
            found.append(Notice("warn", step, family))
    if "alert" in on and s.first_family is not None:
        found.append(Notice("alert", s.first_alert_step.get(s.first_family), s.first_family))
    return found


def notice_payload(report: ScanReport, notice: Notice) -> dict:
    """The POST body: `text` for chat webhooks, the facts under `ckptscan`."""
    s = report.summary
    layers = _layers(report, notice)
    heads = _heads(report, notice, layers)
    rollback = s.rollback_candidate if notice.kind == "alert" else None
    actions = [asdict(i) for i in interventions_of(notice.family)]
    lines = [f"ckptscan {notice.kind.upper()}: {notice.family} at step {notice.step} in {run_location(report)}",
             f"verdict: {s.message or s.status.upper()}"]
    if layers:
        lines.append("layers: " + ", ".join(map(str, layers)))
    if heads:
        lines.append("heads: " + ", ".join(f"layer {layer} head {head}" for layer, head in heads.items()))
    if rollback is not None:
        lines.append(f"rollback candidate: {rollback.path} (step {rollback.step})")
    if actions:
        lines.append("what to do:")
        lines += [f"- {a['action']} [{a['source']}]" for a in actions]
    return {
        "text": "\n".join(lines),
        "ckptscan": {
            "version": __version__, "kind": notice.kind, "step": notice.step, "family": notice.family,
            "run": run_location(report), "status": s.status, "message": s.message, "layers": layers,
            "heads": {str(layer): head for layer, head in heads.items()},
            "rollback_candidate": asdict(rollback) if rollback is not None else None,
            "interventions": actions,
        },
    }


def post_json(url: str, payload: dict, timeout: float = TIMEOUT_S, attempts: int = ATTEMPTS,
              backoff: float = BACKOFF_S) -> None:
    """POST `payload` as JSON; raises CkptScanError once every try failed."""
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise CkptScanError(f"--notify needs an http:// or https:// URL, not {url!r}")
    body = json.dumps(payload).encode()
    reason = ""
    for attempt in range(attempts):
        if attempt:
            time.sleep(backoff * 2 ** (attempt - 1))
        request = Request(url, data=body, method="POST", headers={
            "Content-Type": "application/json", "User-Agent": f"ckptscan/{__version__}"})
        try:
            with urlopen(request, timeout=timeout) as response:
                response.read()
            return
        except urllib.error.HTTPError as e:
            reason = f"HTTP {e.code} {e.reason}"
            if 400 <= e.code < 500 and e.code not in (408, 429):
                break  # the request itself is wrong (a revoked webhook): trying again will not help
        except (urllib.error.URLError, OSError) as e:  # refused, unresolvable, timed out
            reason = str(getattr(e, "reason", e))
    raise CkptScanError(f"notification to {url} failed after {attempt + 1} tries: {reason}")


class Notifier:
    """Sends each notice of a run once: `update(report)` after every judged
    report (each `watch` event, each live step), or once after a scan."""

    def __init__(self, url: str, on: tuple[str, ...] = NOTIFY_ON, state_dir: str | Path | None = None,
                 timeout: float = TIMEOUT_S, attempts: int = ATTEMPTS, backoff: float = BACKOFF_S) -> None:
        unknown = set(on) - set(NOTIFY_ON)
        if unknown:
            raise CkptScanError(f"--notify-on takes {' and/or '.join(NOTIFY_ON)}, not {', '.join(sorted(unknown))}")
        if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            raise CkptScanError(f"--notify needs an http:// or https:// URL, not {url!r}")
        self.url, self.on = url, tuple(on)
        self.state_dir = Path(state_dir) if state_dir is not None else default_cache_dir() / "notify"
        self.timeout, self.attempts, self.backoff = timeout, attempts, backoff

    def update(self, report: ScanReport) -> list[Notice]:
        """POST the notices not sent before; returns those sent now."""
        state = self._state_path(report)
        sent = self._sent(state)
        due = [n for n in notices(report, self.on) if n.kind not in sent]
        if any(n.kind == "alert" for n in due):
            # A first warning not sent yet is covered by the alert, which says more: one message, not two.
            due = [n for n in due if n.kind == "alert"]
            sent.setdefault("warn", None)
        new = []
        for notice in due:
            post_json(self.url, notice_payload(report, notice), self.timeout, self.attempts, self.backoff)
            sent[notice.kind] = notice.step
            new.append(notice)
            try:
                write_atomic(state, json.dumps(sent))
            except OSError as e:
                raise CkptScanError(f"sent, but cannot remember it (a re-run will send it again): "
                                    f"{e.strerror or e}", path=state) from None
        return new

    def _state_path(self, report: ScanReport) -> Path:
        # Per run and URL: the same run may notify two channels.
        return self.state_dir / f"{run_key(report)}-{_url_key(self.url)}.json"

    @staticmethod
    def _sent(path: Path) -> dict[str, int | None]:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return {}


def write_notify(report: ScanReport, url: str, on: tuple[str, ...] = NOTIFY_ON,
                 state_dir: str | Path | None = None) -> list[Notice]:
    """After a scan: the notices of `report` not sent before."""
    return Notifier(url, on, state_dir).update(report)


def _url_key(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()[:12]


def _layers(report: ScanReport, notice: Notice) -> list[int]:
    """Layers with a finding of the notice's family and kind at its step."""
    severities = ("alert",) if notice.kind == "alert" else ("warn", "alert")
    return sorted({layer.layer for pair in report.pairs if pair.to_step == notice.step for layer in pair.layers
                   for f in layer.findings if f.family == notice.family and f.severity in severities})


def _heads(report: ScanReport, notice: Notice, layers: list[int]) -> dict[int, int]:
    """The head each layer's notice names, where its family names one (`FamilySpec.head`: for attention, the
    head whose Δ2 entropy fell most)."""
    family = registry.finding_spec(notice.family)
    if family is None or family.head is None:
        return {}
    named = family.head
    return {layer.layer: head for pair in report.pairs if pair.to_step == notice.step for layer in pair.layers
            if layer.layer in layers and (head := named(layer)) is not None}
