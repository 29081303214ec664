"""safetensors checkpoints: one file, a folder of shards, or a sharded
checkpoint's index; each file's header parsed and validated, then exact byte
ranges read.

We parse the format ourselves (8-byte little-endian header length, a JSON
header, then raw row-major little-endian data) instead of memory-mapping the
file: a header is validated before any allocation, each tensor (or a block of
its rows) costs one `pread` of exactly its bytes, which is what shared
storage wants, and every error can name the file and the tensor. A shard in
object storage (a `RemotePath`) is read the same way, by ranged GETs.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import stat
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from ckptscan.errors import CkptScanError
from ckptscan.readers import sidecars
from ckptscan.readers.base import DTYPES, Checkpoint, Format
from ckptscan.readers.steps import step_from_name
from ckptscan.storage import RemotePath
from ckptscan.storage.ranged import Fetch, abandoner

# A remote header is fetched with its first request: this covers the header
# of a shard of several hundred tensors in one GET (a larger one costs a
# second GET), and over-reads at most this much per shard.
REMOTE_HEADER_GUESS = 64 * 1024
# A real header is a few MB even for 100k-tensor shards; a larger length is a
# corrupt or hostile file, refused before anything is allocated.
MAX_HEADER_BYTES = 100 * 1024 * 1024

@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor's bytes are: absolute offsets in `file`."""

    file: Path | RemotePath
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype].itemsize


def read_header(path: Path | RemotePath) -> tuple[dict[str, TensorEntry], dict[str, str]]:
    """Validate a safetensors header; return its tensors and `__metadata__`."""
    if isinstance(path, RemotePath):
        size, header_len, raw = _remote_header(path)
    else:
        size, header_len, raw = _local_header(path)
    if len(raw) < header_len:
        raise CkptScanError("file ends inside its header (truncated while being read?)", path=path)
    return _parse_header(path, raw, header_len, size)


def _local_header(path: Path) -> tuple[int, int, bytes]:
    try:
        # O_NONBLOCK: a named pipe posing as a shard must not block open().
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise CkptScanError("not a regular file", path=path)
            size = st.st_size
            prefix = _pread_exactly(fd, 8, 0)
            if len(prefix) < 8:
                raise CkptScanError("not a safetensors file (shorter than its 8-byte header length)", path=path)
            header_len = int.from_bytes(prefix, "little")
            # Both checks come before any allocation: a length of 2**63 costs nothing.
            if header_len > MAX_HEADER_BYTES or 8 + header_len > size:
                raise CkptScanError(
                    f"corrupt safetensors header: declares {header_len} header bytes but the file has {size} bytes",
                    path=path,
                )
            raw = _pread_exactly(fd, header_len, 8)
        finally:
            os.close(fd)
    except OSError as e:
        raise CkptScanError(f"cannot read: {e.strerror or e}", path=path) from None
    return size, header_len, raw


def _remote_header(path: RemotePath) -> tuple[int, int, bytes]:
    """The same checks as locally, on the listed size and at most two ranged GETs."""
    info = path.info()
    if info is None:
        raise CkptScanError("no such object", path=path)
    size = info.size
    if size < 8:
        raise CkptScanError("not a safetensors file (shorter than its 8-byte header length)", path=path)
    first = bytes(path.read_ranges([(0, min(size, 8 + REMOTE_HEADER_GUESS))])[0])
    header_len = int.from_bytes(first[:8], "little")
    if header_len > MAX_HEADER_BYTES or 8 + header_len > size:
        raise CkptScanError(
            f"corrupt safetensors header: declares {header_len} header bytes but the file has {size} bytes",
            path=path,
        )
    raw = first[8:8 + header_len]
    if len(raw) < header_len:
        raw += bytes(path.read_ranges([(len(first), 8 + header_len)])[0])
    return size, header_len, raw


def _parse_header(path: Path | RemotePath, raw: bytes, header_len: int,
                  size: int) -> tuple[dict[str, TensorEntry], dict[str, str]]:
    header = _parse_json(path, raw)
    if not isinstance(header, dict):
        raise CkptScanError("corrupt safetensors header: not a JSON object", path=path)

    data_start = 8 + header_len
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise CkptScanError("corrupt safetensors header: __metadata__ is not an object", path=path)
    entries = {name: _entry(path, name, info, data_start) for name, info in header.items()}
    _check_in_file(path, entries, data_start, size)
    _check_no_overlap(path, entries)
    return entries, {str(k): str(v) for k, v in metadata.items()}


