"""The one error type users see: bad input, named precisely, never a traceback."""

from __future__ import annotations

import re
from pathlib import Path

# Credentials a URL can carry into a message: user:password@ in an endpoint
# URL (AWS_ENDPOINT_URL=http://user:secret@host), and the signature or token
# of a signed URL (S3 presigned, Azure SAS, ?token=). A store client quotes the
# URL it requested in its errors; the one error line must not quote them.
_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@]+@")
_SECRET_QUERY = re.compile(r"(?i)([?&](?:x-amz-signature|x-amz-credential|x-amz-security-token|sig|signature"
                           r"|token|access_token|password|secret)=)[^&\s]+")


class CkptScanError(Exception):
    """A problem with the user's input (paths, files, tensors, flags).

    The CLI prints the message on one line and exits with code 2. Messages
    name the file and, where there is one, the tensor.
    """

    # `path`: anything that prints as a path (a str, a Path, a storage.RemotePath).
    def __init__(self, message: str, *, path: str | Path | object = None, tensor: str | None = None):
        where = []
        if path is not None:
            where.append(str(path))
        if tensor is not None:
            where.append(f"tensor '{tensor}'")
        super().__init__(redacted(_printable(f"{': '.join(where)}: {message}" if where else message)))
        self.path = str(path) if path is not None else None
        self.tensor = tensor


def redacted(text: str) -> str:
    """`text` with the credentials of any URL in it replaced by ***."""
    return _SECRET_QUERY.sub(r"\1***", _USERINFO.sub(r"\1***@", text))


def _printable(text: str) -> str:
    """Names come from files: escape newlines and terminal control codes in
    them, so the message stays one harmless line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
