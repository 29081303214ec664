"""The one way ckptscan writes a file: reports, figures, summaries, cache
entries, probe files.

What a destination is decides how it is written:
- a regular file, or nothing yet: atomically (`ckptscan.system.atomic`: temp file,
  fsync, rename), so a reader sees the old file or the whole new one, and a
  failed write leaves the old file as it was. A symlink to a regular file is
  followed: the file it points to is replaced, the link stays a link.
- `-`, `/dev/stdout`, `/dev/stderr`, `/dev/fd/N`, `/proc/self/fd/N`: the
  process's own descriptor, written in place. Process substitution
  (`--json >(jq .)`) passes `/dev/fd/63`; renaming anything over it, or
  reopening it at offset 0, would lose what the reader expects.
- anything else (a named pipe, a character or block device, a socket, a
  symlink to one of them): opened and written straight through, never
  renamed over. `/dev/full` stays a device, a FIFO stays a FIFO and its
  reader gets the bytes.
- a directory: refused (EISDIR).

Every failure is an OSError naming the path (`e.filename`), raised to the
caller, which turns it into one line and exit code 2 (or, for the cache, a
note): ENOSPC, EROFS, EACCES, a vanished directory, a reader of a named file
or FIFO that went away (EPIPE) are never swallowed.

The one exception is stdout whose reader went away (`ckptscan trend RUN |
head -1`): by the convention of command-line tools the reader has what it
wanted, so that is no error. The rest of stdout is discarded
(`reader_gone`), the command finishes, and it exits with its own outcome: 0
healthy, or the gate's 1 with its reason on stderr. A pipeline under `set -o
pipefail` then fails a run for the run's verdict, never for `head`.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import stat
import sys
from pathlib import Path

from ckptscan.system.atomic import write_atomic

STDOUT = "-"
# Names of the process's own descriptors (Linux's /dev and /proc magic links).
_OWN_FD = re.compile(r"/dev/(?:fd/(\d+)|(stdin|stdout|stderr))|/proc/self/fd/(\d+)")
_STD_FDS = {"stdin": 0, "stdout": 1, "stderr": 2}


def write_output(path: str | os.PathLike[str], data: str | bytes, *, append: bool = False) -> None:
    """Write `data` (text as UTF-8) to `path`, by the rules in the module docstring.

    `append` adds to what the destination holds (GitHub step summaries
    accumulate); a regular file is then rewritten atomically as old + new, so
    a full disk cannot leave half a summary behind.
    """
    payload = data.encode("utf-8") if isinstance(data, str) else data
    name = os.fspath(path)
    try:
        _write(name, payload, append)
    except OSError as e:
        e.filename = name  # the path the user gave, not a temp file's or a parent's
        raise


def _write(name: str, payload: bytes, append: bool) -> None:
    fd = own_descriptor(name)
    if fd is not None:
        _write_descriptor(fd, payload)
        return
    try:
        st = os.stat(name)  # follows symlinks: the type of what is written to
    except FileNotFoundError:
        st = None
    if st is None or stat.S_ISREG(st.st_mode):
        # realpath: write where a symlink points instead of replacing the link.
        target = Path(os.path.realpath(name))
        write_atomic(target, (_existing(target) + payload) if append else payload)
    elif stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), name)
    elif stat.S_ISSOCK(st.st_mode):
        _write_socket(name, payload)
    else:
        _write_through(name, payload, append)


def own_descriptor(name: str) -> int | None:
    """The file descriptor `name` stands for (`-` is stdout), else None."""
    if name == STDOUT:
        return 1
    match = _OWN_FD.fullmatch(name)
    if match is None:
        return None
    number, std, proc = match.groups()
    return _STD_FDS[std] if std else int(number or proc)


def _write_descriptor(fd: int, payload: bytes) -> None:
    # stdout and stderr go through Python's streams (flushed in order with
    # what was printed before, and captured where a caller replaced them).
    stream = {1: sys.stdout, 2: sys.stderr}.get(fd)
    if stream is None:
        _write_all(fd, payload)
        return
    try:
        stream.flush()
        binary = getattr(stream, "buffer", None)  # absent where a caller put a StringIO
        if binary is not None:
            binary.write(payload)
        else:
            stream.write(payload.decode("utf-8", "replace"))
        stream.flush()
    except BrokenPipeError:
        if fd != 1:
            raise
        reader_gone(fd)


def reader_gone(fd: int) -> None:
    """The reader of this process's `fd` (stdout) went away: point the
    descriptor at /dev/null, so that whatever is still written to it, and
    the interpreter's last flush at exit, go nowhere without an error."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def _write_through(name: str, payload: bytes, append: bool) -> None:
    """A FIFO or device: open it as it is (no O_CREAT, no O_TRUNC), write, close.

    Opening a FIFO waits for a reader, as a shell redirection does; Ctrl-C
    interrupts the wait.
    """
    flags = os.O_WRONLY | os.O_NOCTTY | os.O_CLOEXEC | (os.O_APPEND if append else 0)
    fd = os.open(name, flags)
    try:
        _write_all(fd, payload)
    finally:
        os.close(fd)


def _write_socket(name: str, payload: bytes) -> None:
    """A Unix stream socket: connect and send, as to a log collector."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(name)
        sock.sendall(payload)


def _write_all(fd: int, payload: bytes) -> None:
    view = memoryview(payload)
    while view:
        view = view[os.write(fd, view):]


def _existing(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""
