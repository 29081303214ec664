"""http(s):// through fsspec, the path every protocol but s3/gs/az takes:
a real HTTP server on loopback that lists directories (as nginx's autoindex
or `python -m http.server` do) and answers Range requests."""

from __future__ import annotations

import json
import os
import re
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest
from remote_helpers import hf_run, same_numbers
from typer.testing import CliRunner

from ckptscan.cli import app


class RangeHandler(SimpleHTTPRequestHandler):
    """http.server plus single byte ranges (`Range: bytes=a-b`)."""

    def log_message(self, *args):
        pass

    def send_head(self):
        match = re.match(r"bytes=(\d+)-(\d*)$", self.headers.get("Range", ""))
        path = self.translate_path(self.path)
        if match is None or not os.path.isfile(path):
            return super().send_head()
        size = os.path.getsize(path)
        start = int(match.group(1))
        end = min(size - 1, int(match.group(2))) if match.group(2) else size - 1
        f = open(path, "rb")
        f.seek(start)
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        self.remaining = end - start + 1
        return f

    def copyfile(self, source, outputfile):
        remaining = getattr(self, "remaining", None)
        if remaining is None:
            return super().copyfile(source, outputfile)
        outputfile.write(source.read(remaining))


@pytest.fixture
def http_root(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(RangeHandler, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield tmp_path, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_diff_over_http_equals_the_local_diff(http_root):
    root, url = http_root
    older, newer = hf_run(root / "run")
    runner = CliRunner()
    local = runner.invoke(app, ["diff", str(older), str(newer), "--format", "json"])
    remote = runner.invoke(app, ["diff", f"{url}/run/checkpoint-100", f"{url}/run/checkpoint-200", "--format",
                                 "json"])
    assert local.exit_code == remote.exit_code == 0, remote.output
    same_numbers(json.loads(local.stdout), json.loads(remote.stdout))
