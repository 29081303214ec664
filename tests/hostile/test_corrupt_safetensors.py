"""Corrupt safetensors files: every defect is a CkptScanError naming the file
(and the tensor, where there is one), exit code 2 with one line on stderr,
never a traceback, a giant allocation, a hang or garbage data."""

from __future__ import annotations

import copy
import json
import os
import struct
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
import torch
from hostile.helpers import (
    assert_one_line_error,
    deadline,
    run_cli,
    safetensors_bytes,
    two_tensor_header,
    write_pair,
    write_safetensors,
)
from factories import llama_config, llama_tensors, write_hf_checkpoint
from safetensors.torch import save_file

import ckptscan.cli

from ckptscan.errors import CkptScanError
from ckptscan.readers import open_checkpoint
from ckptscan.readers.safetensors import DTYPES, read_header, read_tensor


def _with(edit) -> tuple[dict, bytes]:
    header, data = two_tensor_header()
    header = copy.deepcopy(header)
    edit(header)
    return header, data


def _set(name: str, key: str, value):
    def edit(header: dict) -> None:
        header[name][key] = value
    return edit


def _replace(name: str, value):
    def edit(header: dict) -> None:
        header[name] = value
    return edit


def _drop(name: str, key: str):
    def edit(header: dict) -> None:
        del header[name][key]
    return edit


# (case id, header edit, the tensor the error must name)
ENTRY_DEFECTS = [
    ("unknown-dtype", _set("w2", "dtype", "F128"), "w2"),
    ("lowercase-dtype", _set("w2", "dtype", "f32"), "w2"),
    ("missing-dtype", _drop("w2", "dtype"), "w2"),
    ("dtype-not-string", _set("w2", "dtype", 4), "w2"),
    ("dtype-list", _set("w2", "dtype", ["F32"]), "w2"),
    ("dtype-object", _set("w2", "dtype", {"F32": 1}), "w2"),
    ("negative-dim", _set("w1", "shape", [-2, -3]), "w1"),
    ("float-dim", _set("w1", "shape", [2.0, 3]), "w1"),
    ("bool-dim", _set("w2", "shape", [True, 4]), "w2"),
    ("string-shape", _set("w2", "shape", "4"), "w2"),
    ("nested-shape", _set("w2", "shape", [[4]]), "w2"),
    ("missing-shape", _drop("w2", "shape"), "w2"),
    ("missing-offsets", _drop("w2", "data_offsets"), "w2"),
    ("three-offsets", _set("w2", "data_offsets", [24, 40, 56]), "w2"),
    ("float-offsets", _set("w2", "data_offsets", [24.0, 40.0]), "w2"),
    ("negative-offset", _set("w2", "data_offsets", [-16, 0]), "w2"),
    ("reversed-offsets", _set("w2", "data_offsets", [40, 24]), "w2"),
    ("offset-past-end", _set("w2", "data_offsets", [24, 56]), "w2"),
    ("offset-huge", _set("w2", "data_offsets", [24, 2**70]), "w2"),
    ("overlap", _set("w2", "data_offsets", [16, 32]), "w2"),
    ("shape-dtype-mismatch", _set("w1", "shape", [2, 2]), "w1"),
    ("dtype-size-mismatch", _set("w1", "dtype", "F64"), "w1"),
    ("huge-shape", _set("w1", "shape", [2**62, 2**62]), "w1"),
    ("entry-not-object", _replace("w2", [1, 2]), "w2"),
    ("entry-string", _replace("w2", "F32"), "w2"),
]


@pytest.mark.parametrize("edit,tensor", [c[1:] for c in ENTRY_DEFECTS], ids=[c[0] for c in ENTRY_DEFECTS])
def test_bad_entry_names_file_and_tensor(tmp_path: Path, edit, tensor: str) -> None:
    path = write_safetensors(tmp_path / "model.safetensors", *_with(edit))
    with pytest.raises(CkptScanError) as e:
        read_header(path)
    assert e.value.path == str(path)
    assert e.value.tensor == tensor
    assert str(path) in str(e.value) and f"'{tensor}'" in str(e.value)


