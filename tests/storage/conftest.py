"""A real server for every object-store scheme on loopback (servers.py),
started once per session: `store` is a fresh bucket (container, Hub repo) on
each of them in turn, `s3` one on S3 alone; `FaultProxy`, a real HTTP proxy
in front of any of them, injects failures."""

from __future__ import annotations

import http.client
import logging
import select
import socket
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import boto3
import pytest
from moto.server import ThreadedMotoServer

# The tests import `remote_helpers` and `servers` beside this file.
sys.path.insert(0, str(Path(__file__).parent))

import servers  # noqa: E402

SCHEMES = ["s3", "gcs", "azure", "hf"]
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
# Environment variables by which a user's own configuration could reach the tests' clients.
FOREIGN = ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "STORAGE_EMULATOR_HOST", "GOOGLE_", "AZURE_", "AZURITE_", "HF_")


@pytest.fixture(scope="session")
def s3_endpoint():
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=servers.free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture(scope="session")
def gcs_endpoint():
    process, url = servers.start_fake_gcs()
    yield url
    servers.stop(process)


@pytest.fixture(scope="session")
def azure_endpoint():
    process, url = servers.start_azurite()
    yield url
    servers.stop(process)


@pytest.fixture(scope="session")
def hf_endpoint(tmp_path_factory):
    hub = servers.HubEmulation(tmp_path_factory.mktemp("hub"))
    yield hub
    hub.close()


class Store:
    """A fresh bucket (container, repo) on one scheme's server. `url` is its
    root as ckptscan is given it; `point_at` sets the environment variables a
    user of that store sets, aimed at `server` (the store, or a proxy)."""

    scheme: str
    url: str
    server: str
    # What the store answers for throttling and refusal (FaultProxy's error bodies).
    codes = {"503": "SlowDown", "403": "AccessDenied"}
    # Requests the store's client sends once per command before any of ckptscan's (paths).
    client_setup: tuple[str, ...] = ()

    def upload(self, local: Path, prefix: str, skip: tuple[str, ...] = ()) -> str:
        """Every file under `local` to <url>/prefix/…; returns that URL."""
        for file in sorted(local.rglob("*")):
            relative = file.relative_to(local).as_posix()
            if file.is_file() and relative not in skip:
                self.put(f"{prefix}/{relative}", file.read_bytes())
        return f"{self.url}/{prefix}"

    def put(self, key: str, body: bytes) -> None:
        raise NotImplementedError

    def point_at(self, monkeypatch, server: str) -> None:
        raise NotImplementedError


class S3Bucket(Store):
    scheme = "s3"

    def __init__(self, server: str, name: str):
        self.server, self.name, self.url = server, name, f"s3://{name}"
        self.client = boto3.client("s3", endpoint_url=server, region_name="us-east-1")
        self.client.create_bucket(Bucket=name)

    def put(self, key: str, body: bytes) -> None:
        self.client.put_object(Bucket=self.name, Key=key, Body=body)

    def point_at(self, monkeypatch, server: str) -> None:
        for name, value in CREDENTIALS.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("AWS_ENDPOINT_URL", server)


class GCSBucket(Store):
    scheme = "gcs"

    def __init__(self, server: str, name: str):
        self.server, self.name, self.url = server, name, f"gs://{name}"
        servers.gcs_create_bucket(server, name)

    def put(self, key: str, body: bytes) -> None:
        servers.gcs_put(self.server, self.name, key, body)

    def point_at(self, monkeypatch, server: str) -> None:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", server)


class AzureContainer(Store):
    scheme = "azure"
    codes = {"503": "ServerBusy", "403": "AuthorizationPermissionMismatch"}

    def __init__(self, endpoint: str, name: str):
        self.server = endpoint.rsplit("/", 1)[0]  # the account is the path's first part
        self.endpoint, self.name, self.url = endpoint, name, f"az://{name}"
        servers.azure_request(endpoint, "PUT", name, {"restype": "container"})

    def put(self, key: str, body: bytes) -> None:
        servers.azure_request(self.endpoint, "PUT", f"{self.name}/{key}", body=body)

    def point_at(self, monkeypatch, server: str) -> None:
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING",
                           servers.azure_connection_string(f"{server}/{servers.AZURITE_ACCOUNT}"))


