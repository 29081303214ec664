"""Shared pieces of the hostile-input tests: raw safetensors bytes, a small
valid checkpoint pair, the real CLI entry point run in-process, and a
snapshot of a directory tree (hashes, mtimes, modes) to prove nothing changed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from factories import llama_config, llama_tensors, next_checkpoint, write_hf_checkpoint

from ckptscan.cli import main


def safetensors_bytes(header: object, data: bytes = b"", header_len: int | None = None) -> bytes:
    """A safetensors file: 8-byte little-endian length, the header, the data.

    `header` is JSON-encoded unless it is already bytes; `header_len` lets a
    test lie about the header's length.
    """
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    length = len(raw) if header_len is None else header_len
    return struct.pack("<Q", length) + raw + data


def write_safetensors(path: Path, header: object, data: bytes = b"", header_len: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(safetensors_bytes(header, data, header_len))
    return path


def two_tensor_header() -> tuple[dict, bytes]:
    """A valid header for w1: F32 [2, 3] and w2: F32 [4], and its data."""
    header = {
        "__metadata__": {"format": "pt"},
        "w1": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
        "w2": {"dtype": "F32", "shape": [4], "data_offsets": [24, 40]},
    }
    data = struct.pack("<10f", *range(10))
    return header, data


def write_pair(root: Path, layers: int = 2, experts: int | None = 4, hidden: int = 64, heads: int = 4,
               kv_heads: int = 2, **kwargs) -> tuple[Path, Path]:
    """Two healthy llama/mixtral checkpoints of one run, root/checkpoint-{100,200}."""
    config = llama_config(layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, experts=experts)
    older = llama_tensors(config, seed=1)
    a = write_hf_checkpoint(root / "checkpoint-100", older, config, **kwargs)
    b = write_hf_checkpoint(root / "checkpoint-200", next_checkpoint(older, seed=2), config, **kwargs)
    return a, b


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str


def run_cli(capsys: pytest.CaptureFixture, *args: object) -> CliResult:
    """Run the real console-script entry point in this process.

    Any exception other than SystemExit (a traceback for the user) propagates
    and fails the test.
    """
    capsys.readouterr()
    argv = sys.argv
    sys.argv = ["ckptscan", *map(str, args)]
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    finally:
        sys.argv = argv
    captured = capsys.readouterr()
    return CliResult(code, captured.out, captured.err)


def assert_one_line_error(result: CliResult, *must_contain: str) -> None:
    """Exit 2, exactly one non-empty line on stderr naming what it must."""
    assert result.code == 2, (result.code, result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    for text in must_contain:
        assert text in lines[0], (text, lines[0])


def tree_snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under `root` (itself included): kind, mode, size, mtime, sha256."""
    snapshot = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [".", *dirnames, *filenames]:
            path = Path(dirpath) / name
            st = path.lstat()
            digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
            key = str(path.relative_to(root))
            snapshot[key] = (st.st_mode, st.st_size, st.st_mtime_ns, digest)
    return snapshot


@contextlib.contextmanager
def deadline(seconds: float):
    """Fail instead of hanging: SIGALRM interrupts a blocked system call or a
    runaway loop (main thread only)."""
    def expire(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
