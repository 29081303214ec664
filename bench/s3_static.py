"""A minimal S3-compatible server over a local directory, for bench/remote.py.

moto's server (what the tests use) copies the whole object on every ranged
GET and serialises reads of one object, so its time per request grows with
the object: fine for correctness, useless for timing a 1 GB shard. This
server answers the three calls a reader makes (ListObjectsV2 with a
and without a delimiter, HEAD, ranged GET) straight from the files with `os.sendfile`, on
one thread per connection, so what is timed is the client. It checks no
credentials and accepts no writes: it is a benchmark fixture on loopback.
Bucket `bucket` is the directory given.

Loopback has no network: `latency_s` delays each answer (time to first byte)
and `rate` caps each response's bytes per second, to emulate an object
store, whose single GET is slow (tens of ms to first byte, ~100 MB/s) and
whose aggregate throughput comes from many requests in flight. `link_rate`
caps the bytes per second of all responses together: the machine's own
network link (a CI runner's 1 Gbit/s), where the network, not the store or
the CPU, sets the pace.

`StaticS3Process` runs the server in a process of its own, as a real store
is: in the client's process its threads (a Python loop per response, pacing
each MiB) wait for the GIL while the client's own Python runs, and the
emulated link idles for a reason no real link has.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit
from xml.sax.saxutils import escape

_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


class StaticS3:
    def __init__(self, root: Path, bucket: str = "bucket", latency_s: float = 0.0, rate: float | None = None,
                 link_rate: float | None = None):
        self.root, self.bucket = root, bucket
        self.latency_s, self.rate, self.link_rate = latency_s, rate, link_rate
        self._link_free = 0.0  # when the shared link is next idle (perf_counter)
        self._link_lock = threading.Lock()
        self.requests = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # TCP_NODELAY, as real object stores answer: with Nagle's algorithm
            # the body written after the headers waits for the client's delayed
            # ACK (40 ms on Linux), which timed this fixture, not the client.
            disable_nagle_algorithm = True

            def log_message(self, *args):
                pass

            def do_GET(self):
                server.requests += 1
                server.answer(self, body=True)

            def do_HEAD(self):
                server.requests += 1
                server.answer(self, body=False)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def answer(self, request: BaseHTTPRequestHandler, body: bool) -> None:
        if self.latency_s:
            time.sleep(self.latency_s)
        parts = urlsplit(request.path)
        bucket, _, key = unquote(parts.path).lstrip("/").partition("/")
        if bucket != self.bucket:
            return self.error(request, 404, "NoSuchBucket")
        if not key:
            return self.listing(request, parse_qs(parts.query))
        file = self.root / key
        if not file.is_file() or ".." in Path(key).parts:
            return self.error(request, 404, "NoSuchKey")
        size = file.stat().st_size
        start, end, status = 0, size, 200
        match = _RANGE.match(request.headers.get("Range", ""))
        if match:
            start = int(match.group(1))
            end = min(size, int(match.group(2)) + 1) if match.group(2) else size
            status = 206
        request.send_response(status)
        request.send_header("Content-Length", str(end - start))
        request.send_header("ETag", self.etag(file))
        request.send_header("Last-Modified", formatdate(file.stat().st_mtime, usegmt=True))
        request.send_header("Accept-Ranges", "bytes")
        if status == 206:
            request.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        request.end_headers()
        if body:
            request.wfile.flush()
            with open(file, "rb") as f:
                offset, began = start, time.perf_counter()
                paced = self.rate is not None or self.link_rate is not None
                while offset < end:
                    chunk = end - offset if not paced else min(end - offset, 1 << 20)
                    # A chunk is sent when its last byte would have arrived, never
                    # before: at `rate` for this response, and after its turn on the
                    # shared link. (Sending first and waiting after let each response's
                    # first MiB pass unpaced: 32 responses in flight made a 125 MB/s
                    # link carry 136 MB/s.)
                    if self.rate is not None:
                        time.sleep(max(0.0, (offset + chunk - start) / self.rate - (time.perf_counter() - began)))
                    if self.link_rate is not None:
                        with self._link_lock:
                            self._link_free = max(self._link_free, time.perf_counter()) + chunk / self.link_rate
                            due = self._link_free
                        time.sleep(max(0.0, due - time.perf_counter()))
                    sent = os.sendfile(request.connection.fileno(), f.fileno(), offset, chunk)
                    offset += sent

    def listing(self, request: BaseHTTPRequestHandler, query: dict) -> None:
        """ListObjectsV2: with delimiter "/", one level (objects and common
        prefixes); without, every object under the prefix (symlinked folders
        followed: a benchmark's run of symlinks is a run of objects)."""
        prefix = query.get("prefix", [""])[0]
        folder = self.root / prefix if prefix.endswith("/") or not prefix else self.root / prefix.rsplit("/", 1)[0]
        contents, prefixes = [], []
        if folder.is_dir():
            if "delimiter" in query:
                entries = sorted(folder.iterdir())
            else:
                entries = sorted(Path(top) / name for top, _, names in os.walk(folder, followlinks=True)
                                 for name in names)
            for entry in entries:
                key = entry.relative_to(self.root).as_posix()
                if not key.startswith(prefix):
                    continue
                if entry.is_dir():
                    prefixes.append(f"<CommonPrefixes><Prefix>{escape(key)}/</Prefix></CommonPrefixes>")
                else:
                    contents.append(f"<Contents><Key>{escape(key)}</Key><Size>{entry.stat().st_size}</Size>"
                                    f"<ETag>{escape(self.etag(entry))}</ETag><LastModified>2026-01-01T00:00:00.000Z"
                                    "</LastModified><StorageClass>STANDARD</StorageClass></Contents>")
        xml = ('<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><Name>bucket</Name>'
               f"<Prefix>{escape(prefix)}</Prefix><KeyCount>{len(contents) + len(prefixes)}</KeyCount>"
               "<MaxKeys>1000</MaxKeys><Delimiter>/</Delimiter><IsTruncated>false</IsTruncated>"
               + "".join(contents) + "".join(prefixes) + "</ListBucketResult>").encode()
        request.send_response(200)
        request.send_header("Content-Type", "application/xml")
        request.send_header("Content-Length", str(len(xml)))
        request.end_headers()
        request.wfile.write(xml)

    def error(self, request: BaseHTTPRequestHandler, status: int, code: str) -> None:
        xml = f"<?xml version='1.0'?><Error><Code>{code}</Code><Message>{code}</Message></Error>".encode()
        request.send_response(status)
        request.send_header("Content-Type", "application/xml")
        request.send_header("Content-Length", str(len(xml)))
        request.end_headers()
        request.wfile.write(xml)

    @staticmethod
    def etag(file: Path) -> str:
        st = file.stat()
        return '"' + hashlib.md5(f"{file}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest() + '"'


class StaticS3Process:
    """`StaticS3` in a child process (same arguments, same `url`, `close`)."""

    def __init__(self, root: Path, bucket: str = "bucket", latency_s: float = 0.0, rate: float | None = None,
                 link_rate: float | None = None):
        settings = {"root": str(root), "bucket": bucket, "latency_s": latency_s, "rate": rate, "link_rate": link_rate}
        self.process = subprocess.Popen([sys.executable, __file__, json.dumps(settings)], stdout=subprocess.PIPE,
                                        text=True)
        self.url = self.process.stdout.readline().strip()
        if not self.url.startswith("http://"):
            self.close()
            raise RuntimeError(f"the S3 fixture did not start: {self.url!r}")

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description="serve a directory over S3 until killed (StaticS3Process)")
    parser.add_argument("settings", help="JSON: root, bucket, latency_s, rate, link_rate")
    settings = json.loads(parser.parse_args().settings)
    server = StaticS3(Path(settings.pop("root")), **settings)
    print(server.url, flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