FILE_DEFECTS = {
    "empty": b"",
    "five-bytes": b"\x05\x00\x00\x00\x00",
    "length-past-end": safetensors_bytes({"w": {}}, header_len=1000),
    "length-bomb-2^63": safetensors_bytes(b"{}", header_len=2**63),
    "length-bomb-2^64-1": safetensors_bytes(b"{}", header_len=2**64 - 1),
    "zero-length-header": safetensors_bytes(b""),
    "invalid-json": safetensors_bytes(b'{"w1": {"dtype": "F32",'),
    "non-utf8": safetensors_bytes(b'{"w\xff\xfe": 1}'),
    "list-header": safetensors_bytes([]),
    "string-header": safetensors_bytes("model"),
    "null-header": safetensors_bytes(None),
    "number-header": safetensors_bytes(7),
    "metadata-not-object": safetensors_bytes({"__metadata__": ["format", "pt"]}),
    "nan-literal": safetensors_bytes(b'{"w": {"dtype": "F32", "shape": [NaN], "data_offsets": [0, 4]}}', b"\0" * 4),
    "deep-nesting": safetensors_bytes(b"[" * 100_000 + b"]" * 100_000),
    "huge-int-literal": safetensors_bytes(b'{"w": {"dtype": "F32", "shape": [' + b"9" * 50_000 + b'], '
                                          b'"data_offsets": [0, 4]}}', b"\0" * 4),
    "duplicate-tensor": safetensors_bytes(
        b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},'
        b' "w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}', b"\0" * 8),
}


@pytest.mark.parametrize("content", FILE_DEFECTS.values(), ids=FILE_DEFECTS.keys())
def test_bad_file_names_the_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(content)
    with pytest.raises(CkptScanError) as e:
        read_header(path)
    assert e.value.path == str(path)
    assert str(path) in str(e.value)


