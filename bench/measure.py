"""Measurement helpers shared by the benchmarks: page-cache eviction, a child
process's wall time and peak RSS, the I/O floor, and the machine's description."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ckptscan.readers.safetensors import read_header


def evict(files: list[Path]) -> bool:
    """Drop these files' pages from the page cache (POSIX_FADV_DONTNEED; no
    root needed, and other users' cached files are left alone). Returns
    whether the kernel took the hint for every file (clean pages only: the
    generator fsyncs what it writes)."""
    ok = True
    for file in files:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            ok = False
        finally:
            os.close(fd)
    return ok


def cached_bytes(files: list[Path]) -> int | None:
    """Bytes of these files now in the page cache (mincore via util-linux
    `fincore`), or None when fincore is not installed."""
    try:
        out = subprocess.run(["fincore", "-b", "-n", "-o", "RES", *map(str, files)], capture_output=True,
                             text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return sum(int(line) for line in out.split())


@dataclass
class ChildRun:
    wall_s: float
    peak_rss_bytes: int
    returncode: int
    output: str


def run_child(cmd: list[str], cwd: str | Path | None = None) -> ChildRun:
    """Run a command; its wall time and its own peak RSS.

    The peak comes from GNU time (`/usr/bin/time -f %M`), not from this
    process's wait4: Linux carries a forked child's copy of the parent's RSS
    high-water mark across exec, so a child of a large parent would report
    the parent's peak. Forked from the small `time` process, it cannot.
    """
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as rss:
        start = time.perf_counter()
        done = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", rss.name, *cmd], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, cwd=cwd)
        wall = time.perf_counter() - start
        peak_kb = int(rss.read().split()[-1])
    return ChildRun(wall, peak_kb * 1024, done.returncode, done.stdout.decode(errors="replace"))


def startup_seconds(python: str) -> float:
    """Wall time of `ckptscan --help`: the fixed cost (interpreter, torch and
    ckptscan imports) inside every timed ckptscan run."""
    return min(run_child([python, "-m", "ckptscan", "--help"]).wall_s for _ in range(3))


def monitored_entries(checkpoint: Path, names: set[str]) -> list[tuple[Path, int, int]]:
    """(file, start, end) byte ranges of the named tensors, in file order."""
    ranges = []
    for file in sorted(checkpoint.glob("*.safetensors")):
        entries, _ = read_header(file)
        ranges.extend((file, e.start, e.end) for name, e in entries.items() if name in names)
    return sorted(ranges, key=lambda r: (str(r[0]), r[1]))


def read_ranges(ranges: list[tuple[Path, int, int]]) -> tuple[float, int]:
    """The I/O floor: read exactly these byte ranges with pread, one buffer
    per tensor as ckptscan does, nothing else. Returns (seconds, bytes)."""
    start, total = time.perf_counter(), 0
    fds: dict[Path, int] = {}
    try:
        for file, lo, hi in ranges:
            fd = fds.get(file)
            if fd is None:
                fd = fds[file] = os.open(file, os.O_RDONLY)
            buf = bytearray(hi - lo)
            view, done = memoryview(buf), 0
            while done < len(buf):
                got = os.preadv(fd, [view[done:]], lo + done)
                if got == 0:
                    raise OSError(f"{file} ends early")
                done += got
            total += len(buf)
    finally:
        for fd in fds.values():
            os.close(fd)
    return time.perf_counter() - start, total


def symlink_run(directory: Path, checkpoints: list[Path]) -> Path:
    """A run directory of symlinks to these checkpoints (the cache keys resolve them)."""
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    for ckpt in checkpoints:
        (directory / ckpt.name).symlink_to(ckpt)
    return directory


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
    cpus = len(os.sched_getaffinity(0))
    return (f"{cpu}, {cpus} cores, {mem:.0f} GiB RAM, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}, torch {torch.__version__}")


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())