class HubRepo(Store):
    scheme = "hf"
    codes = {"503": "ServiceUnavailable", "403": "GatedRepo"}

    def __init__(self, hub: servers.HubEmulation, name: str):
        self.hub, self.server = hub, hub.url
        self.folder = hub.root / "ckptscan" / name
        self.folder.mkdir(parents=True)
        self.url = f"hf://ckptscan/{name}"
        # huggingface_hub resolves the repo (and fetches its agent registry, at most daily) first.
        self.client_setup = ("/api/agent-harnesses", f"/api/models/ckptscan/{name}")

    def put(self, key: str, body: bytes) -> None:
        (self.folder / key).parent.mkdir(parents=True, exist_ok=True)
        (self.folder / key).write_bytes(body)

    def point_at(self, monkeypatch, server: str) -> None:
        monkeypatch.setenv("HF_ENDPOINT", server)
        monkeypatch.setenv("HF_TOKEN", "hf_testing")


def open_store(scheme: str, request, monkeypatch, tmp_path) -> Store:
    import os

    for name in list(os.environ):
        if name.startswith(FOREIGN):
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    for variable, value in CREDENTIALS.items():  # boto3's, uploading to S3
        monkeypatch.setenv(variable, value)
    name = f"b-{tmp_path.name.lower().replace('_', '-')[-40:].strip('-')}"
    kind = {"s3": S3Bucket, "gcs": GCSBucket, "azure": AzureContainer, "hf": HubRepo}[scheme]
    store = kind(request.getfixturevalue(f"{scheme}_endpoint"), name)
    store.point_at(monkeypatch, store.server)
    return store


@pytest.fixture
def s3(request, monkeypatch, tmp_path) -> Store:
    """A fresh S3 bucket, fake credentials and the local endpoint in the
    environment, as a user of an S3-compatible store sets them."""
    return open_store("s3", request, monkeypatch, tmp_path)


@pytest.fixture(params=SCHEMES)
def store(request, monkeypatch, tmp_path) -> Store:
    """A fresh bucket on each scheme's server in turn (test ids end in
    [s3], [gcs], [azure], [hf]: `pytest -k gcs` selects one)."""
    return open_store(request.param, request, monkeypatch, tmp_path)