def test_duplicate_tensor_names_the_tensor(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(FILE_DEFECTS["duplicate-tensor"])
    with pytest.raises(CkptScanError, match="more than once") as e:
        read_header(path)
    assert "'w'" in str(e.value)


@pytest.mark.parametrize("length", [2**63, 2**64 - 1, 99 * 2**20])
def test_header_length_bomb_allocates_nothing(tmp_path: Path, length: int) -> None:
    # The last length is under the header cap but past the end of the file.
    path = tmp_path / "model.safetensors"
    path.write_bytes(safetensors_bytes(b"{}", header_len=length))
    assert _peak_bytes_while_refused(path) < 2**20


def test_header_past_the_cap_is_refused_before_reading(tmp_path: Path) -> None:
    # A sparse file large enough to hold a 200 MB header: refused by size
    # alone, without reading 200 MB.
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", 200 * 2**20) + b"{")
    os.truncate(path, 8 + 200 * 2**20)
    assert _peak_bytes_while_refused(path) < 2**20


def _peak_bytes_while_refused(path: Path) -> int:
    """Peak Python allocation while `read_header` refuses the file's header."""
    tracemalloc.start()
    try:
        with pytest.raises(CkptScanError, match="header"):
            read_header(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak


def test_truncated_data_is_named_as_truncation_with_both_sizes(tmp_path: Path) -> None:
    header, data = two_tensor_header()
    path = write_safetensors(tmp_path / "model.safetensors", header, data)
    size = path.stat().st_size
    os.truncate(path, size - 3)
    with pytest.raises(CkptScanError) as e:
        read_header(path)
    assert str(e.value) == f"{path}: truncated: the header declares {size} bytes, the file has {size - 3} (3 missing)"


def test_truncated_after_the_header_validated_is_an_error_not_garbage(tmp_path: Path) -> None:
    header, data = two_tensor_header()
    path = write_safetensors(tmp_path / "model.safetensors", header, data)
    entries, _ = read_header(path)
    assert read_tensor(entries["w2"], "w2").tolist() == [6.0, 7.0, 8.0, 9.0]
    os.truncate(path, path.stat().st_size - 6)  # inside w2's data
    with pytest.raises(CkptScanError, match="truncated") as e:
        read_tensor(entries["w2"], "w2")
    assert e.value.tensor == "w2" and e.value.path == str(path)
    with pytest.raises(CkptScanError, match="truncated"):
        read_tensor(entries["w2"], "w2", rows=(2, 4))
    assert read_tensor(entries["w1"], "w1").tolist() == [[0, 1, 2], [3, 4, 5]]


def test_file_removed_after_the_header_validated(tmp_path: Path) -> None:
    header, data = two_tensor_header()
    path = write_safetensors(tmp_path / "model.safetensors", header, data)
    entries, _ = read_header(path)
    path.unlink()
    with pytest.raises(CkptScanError, match="cannot read") as e:
        read_tensor(entries["w1"], "w1")
    assert e.value.tensor == "w1"


@pytest.mark.parametrize("rows", [(0, 3), (2, 1), (-1, 1)])
def test_rows_out_of_range(tmp_path: Path, rows: tuple[int, int]) -> None:
    header, data = two_tensor_header()
    path = write_safetensors(tmp_path / "model.safetensors", header, data)
    entries, _ = read_header(path)
    with pytest.raises(CkptScanError, match="out of range"):
        read_tensor(entries["w1"], "w1", rows=rows)


def test_valid_quirks_are_accepted(tmp_path: Path) -> None:
    """Controls: what the format allows must still read, exactly."""
    header, data = two_tensor_header()
    header["empty"] = {"dtype": "BF16", "shape": [0, 5], "data_offsets": [40, 40]}
    raw = json.dumps(header).encode() + b"    "  # spec: trailing-space padding
    path = write_safetensors(tmp_path / "model.safetensors", raw, data)
    entries, metadata = read_header(path)
    assert metadata == {"format": "pt"}
    assert read_tensor(entries["w1"], "w1", rows=(1, 2)).tolist() == [[3, 4, 5]]
    assert read_tensor(entries["empty"], "empty").shape == (0, 5)


def test_every_dtype_reads_back_what_safetensors_wrote(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(0)
    tensors = {}
    for name, dtype in DTYPES.items():
        values = torch.randn(3, 5, generator=gen, dtype=torch.float64) * 4
        tensors[name] = values.to(dtype) if dtype.is_floating_point or dtype == torch.bool else values.abs().to(dtype)
    path = tmp_path / "all.safetensors"
    save_file(tensors, path)
    entries, _ = read_header(path)
    for name, expected in tensors.items():
        assert entries[name].dtype == name
        got = read_tensor(entries[name], name)
        assert got.dtype == expected.dtype
        assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8)), name


def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    """A named pipe posing as a shard would block open() forever."""
    fifo = tmp_path / "ckpt" / "model.safetensors"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    with deadline(10), pytest.raises(CkptScanError, match="not a regular file"):
        open_checkpoint(fifo.parent)


def test_directory_posing_as_a_shard(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a, b = write_pair(tmp_path)
    (b / "model.safetensors").unlink()
    (b / "model.safetensors").mkdir()
    assert_one_line_error(run_cli(capsys, "diff", a, b), str(b / "model.safetensors"))


def _corrupt_shard(path: Path, how: str) -> str | None:
    """Corrupt one checkpoint's model.safetensors; return the tensor to name."""
    content = path.read_bytes()
    header_len = int.from_bytes(content[:8], "little")
    header = json.loads(content[8:8 + header_len])
    data = content[8 + header_len:]
    victim = "model.layers.1.self_attn.q_proj.weight"
    if how == "truncated":  # named as truncation with both sizes, not as a tensor's fault
        path.write_bytes(content[: len(content) - 100])
        return None
    if how == "bomb":
        path.write_bytes(struct.pack("<Q", 2**63) + content[8:])
        return None
    if how == "invalid-json":
        path.write_bytes(content[:8] + b"!" + content[9:])
        return None
    if how == "unknown-dtype":
        header[victim]["dtype"] = "Q4_K"
    elif how == "overlap":
        other = "model.layers.1.self_attn.o_proj.weight"  # same shape as q_proj
        header[victim]["data_offsets"] = header[other]["data_offsets"]
    elif how == "out-of-range":
        begin, end = header[victim]["data_offsets"]
        header[victim]["data_offsets"] = [begin + len(data), end + len(data)]
    elif how == "shape-mismatch":
        header[victim]["shape"] = [header[victim]["shape"][0] + 1, header[victim]["shape"][1]]
    write_safetensors(path, header, data)
    return victim


CLI_DEFECTS = ["truncated", "bomb", "invalid-json", "unknown-dtype", "overlap", "out-of-range", "shape-mismatch"]


@pytest.mark.parametrize("how", CLI_DEFECTS)
def test_cli_reports_corrupt_shard_on_one_line(tmp_path: Path, capsys: pytest.CaptureFixture, how: str) -> None:
    a, b = write_pair(tmp_path)
    tensor = _corrupt_shard(b / "model.safetensors", how)
    result = run_cli(capsys, "diff", a, b)
    assert_one_line_error(result, str(b / "model.safetensors"))
    if tensor is not None:
        assert f"'{tensor}'" in result.stderr


@pytest.mark.skipif(not hasattr(ckptscan.cli, "inspect"), reason="ckptscan inspect is not there yet")
@pytest.mark.parametrize("how", ["truncated", "bomb", "overlap"])
def test_inspect_reports_corrupt_shard_on_one_line(tmp_path: Path, capsys: pytest.CaptureFixture, how: str) -> None:
    _, b = write_pair(tmp_path)
    _corrupt_shard(b / "model.safetensors", how)
    assert_one_line_error(run_cli(capsys, "inspect", b), str(b / "model.safetensors"))


def test_cli_in_a_real_process_exits_2_without_traceback(tmp_path: Path) -> None:
    """The installed entry point, not the in-process shortcut: no traceback,
    no signal death (segfault would be a negative return code)."""
    a, b = write_pair(tmp_path)
    _corrupt_shard(b / "model.safetensors", "overlap")
    proc = subprocess.run([sys.executable, "-m", "ckptscan", "diff", str(a), str(b)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "overlaps" in proc.stderr


def test_tensor_names_cannot_inject_markup_or_lines(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Names come from the file: rich markup, newlines and escape codes in
    them are printed literally, on one line."""
    a, b = write_pair(tmp_path)
    path = b / "model.safetensors"
    content = path.read_bytes()
    header_len = int.from_bytes(content[:8], "little")
    header = json.loads(content[8:8 + header_len])
    evil = "[/bold]\n\x1b[2Jevil[red]"
    header[evil] = {"dtype": "F32", "shape": [1], "data_offsets": [0, 999]}
    write_safetensors(path, header, content[8 + header_len:])
    result = run_cli(capsys, "diff", a, b)
    assert_one_line_error(result, "[/bold]", "evil[red]")
    assert "\x1b" not in result.stderr


@pytest.mark.skipif(not hasattr(ckptscan.cli, "trend"), reason="ckptscan trend is not there yet")
def test_trend_prints_names_from_files_literally(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A run whose directory name looks like markup, with a corrupt
    checkpoint whose reason quotes a hostile tensor name: printed as is."""
    run = tmp_path / "[red]run"
    config = llama_config(layers=2)
    for i, step in enumerate((100, 200, 300)):
        write_hf_checkpoint(run / f"checkpoint-{step}", llama_tensors(config, seed=i + 1), config)
    write_safetensors(run / "checkpoint-200" / "model.safetensors", {"[/evil]": 1})
    result = run_cli(capsys, "trend", run, "--no-cache")
    assert result.code in (0, 1), result.stderr
    assert "[/evil]" in result.stdout + result.stderr
    assert "[red]run" in result.stdout + result.stderr


SIDE_JSON_DEFECTS = {
    "deep-nesting": b"[" * 100_000 + b"]" * 100_000,
    "huge-int-literal": b'{"num_attention_heads": ' + b"9" * 50_000 + b"}",
    "non-utf8": b'{"model_type": "\xff"}',
    "truncated": b'{"weight_map": {"a": ',
    "not-an-object": b"[1, 2]",
}


@pytest.mark.parametrize("content", SIDE_JSON_DEFECTS.values(), ids=SIDE_JSON_DEFECTS.keys())
@pytest.mark.parametrize("name", ["config.json", "model.safetensors.index.json"])
def test_corrupt_config_and_index(tmp_path: Path, capsys: pytest.CaptureFixture, name: str, content: bytes) -> None:
    a, b = write_pair(tmp_path, shards=2)
    (b / name).write_bytes(content)
    assert_one_line_error(run_cli(capsys, "diff", a, b), str(b / name))


def test_open_checkpoint_on_corrupt_single_file(tmp_path: Path) -> None:
    path = tmp_path / "weights.safetensors"
    path.write_bytes(FILE_DEFECTS["length-bomb-2^63"])
    with pytest.raises(CkptScanError) as e:
        open_checkpoint(path)
    assert e.value.path == str(path)


def test_tensor_larger_than_memory_is_refused_before_allocating(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A sparse file declaring a huge tensor costs its writer nothing. The
    machine's memory is patched down to 1 MiB so the test itself never risks
    a real giant allocation."""
    import ckptscan.readers.safetensors as reader
    monkeypatch.setattr(reader, "physical_memory", lambda: 2**20)
    count = 2**19  # F32: 2 MiB
    path = write_safetensors(tmp_path / "model.safetensors",
                             {"big": {"dtype": "F32", "shape": [count], "data_offsets": [0, 4 * count]}})
    os.truncate(path, path.stat().st_size + 4 * count)  # sparse: no data written
    entries, _ = read_header(path)
    tracemalloc.start()
    try:
        with pytest.raises(CkptScanError, match="more than this machine's memory") as e:
            read_tensor(entries["big"], "big")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert e.value.tensor == "big" and peak < 2**20
    assert read_tensor(entries["big"], "big", rows=(0, 1024)).shape == (1024,)  # a block of rows still fits
