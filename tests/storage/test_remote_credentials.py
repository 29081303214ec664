"""Credentials never leak: a secret in a store's environment variables
appears in no output of ckptscan, healthy or failing — stdout, stderr, the
JSON, JUnit and HTML reports, the cache files and the TensorBoard events —
against each scheme's real server. The emulated GCS takes no credentials, so
its secret is a service-account key the client refuses: the refusal is one
line that does not quote it."""

from __future__ import annotations

import pytest
import servers
from remote_helpers import hf_run
from typer.testing import CliRunner

from ckptscan.cli import app

runner = CliRunner()
SECRET = "s3cr3t-Zq8vK2mW9xR4tY7u"


def with_secret(store, monkeypatch) -> str:
    """The credential the store's client sends, set to SECRET (or, for
    Azurite, whose key is fixed, its key): returns what must never appear."""
    if store.scheme == "s3":
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
        monkeypatch.setenv("AWS_SESSION_TOKEN", SECRET)
        return SECRET
    if store.scheme == "hf":
        monkeypatch.setenv("HF_TOKEN", f"hf_{SECRET}")
        return SECRET
    assert store.scheme == "azure"  # the account key signs every request
    return servers.AZURITE_KEY


def leaked(secret: str, texts: list[str], folder) -> list[str]:
    """Where `secret` (or, for a base64 key, its first 16 characters) appears."""
    needle = secret[:16]
    found = [f"output {i}" for i, text in enumerate(texts) if needle in text]
    found += [str(f) for f in folder.rglob("*") if f.is_file() and needle.encode() in f.read_bytes()]
    return found


@pytest.mark.parametrize("store", ["s3", "azure", "hf"], indirect=True)
def test_a_secret_appears_in_no_output_of_a_healthy_or_a_failing_run(store, proxy, monkeypatch, tmp_path):
    secret = with_secret(store, monkeypatch)
    hf_run(tmp_path / "run", steps=(100, 200, 300))
    url = store.upload(tmp_path / "run", "run")
    out = tmp_path / "out"
    out.mkdir()  # ckptscan makes no folder for a report file (issue 52)
    healthy = runner.invoke(app, ["trend", url, "--format", "json", "--cache-dir", str(out / "cache"),
                                  "--tensorboard", str(out / "tb"), "--html", str(out / "report.html"),
                                  "--json", str(out / "report.json")])
    assert healthy.exit_code == 0, healthy.output
    assert any((out / "cache").rglob("*")) and any((out / "tb").rglob("*"))  # they were written, and are searched
    junit = runner.invoke(app, ["diff", f"{url}/checkpoint-100", f"{url}/checkpoint-200", "--format", "junit"])
    inspected = runner.invoke(app, ["inspect", url, "--format", "json"])
    proxy.fail("checkpoint-300", "403", times=10**6)
    denied = runner.invoke(app, ["diff", f"{url}/checkpoint-200", f"{url}/checkpoint-300"])
    proxy.fail("checkpoint-100/model-00001", "cut", times=10**6, after=1)
    cut = runner.invoke(app, ["diff", f"{url}/checkpoint-100", f"{url}/checkpoint-200", "--format", "json"])
    assert (denied.exit_code, cut.exit_code) == (2, 2), (denied.output, cut.output)
    assert "access denied" in denied.stderr and "read failed after 4 tries" in cut.stderr
    texts = [r.stdout + r.stderr for r in (healthy, junit, inspected, denied, cut)]
    assert leaked(secret, texts, out) == []


@pytest.mark.parametrize("store", ["gcs"], indirect=True)
def test_a_refused_credential_is_one_line_that_does_not_quote_it(store, monkeypatch, tmp_path):
    monkeypatch.setenv("GOOGLE_SERVICE_ACCOUNT_KEY",
                       '{"type": "service_account", "private_key_id": "%s", "client_email": "ci@p.iam.gserviceaccount'
                       '.com", "private_key": "-----BEGIN PRIVATE KEY-----\\n%s\\n-----END PRIVATE KEY-----\\n"}'
                       % (SECRET, SECRET))
    hf_run(tmp_path / "run")
    url = store.upload(tmp_path / "run", "run")
    result = runner.invoke(app, ["diff", f"{url}/checkpoint-100", f"{url}/checkpoint-200"])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {store.url}: cannot configure the gcs client: "), lines
    assert leaked(SECRET, [result.stdout + result.stderr], tmp_path) == []


def test_an_endpoint_url_with_credentials_in_it_is_not_quoted_in_the_error_line(s3, monkeypatch, short_backoff,
                                                                                tmp_path):
    """The S3 client quotes the URL it requested when a request fails; an
    endpoint URL may carry user:password@. The one error line names the
    endpoint without them (`ckptscan.errors.redacted`)."""
    hf_run(tmp_path / "run")
    url = s3.upload(tmp_path / "run", "run")
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://ckpt:{SECRET}@127.0.0.1:9")  # nothing listens on port 9
    result = runner.invoke(app, ["diff", f"{url}/checkpoint-100", f"{url}/checkpoint-200"])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "http://***@127.0.0.1:9/" in lines[0], lines
    assert leaked(SECRET, [result.stdout + result.stderr], tmp_path) == []