def byte_span(entry: TensorEntry, name: str, rows: tuple[int, int] | None = None) -> tuple[int, int]:
    """The absolute byte range [start, end) of a tensor, or of rows [lo, hi) of it."""
    start, nbytes, _ = _span(entry, name, rows)
    return start, start + nbytes


def _span(entry: TensorEntry, name: str, rows: tuple[int, int] | None) -> tuple[int, int, tuple[int, ...]]:
    shape, start, nbytes = entry.shape, entry.start, entry.end - entry.start
    if rows is not None:
        lo, hi = rows
        if not shape or not 0 <= lo <= hi <= shape[0]:
            raise CkptScanError(f"rows {lo}:{hi} out of range for shape {list(shape)}", path=entry.file, tensor=name)
        row_bytes = math.prod(shape[1:]) * entry.itemsize
        start, nbytes, shape = start + lo * row_bytes, (hi - lo) * row_bytes, (hi - lo, *shape[1:])
    if nbytes > physical_memory():
        # A sparse file can declare a terabyte tensor at no cost; zero-filling
        # the buffer would end in the OOM killer, not an error message.
        raise CkptScanError(f"this tensor needs {nbytes / 2**30:.1f} GiB, more than this machine's memory "
                            f"({physical_memory() / 2**30:.1f} GiB)", path=entry.file, tensor=name)
    return start, nbytes, shape


def read_tensor(entry: TensorEntry, name: str, rows: tuple[int, int] | None = None,
                data: memoryview | None = None) -> torch.Tensor:
    """Read one tensor, or rows [start, stop) of its first dimension. `data`:
    its bytes already fetched (a remote prefetch)."""
    start, nbytes, shape = _span(entry, name, rows)
    if data is None:
        if not isinstance(entry.file, RemotePath):
            return _from_buffer(_read_local(entry.file, start, nbytes, name), entry.dtype, shape)
        data = entry.file.read_ranges([(start, start + nbytes)], name)[0]
    # torch wants a writable buffer; a view of one we assembled is used as is.
    buf = data.obj if isinstance(data.obj, bytearray) and data.nbytes == len(data.obj) else bytearray(data)
    if len(buf) != nbytes:
        raise CkptScanError(f"got {len(buf)} of this tensor's {nbytes} bytes", path=entry.file, tensor=name)
    return _from_buffer(buf, entry.dtype, shape)


def _read_local(file: Path, start: int, nbytes: int, name: str) -> bytearray:
    """Bytes [start, start + nbytes) of local file `file`, read with pread."""
    buf = bytearray(nbytes)
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK)
        try:
            view, done = memoryview(buf), 0
            while done < nbytes:
                got = os.preadv(fd, [view[done:]], start + done)
                if got == 0:
                    # The file shrank after its header was validated: never
                    # hand back a tensor whose tail is zeros.
                    raise CkptScanError("file ends inside this tensor's data (truncated?)",
                                        path=file, tensor=name)
                done += got
        finally:
            os.close(fd)
    except OSError as e:
        raise CkptScanError(f"cannot read: {e.strerror or e}", path=file, tensor=name) from None
    return buf


def _from_buffer(buf: bytearray, dtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    if not buf:
        return torch.empty(shape, dtype=DTYPES[dtype])
    return torch.frombuffer(buf, dtype=DTYPES[dtype]).reshape(shape)


@functools.cache
def physical_memory() -> int:
    """Bytes of RAM, or no limit where the platform does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return sys.maxsize


class _DuplicateKey(ValueError):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refusing repeated keys: json.loads would silently keep
    the last, hiding a tensor that a checker of the other copy would see."""
    found = dict(pairs)  # at C speed: a header has an object per tensor
    if len(found) != len(pairs):  # some key repeats: name the first
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return found


def _parse_json(path: Path | RemotePath, raw: bytes) -> Any:
    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys)
    except _DuplicateKey as e:
        raise CkptScanError(f"corrupt safetensors header: '{e.key}' is defined more than once", path=path) from None
    except (UnicodeDecodeError, ValueError) as e:
        # ValueError covers JSONDecodeError and integer literals past
        # Python's digit limit.
        raise CkptScanError(f"corrupt safetensors header: invalid JSON ({e})", path=path) from None
    except RecursionError:
        raise CkptScanError("corrupt safetensors header: JSON nested too deeply", path=path) from None


def _pread_exactly(fd: int, size: int, offset: int) -> bytes:
    """Up to `size` bytes at `offset`; fewer only where the file ends."""
    chunks, done = [], 0
    while done < size:
        chunk = os.pread(fd, size - done, offset + done)
        if not chunk:
            break
        chunks.append(chunk)
        done += len(chunk)
    return b"".join(chunks)


