"""write_output: atomic for regular files and new paths, straight through for
everything else, never a rename over what is not a regular file, and every
failure an OSError naming the path."""

from __future__ import annotations

import errno
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import ckptscan.system.atomic as atomic_module
from ckptscan.system.output import own_descriptor, write_output

ROOT = Path(__file__).resolve().parents[1]


class FifoReader(threading.Thread):
    """Reads a FIFO to its end in the background, as `jq` behind `>(jq .)` would."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path, self.data = path, b""

    def run(self) -> None:
        with open(self.path, "rb") as f:
            self.data = f.read()


def make_char_device(path: Path, minor: int) -> Path:
    """A private node of the kernel's memory devices (major 1): 3 is a null
    device, 7 a full one. Only root may create device nodes."""
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
    except PermissionError:
        pytest.skip("creating a device node needs root (CAP_MKNOD)")
    return path


def test_new_file_and_missing_directories(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "report.json"
    write_output(target, "{}\n")
    assert target.read_text() == "{}\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["report.json"]


def test_regular_file_is_replaced_whole_and_keeps_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    target.write_text("old")
    target.chmod(0o640)
    inode = target.stat().st_ino
    write_output(target, b"new")
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert target.stat().st_ino != inode  # renamed into place, not rewritten in place


def test_symlink_to_a_regular_file_stays_a_symlink(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    write_output(link, "new")
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_text() == "new"


def test_dangling_symlink_creates_its_target(tmp_path: Path) -> None:
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "later.json")
    write_output(link, "new")
    assert link.is_symlink() and (tmp_path / "later.json").read_text() == "new"


def test_append_to_a_regular_file(tmp_path: Path) -> None:
    target = tmp_path / "summary.md"
    write_output(target, "one\n", append=True)
    write_output(target, "two\n", append=True)
    assert target.read_text() == "one\ntwo\n"


@pytest.mark.parametrize("via_symlink", [False, True])
def test_fifo_with_a_reader_stays_a_fifo(tmp_path: Path, via_symlink: bool) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    target = fifo
    if via_symlink:
        target = tmp_path / "link"
        target.symlink_to(fifo)
    reader = FifoReader(fifo)
    reader.start()
    payload = b"x" * 300_000  # more than a pipe buffer: several partial writes
    write_output(target, payload)
    reader.join(timeout=30)
    assert reader.data == payload
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert not via_symlink or target.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({"pipe", target.name})


def test_fifo_whose_reader_went_away_is_an_error(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    opened = threading.Event()

    def read_a_little() -> None:
        with open(fifo, "rb") as f:
            opened.set()
            f.read(1)

    reader = threading.Thread(target=read_a_little, daemon=True)
    reader.start()
    with pytest.raises(BrokenPipeError) as e:
        write_output(fifo, b"x" * 10_000_000)
    assert e.value.filename == str(fifo)
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


def test_private_null_device_stays_a_device(tmp_path: Path) -> None:
    node = make_char_device(tmp_path / "null", 3)
    write_output(node, "report")
    assert stat.S_ISCHR(node.lstat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null"]


@pytest.mark.parametrize("via_symlink", [False, True])
def test_full_device_is_enospc_and_stays_a_device(tmp_path: Path, via_symlink: bool) -> None:
    node = make_char_device(tmp_path / "full", 7)
    target = node
    if via_symlink:
        target = tmp_path / "link"
        target.symlink_to(node)
    with pytest.raises(OSError) as e:
        write_output(target, "report")
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(target)
    assert stat.S_ISCHR(node.lstat().st_mode) and stat.S_ISCHR(node.stat().st_mode)
    assert not via_symlink or target.is_symlink()


def test_dash_is_stdout(capsys: pytest.CaptureFixture) -> None:
    print("before", end=" ")
    write_output("-", "report\n")
    assert capsys.readouterr().out == "before report\n"


def test_dev_fd_writes_to_that_descriptor_in_place(tmp_path: Path) -> None:
    """What `--json >(jq .)` passes: /dev/fd/N of an inherited pipe."""
    read_end, write_end = os.pipe()
    try:
        write_output(f"/dev/fd/{write_end}", "report\n")
        os.close(write_end)
        write_end = -1
        with os.fdopen(read_end, "rb") as f:
            read_end = -1
            assert f.read() == b"report\n"
    finally:
        for fd in (read_end, write_end):
            if fd >= 0:
                os.close(fd)


def test_own_descriptor_names() -> None:
    assert [own_descriptor(n) for n in ("-", "/dev/stdout", "/dev/stderr", "/dev/fd/63", "/proc/self/fd/5")] == \
        [1, 1, 2, 63, 5]
    assert own_descriptor("/dev/full") is None and own_descriptor("report.json") is None


def test_unix_socket_gets_the_bytes(tmp_path: Path) -> None:
    path = tmp_path / "collector.sock"
    received = bytearray()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        server.listen(1)

        def collect() -> None:
            conn, _ = server.accept()
            with conn:
                while chunk := conn.recv(65536):
                    received.extend(chunk)

        collector = threading.Thread(target=collect, daemon=True)
        collector.start()
        write_output(path, "report\n")
        collector.join(timeout=30)
    assert bytes(received) == b"report\n"
    assert stat.S_ISSOCK(path.lstat().st_mode)


def test_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError):
        write_output(tmp_path, "report")


def test_never_renames_over_a_fifo_that_appears_mid_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A FIFO created at the path after write_output looked (it saw nothing
    there) is refused at the rename, and the temp file removed."""
    target = tmp_path / "report.json"
    real_fsync = atomic_module.os.fsync

    def fsync_then_fifo(fd: int) -> None:
        real_fsync(fd)
        if not target.exists():
            os.mkfifo(target)

    monkeypatch.setattr(atomic_module.os, "fsync", fsync_then_fifo)
    with pytest.raises(FileExistsError):
        write_output(target, "report")
    assert stat.S_ISFIFO(target.lstat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_vanished_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The working directory was deleted under the process: ENOENT naming the
    path, nothing created anywhere."""
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    with pytest.raises(FileNotFoundError) as e:
        write_output("report.json", "report")
    assert e.value.filename == "report.json"
    assert list(tmp_path.iterdir()) == []


WRITE_UNPRIVILEGED = """
import sys
from ckptscan.system.output import write_output
try:
    write_output(sys.argv[1], "new")
except OSError as e:
    print(e.errno, e.filename)
"""


def test_permission_denied_keeps_the_old_file(tmp_path: Path) -> None:
    """EACCES for real, in a directory nobody may write to. Root passes
    through modes, so as root the writer runs without the capabilities that
    let it (setpriv drops CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH)."""
    prefix = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without util-linux's setpriv: no way to be refused a write")
        drop = "-dac_override,-dac_read_search"
        prefix = [setpriv, f"--bounding-set={drop}", f"--inh-caps={drop}"]
    directory = tmp_path / "locked"
    directory.mkdir()
    target = directory / "report.json"
    target.write_text("old")
    target.chmod(0o666)  # the file itself is writable: only the directory refuses the temp file
    directory.chmod(0o555)
    try:
        proc = subprocess.run([*prefix, sys.executable, "-c", WRITE_UNPRIVILEGED, str(target)], capture_output=True,
                              text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    finally:
        directory.chmod(0o755)
    assert proc.stdout.split() == [str(errno.EACCES), str(target)], proc.stderr
    assert target.read_text() == "old"
    assert sorted(p.name for p in directory.iterdir()) == ["report.json"]
