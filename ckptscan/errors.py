"""The one error type users see: bad input, named precisely, never a traceback."""

from __future__ import annotations

from pathlib import Path


class CkptScanError(Exception):
    """A problem with the user's input (paths, files, tensors, flags).

    The CLI prints the message on one line and exits with code 2. Messages
    name the file and, where there is one, the tensor.
    """

    def __init__(self, message: str, *, path: str | Path | None = None, tensor: str | None = None):
        where = []
        if path is not None:
            where.append(str(path))
        if tensor is not None:
            where.append(f"tensor '{tensor}'")
        super().__init__(_printable(f"{': '.join(where)}: {message}" if where else message))
        self.path = str(path) if path is not None else None
        self.tensor = tensor


def _printable(text: str) -> str:
    """Names come from files: escape newlines and terminal control codes in
    them, so the message stays one harmless line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