class FaultProxy:
    """Forwards every request to a store's server, except that a request
    whose (decoded) path contains `match` is answered by `fault` for its
    first `times` occurrences: "500", "503" (throttling), "403" (refused),
    "cut" (the real response's headers, then half its body, then the
    connection closed) or "stall" (no answer until the client closes the
    connection, counted in `abandoned`; after `STALL_S`, the real answer).
    Error bodies carry the store's own codes. Records each request's method and path, and the body bytes
    of the ranged GETs (object reads, not listings) it forwarded whole.

    Round trips are counted by the proxy, not timed: `hold_waves([n1, n2, ...])` holds every request
    until the wave it belongs to is whole (its first n1 requests are answered together once all n1 have
    arrived, then the next n2, ...), and `waves` records the paths of each wave as it was answered. A
    client that sends a wave's requests side by side fills each wave at once, however loaded the
    machine; one that waits for an answer before sending the rest of a wave leaves it short: after
    `WAVE_TIMEOUT_S` what arrived is answered as a wave of its own, holding stops (`short_waves`), and
    each later request is a wave of its own too, as is every request past the waves expected."""

    STALL_S = 20.0
    WAVE_TIMEOUT_S = 20.0

    def __init__(self, upstream: str, codes: dict[str, str]):
        self.upstream = upstream.removeprefix("http://")
        self.codes = {"500": "InternalError", **codes}
        self.rules: list[list] = []
        self.seen: list[tuple[str, str]] = []
        self.waves: list[list[str]] = []  # the paths of each wave answered, in order (hold_waves)
        self.short_waves = 0
        self._expected: list[int] | None = None  # the sizes of the waves still to come; None: not holding
        self._leave_out: tuple[str, ...] = ()
        self._pending: list[str] = []  # the requests of the wave being filled
        self._released = threading.Condition()
        self.faults_sent = 0
        self.bytes_sent = 0
        self.abandoned = 0
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                proxy.handle(self)

            do_HEAD = do_PUT = do_POST = do_DELETE = do_GET

        self.server = servers.Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        # close() waits for the serving loop's next poll: 0.5 s by default, at the end of every test.
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def hold_waves(self, sizes: list[int], leave_out: tuple[str, ...] = ()) -> None:
        """Answer the requests from now on in waves of these sizes (see the class docstring).
        `leave_out`: paths (without query) that pass at once, in no wave (e.g. the Hub client's
        resolve of the repo, once per command)."""
        with self._released:
            self._expected, self._leave_out, self.waves, self._pending = list(sizes), leave_out, [], []

    def _join_wave(self, path: str) -> None:
        """Hold a request until its wave is whole (or short, after WAVE_TIMEOUT_S)."""
        with self._released:
            if self._expected is None or path.split("?")[0] in self._leave_out:
                return
            if not self._expected:  # past the waves expected, or after a short one
                self.waves.append([path])
                return
            self._pending.append(path)
            if len(self._pending) == self._expected[0]:
                self._release()
                return
            wave = len(self.waves)
            deadline = time.monotonic() + self.WAVE_TIMEOUT_S
            while len(self.waves) == wave:
                left = deadline - time.monotonic()
                if left <= 0:  # the client waits for an answer before sending the rest of the wave
                    self.short_waves += 1
                    self._release()
                    self._expected = []
                    return
                self._released.wait(left)

    def _release(self) -> None:
        self.waves.append(self._pending)
        self._pending = []
        self._expected.pop(0)
        self._released.notify_all()

    def fail(self, match: str, fault: str, times: int, after: int = 0) -> None:
        """`after`: let that many matching requests through first (a shard's header read)."""
        self.rules.append([match, fault, times, after])

    def _rule(self, path: str, command: str) -> list | None:
        """The rule this request meets, its fault counted now, under the lock: concurrent requests
        must not both take a rule's last fault (a cut is decided here too, not after the upstream
        answered, and given back in `handle` when the answer has no body to cut)."""
        with self.lock:
            rule = next((r for r in self.rules if r[0] in path and r[2] > 0), None)
            if rule is not None and rule[3] > 0:
                rule[3] -= 1
                return None
            if rule is not None and rule[1] == "cut" and command != "GET":
                return None
            if rule is not None:
                rule[2] -= 1
                self.faults_sent += 1
            return rule

    def _abandoned(self, request: BaseHTTPRequestHandler) -> bool:
        """Wait, answering nothing, until the client gives up on the request
        (closes the connection: True) or STALL_S passes (False)."""
        deadline = time.monotonic() + self.STALL_S
        while time.monotonic() < deadline:
            readable, _, _ = select.select([request.connection], [], [], 0.05)
            if readable and not request.connection.recv(1, socket.MSG_PEEK):
                with self.lock:
                    self.abandoned += 1
                request.close_connection = True
                return True
        return False

    def handle(self, request: BaseHTTPRequestHandler) -> None:
        self.seen.append((request.command, request.path))
        self._join_wave(request.path)
        body = request.rfile.read(int(request.headers.get("Content-Length") or 0))
        rule = self._rule(urllib.parse.unquote(request.path), request.command)
        if rule is not None and rule[1] == "stall" and self._abandoned(request):
            return
        if rule is not None and rule[1] != "cut":
            status = int(rule[1])
            code = self.codes[rule[1]]
            payload = f"<?xml version='1.0'?><Error><Code>{code}</Code><Message>{code}</Message></Error>".encode()
            request.send_response(status)
            request.send_header("X-Error-Code", code)  # where the Hub puts it
            request.send_header("Content-Type", "application/xml")
            request.send_header("Content-Length", str(len(payload)))
            request.end_headers()
            request.wfile.write(payload)
            return
        connection = http.client.HTTPConnection(self.upstream, timeout=30)
        # The upstream's own Host: fake-gcs-server tells its XML API from its JSON API by it.
        headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
        connection.request(request.command, request.path, body=body or None,
                           headers={"Host": self.upstream, **headers})
        response = connection.getresponse()
        data = response.read()
        request.send_response(response.status)
        for name, value in response.getheaders():
            if name.lower() not in ("transfer-encoding", "connection", "server", "date"):
                request.send_header(name, value)
        if response.getheader("Content-Length") is None:  # a chunked answer, forwarded whole
            request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        if rule is not None and len(data) <= 1:  # nothing to cut: the fault is given back
            with self.lock:
                rule[2] += 1
                self.faults_sent -= 1
            rule = None
        if rule is not None:
            request.wfile.write(data[:len(data) // 2])
            request.wfile.flush()
            request.close_connection = True
            return
        if request.command != "HEAD":
            request.wfile.write(data)
            if request.command == "GET" and request.headers.get("Range"):
                with self.lock:
                    self.bytes_sent += len(data)
        request.wfile.flush()
        connection.close()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def proxy(store, monkeypatch):
    """The store as ckptscan sees it, through a FaultProxy; a client request
    timeout short enough for the "stall" fault."""
    from ckptscan.storage import fsspec_client, obstore_client

    fault_proxy = FaultProxy(store.server, store.codes)
    store.point_at(monkeypatch, fault_proxy.url)
    for client in (obstore_client, fsspec_client):
        monkeypatch.setattr(client, "TIMEOUT_S", 1.0)
    yield fault_proxy
    fault_proxy.close()


@pytest.fixture
def short_backoff(monkeypatch):
    """Retries 10x closer together than by default (`CKPTSCAN_RETRY_BACKOFF`),
    for a fault that never ends: the same tries and the same error, without
    waiting through seconds of backoff."""
    monkeypatch.setenv("CKPTSCAN_RETRY_BACKOFF", "0.02")
