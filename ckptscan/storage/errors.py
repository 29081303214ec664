"""What a store client answers besides bytes, and how it is said to the user.

A client raises `NotFound` or `Denied` for those answers (anything else is a
failure worth retrying); `RangedReader` turns them into one `CkptScanError`
naming the URL and the tensor.
"""

from __future__ import annotations

import re

from ckptscan.errors import CkptScanError

# The extra that installs each protocol's client (pyproject.toml).
EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure", "abfss": "azure",
          "azure": "azure", "http": "http", "https": "http", "hf": "hf"}


class NotFound(Exception):
    pass


class Denied(Exception):
    pass


def missing_extra(scheme: str, url: str) -> CkptScanError:
    extra = EXTRAS.get(scheme)
    how = f"pip install 'ckptscan[{extra}]'" if extra else f"install the fsspec implementation of '{scheme}://'"
    return CkptScanError(f"reading {scheme}:// URLs needs an optional dependency: {how}", path=url)


def reason(error: Exception) -> str:
    """A client error in a few words: the HTTP status and the store's error
    code when there is one ("503 Service Unavailable, SlowDown"), else the
    first line of the message."""
    text = str(error).strip()
    status = re.search(r"status code: (\d{3}[A-Za-z ]*)", text)
    if status:
        code = re.search(r"<Code>(\w+)</Code>", text)
        return status.group(1).strip() + (f", {code.group(1)}" if code else "")
    return text.splitlines()[0] if text else type(error).__name__
