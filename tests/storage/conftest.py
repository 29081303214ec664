"""A real S3-compatible server on loopback for the storage tests: moto's
ThreadedMotoServer (the `test` extra), started once per session, and
`FaultProxy`, a real HTTP proxy in front of it that injects failures."""

from __future__ import annotations

import http.client
import logging
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import boto3
import pytest
from moto.server import ThreadedMotoServer

# The tests import `remote_helpers` beside this file.
sys.path.insert(0, str(Path(__file__).parent))

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_endpoint():
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3(s3_endpoint, monkeypatch, tmp_path):
    """Fake credentials and the local endpoint in the environment, as a user
    of an S3-compatible store sets them; a fresh bucket per test."""
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    bucket = f"b-{tmp_path.name.lower().replace('_', '-')[-40:].strip('-')}"
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=bucket)
    return Bucket(client, bucket)


class Bucket:
    def __init__(self, client, name: str):
        self.client = client
        self.name = name

    def upload(self, local: Path, prefix: str, skip: tuple[str, ...] = ()) -> str:
        """Every file under `local` to s3://bucket/prefix/…; returns that URL."""
        for file in sorted(local.rglob("*")):
            relative = file.relative_to(local).as_posix()
            if file.is_file() and relative not in skip:
                self.client.put_object(Bucket=self.name, Key=f"{prefix}/{relative}", Body=file.read_bytes())
        return f"s3://{self.name}/{prefix}"

    def put(self, key: str, body: bytes) -> None:
        self.client.put_object(Bucket=self.name, Key=key, Body=body)


class FaultProxy:
    """Forwards every request to the S3 server, except that a request whose
    path contains `match` is answered by `fault` for its first `times`
    occurrences: "500", "503" (SlowDown), "403" (AccessDenied), or "cut"
    (the real response's headers, then half its body, then the connection
    closed). Records each request's method and path."""

    def __init__(self, upstream: str):
        self.upstream = upstream.removeprefix("http://")
        self.rules: list[list] = []
        self.seen: list[tuple[str, str]] = []
        self.faults_sent = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                proxy.handle(self)

            do_HEAD = do_PUT = do_POST = do_DELETE = do_GET

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def fail(self, match: str, fault: str, times: int, after: int = 0) -> None:
        """`after`: let that many matching requests through first (a shard's header read)."""
        self.rules.append([match, fault, times, after])

    def handle(self, request: BaseHTTPRequestHandler) -> None:
        self.seen.append((request.command, request.path))
        body = request.rfile.read(int(request.headers.get("Content-Length") or 0))
        rule = next((r for r in self.rules if r[0] in request.path and r[2] > 0), None)
        if rule is not None and rule[3] > 0:
            rule[3] -= 1
            rule = None
        if rule is not None and rule[1] != "cut":
            rule[2] -= 1
            self.faults_sent += 1
            status, code = {"500": (500, "InternalError"), "503": (503, "SlowDown"),
                            "403": (403, "AccessDenied")}[rule[1]]
            payload = f"<?xml version='1.0'?><Error><Code>{code}</Code><Message>{code}</Message></Error>".encode()
            request.send_response(status)
            request.send_header("Content-Type", "application/xml")
            request.send_header("Content-Length", str(len(payload)))
            request.end_headers()
            request.wfile.write(payload)
            return
        connection = http.client.HTTPConnection(self.upstream, timeout=30)
        connection.request(request.command, request.path, body=body or None,
                           headers={k: v for k, v in request.headers.items()})
        response = connection.getresponse()
        data = response.read()
        request.send_response(response.status)
        for name, value in response.getheaders():
            if name.lower() not in ("transfer-encoding", "connection", "server", "date"):
                request.send_header(name, value)
        request.end_headers()
        if rule is not None and request.command == "GET" and len(data) > 1:
            rule[2] -= 1
            self.faults_sent += 1
            request.wfile.write(data[:len(data) // 2])
            request.wfile.flush()
            request.close_connection = True
            return
        if request.command != "HEAD":
            request.wfile.write(data)
        connection.close()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def proxy(s3, s3_endpoint, monkeypatch):
    """The store as ckptscan sees it, through a FaultProxy."""
    fault_proxy = FaultProxy(s3_endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL", fault_proxy.url)
    yield fault_proxy
    fault_proxy.close()