def _entry(path: Path | RemotePath, name: str, info: object, data_start: int) -> TensorEntry:
    def bad(why: str) -> CkptScanError:
        return CkptScanError(f"corrupt safetensors header: {why}", path=path, tensor=name)

    if not isinstance(info, dict):
        raise bad("entry is not an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise bad(f"unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
        raise bad(f"invalid shape {shape!r}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
    ):
        raise bad(f"invalid data_offsets {offsets!r}")
    begin, end = offsets
    if not 0 <= begin <= end:
        raise bad(f"invalid data_offsets {offsets}")
    expected = math.prod(shape) * DTYPES[dtype].itemsize
    if end - begin != expected:
        raise bad(f"shape {shape} x {dtype} needs {expected} bytes but data_offsets span {end - begin}")
    return TensorEntry(path, dtype, tuple(shape), data_start + begin, data_start + end)


def _check_in_file(path: Path | RemotePath, entries: dict[str, TensorEntry], data_start: int, size: int) -> None:
    """Every tensor's bytes inside the file. Writers pack the tensors back to
    back from the end of the header, so a file that ends inside that packed
    data was cut short (a copy or a save interrupted): it is named truncated,
    with the sizes to check against. A tensor placed past the end of an
    otherwise whole file is a corrupt header entry."""
    extent = max((entry.end for entry in entries.values()), default=data_start)
    if extent <= size:
        return
    spans = sorted((e.start, e.end) for e in entries.values() if e.end > e.start)
    if all(start == end for (_, end), (start, _) in zip([(0, data_start)] + spans, spans)):
        raise CkptScanError(f"truncated: the header declares {extent} bytes, the file has {size} "
                            f"({extent - size} missing)", path=path)
    name, entry = next((n, e) for n, e in entries.items() if e.end > size)
    raise CkptScanError(f"corrupt safetensors header: data_offsets {[entry.start - data_start, entry.end - data_start]}"
                        f" outside the file's {size - data_start} data bytes", path=path, tensor=name)


def _check_no_overlap(path: Path | RemotePath, entries: dict[str, TensorEntry]) -> None:
    spans = sorted((e.start, e.end, n) for n, e in entries.items() if e.end > e.start)
    for (_, prev_end, prev), (start, _, name) in zip(spans, spans[1:]):
        if start < prev_end:
            raise CkptScanError(f"corrupt safetensors header: data overlaps tensor '{prev}'", path=path, tensor=name)


class SafetensorsSource:
    """One or more safetensors files (a sharded checkpoint) as one tensor map."""

    def __init__(self, files: list[Path | RemotePath], weight_map: dict[str, str] | None = None,
                 index_path: Path | RemotePath | None = None):
        self.files = files
        self.metadata: dict[str, str] = {}
        # Remote shards: (fetch, position) of each read `prefetch` started, taken by the `get` that asked for it.
        self._prefetched: dict[tuple[str, tuple[int, int] | None], tuple[Fetch, int]] = {}
        self._lock = threading.Lock()
        self._entries: dict[str, TensorEntry] = {}
        for entries, metadata in _read_headers(files):
            self._entries.update(entries)
            self.metadata.update(metadata)
        if weight_map is not None:
            for name, shard in weight_map.items():
                entry = self._entries.get(name)
                if entry is None or entry.file.name != Path(shard).name:
                    raise CkptScanError(f"the index names this tensor in '{shard}' but that shard lacks it",
                                        path=index_path, tensor=name)

    def keys(self) -> list[str]:
        return list(self._entries)

    def entry(self, name: str) -> TensorEntry:
        try:
            return self._entries[name]
        except KeyError:
            raise CkptScanError("no such tensor in this checkpoint", path=self.files[0].parent, tensor=name) from None

    def shape(self, name: str) -> tuple[int, ...]:
        return self.entry(name).shape

    def dtype(self, name: str) -> str:
        return self.entry(name).dtype

    def get(self, name: str, rows: tuple[int, int] | None = None) -> torch.Tensor:
        with self._lock:
            pending = self._prefetched.pop((name, rows), None)
        # Waits for a prefetch still in flight; its error (URL, tensor) is raised here.
        data = None if pending is None else pending[0].result()[pending[1]]
        return read_tensor(self.entry(name), name, rows, data)

    def prefetch(self, wanted: list[tuple[str, tuple[int, int] | None]]) -> Callable[[], None]:
        """Remote shards: start fetching the byte ranges of these (tensor, rows)
        reads, one concurrent batch per shard, adjacent ranges coalesced, for
        the `get` calls that follow (which wait for them). Does not wait; a
        read already prefetched and not yet taken is not fetched again. Local
        files are read by `get` itself. Returns a function that abandons what
        no `get` has taken yet (cancelling the requests not yet sent)."""
        by_file: dict[RemotePath, list[tuple[tuple[str, tuple[int, int] | None], tuple[int, int]]]] = {}
        with self._lock:
            for name, rows in dict.fromkeys(wanted):
                entry = self.entry(name)
                if isinstance(entry.file, RemotePath) and (name, rows) not in self._prefetched:
                    by_file.setdefault(entry.file, []).append(((name, rows), byte_span(entry, name, rows)))
            started = []
            for file, reads in by_file.items():
                fetch = file.fetch_ranges([span for _, span in reads], [name for (name, _), _ in reads])
                started.append((fetch, [key for key, _ in reads]))
                self._prefetched.update((key, (fetch, k)) for k, (key, _) in enumerate(reads))

        return abandoner(self._lock, self._prefetched, started)


def _read_headers(files: list[Path | RemotePath]) -> list[tuple[dict[str, TensorEntry], dict[str, str]]]:
    """Each file's header; a sharded checkpoint's remote shards all at once
    (each header is a GET, tens of ms to first byte), local ones in turn."""
    if len(files) < 2 or not isinstance(files[0], RemotePath):
        return [read_header(file) for file in files]
    with ThreadPoolExecutor(min(len(files), 16), thread_name_prefix="ckptscan-header") as pool:
        return list(pool.map(read_header, files))


# A shard of a sharded safetensors checkpoint: model-00001-of-00004.safetensors.
SHARD_NAME = re.compile(r"^(.*)-(\d+)-of-(\d+)\.safetensors$")


def _index_file(path: Path | RemotePath) -> Path | RemotePath | None:
    return path if path.name.endswith(".safetensors.index.json") else None


def _index_in(folder: Path | RemotePath) -> Path | RemotePath | None:
    return min(folder.glob("*.safetensors.index.json"), default=None)


def _open_indexed(index_path: Path | RemotePath) -> Checkpoint:
    """A sharded checkpoint through its index: every shard it names must be there."""
    shards = sidecars.weight_map(index_path)
    files = []
    for shard in sorted(set(shards.values())):
        file = index_path.parent / shard
        if not file.is_file():
            raise CkptScanError(f"the index names shard '{shard}', which does not exist (incomplete checkpoint?)",
                                path=index_path)
        files.append(file)
    folder = index_path.parent
    return Checkpoint(index_path, "safetensors-sharded", step_from_name(folder.name),
                      SafetensorsSource(files, shards, index_path), sidecars.read_config(folder / "config.json"),
                      [index_path, *files])


def _single_file(path: Path | RemotePath) -> Path | RemotePath | None:
    return path if path.name.endswith(".safetensors") else None


def _open_file(path: Path | RemotePath) -> Checkpoint:
    folder = path.parent
    return Checkpoint(path, "safetensors", step_from_name(folder.name), SafetensorsSource([path]),
                      sidecars.read_config(folder / "config.json"), [path])


def _shards_in(folder: Path | RemotePath) -> Path | RemotePath | None:
    return folder if any(folder.glob("*.safetensors")) else None


def _open_shards(folder: Path | RemotePath) -> Checkpoint:
    """A folder of safetensors files without an index, as one checkpoint."""
    files: list[Path | RemotePath] = sorted(folder.glob("*.safetensors"))
    _require_every_shard(folder, files)
    return Checkpoint(folder, "safetensors", step_from_name(folder.name), SafetensorsSource(files),
                      sidecars.read_config(folder / "config.json"), files)


def _require_every_shard(folder: Path | RemotePath, files: list[Path | RemotePath]) -> None:
    """Shards `name-0000i-of-0000n.safetensors` found without their index:
    all n must be there, else this is a save in progress (the index is
    written last), not a checkpoint with fewer tensors."""
    present = {f.name for f in files}
    for file in files:
        match = SHARD_NAME.match(file.name)
        if match:
            prefix, index, total = match.groups()
            missing = [n for i in range(1, int(total) + 1)
                       if (n := f"{prefix}-{i:0{len(index)}d}-of-{total}.safetensors") not in present]
            if missing:
                raise CkptScanError(f"shard '{missing[0]}' and the index are missing (checkpoint still being "
                                    "written, or incomplete)", path=folder)


INDEXED = Format("safetensors-index", _open_indexed, in_file=_index_file, in_folder=_index_in)
FILE = Format("safetensors-file", _open_file, in_file=_single_file)
SHARDS = Format("safetensors-shards", _open_shards, in_folder=_shards_in)
