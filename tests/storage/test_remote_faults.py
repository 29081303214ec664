"""Failures of a real server of each scheme (`store`: s3, gcs, azure, hf),
injected by a real HTTP proxy in front of it: transient errors, throttling,
cut responses and timeouts are retried and change nothing; a missing or
short object, a response cut for good and a refused request end in one line
naming the URL (and tensor), exit 2. Nothing is ever written."""

from __future__ import annotations

import json
import sys

import pytest
from remote_helpers import hf_run, same_numbers
from typer.testing import CliRunner

from ckptscan.cli import app

runner = CliRunner()
SHARD = "checkpoint-200/model-00001-of-00002.safetensors"


@pytest.fixture
def uploaded(store, tmp_path):
    folders = hf_run(tmp_path / "run")
    url = store.upload(tmp_path / "run", "run")
    local = runner.invoke(app, ["diff", *map(str, folders), "--format", "json"])
    assert local.exit_code == 0, local.output
    return url, json.loads(local.stdout)


def diff(url: str):
    return runner.invoke(app, ["diff", f"{url}/checkpoint-100", f"{url}/checkpoint-200", "--format", "json"])


def one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    assert result.stdout == ""  # no partial JSON
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


@pytest.mark.parametrize("fault", ["500", "503", "cut", "stall"])
def test_a_request_that_fails_twice_then_succeeds_is_retried(proxy, uploaded, fault):
    """500, 503 (throttling), a body cut in half or no answer within the
    request timeout, twice on the tensor data of one shard: the result is the
    same as without faults."""
    url, local = uploaded
    proxy.fail(SHARD, fault, times=2, after=1)
    result = diff(url)
    assert result.exit_code == 0, result.output
    assert proxy.faults_sent == 2
    assert proxy.abandoned == (2 if fault == "stall" else 0)  # the client's timeout, not the proxy, ended a stall
    same_numbers(local, json.loads(result.stdout))
    assert {method for method, _ in proxy.seen} <= {"GET", "HEAD"}  # nothing written to the store


def test_a_response_cut_every_time_is_an_error_naming_url_and_tensor(proxy, uploaded, short_backoff):
    url, _ = uploaded
    proxy.fail(SHARD, "cut", times=10**6, after=1)  # the header arrives, the tensor data never does
    line = one_line_error(diff(url))
    assert line.startswith(f"error: {url}/{SHARD}: tensor 'model.layers.0.self_attn."), line
    assert "read failed after 4 tries" in line


def test_throttling_that_never_ends_gives_up_with_the_reason(store, proxy, uploaded, short_backoff):
    url, _ = uploaded
    proxy.fail(SHARD, "503", times=10**6)
    line = one_line_error(diff(url))
    assert line == f"error: {url}/{SHARD}: read failed after 4 tries: 503 Service Unavailable, {store.codes['503']}"


def test_access_denied_says_so(store, proxy, uploaded):
    url, _ = uploaded
    proxy.fail("checkpoint-100", "403", times=10**6)
    line = one_line_error(diff(url))
    assert line == (f"error: {url}/checkpoint-100: access denied (403 Forbidden, {store.codes['403']}); check the "
                    "credentials (environment, profile or instance role) and that they may read this bucket")


def test_a_missing_shard_is_a_clear_error(store, tmp_path):
    hf_run(tmp_path / "run")
    url = store.upload(tmp_path / "run", "run", skip=(SHARD,))
    line = one_line_error(diff(url))
    assert f"{url}/checkpoint-200/model.safetensors.index.json" in line
    assert "names shard 'model-00001-of-00002.safetensors', which does not exist" in line


def test_a_short_object_is_a_clear_error(s3, tmp_path):
    """A shard whose object is shorter than its header says (an upload cut
    short): refused when its header is read, before any tensor."""
    hf_run(tmp_path / "run")
    url = s3.upload(tmp_path / "run", "run", skip=(SHARD,))
    data = (tmp_path / "run" / SHARD).read_bytes()
    s3.put(f"run/{SHARD}", data[:len(data) - 100])
    line = one_line_error(diff(url))
    assert f"{url}/{SHARD}" in line and ": truncated: the header declares" in line, line


def test_a_missing_extra_names_the_pip_command(monkeypatch):
    """Without obstore installed (None in sys.modules makes its import fail),
    an s3:// URL says which extra to install."""
    for module in ("obstore", "obstore.store", "obstore.exceptions"):
        monkeypatch.setitem(sys.modules, module, None)
    line = one_line_error(runner.invoke(app, ["diff", "s3://b/a", "s3://b/b"]))
    assert line == "error: s3://b: reading s3:// URLs needs an optional dependency: pip install 'ckptscan[s3]'"


def test_an_unknown_protocol_is_a_clear_error():
    result = runner.invoke(app, ["inspect", "nosuchproto://bucket/x"])
    assert result.exit_code == 2
    assert "install the fsspec implementation of 'nosuchproto://'" in result.stderr
