"""config.json, shard indexes and DCP `.metadata` are refused, with one line
naming the file, when larger or more deeply nested than any real one: before
they are read into memory, and before anything walks them."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
from factories import llama_config, llama_tensors, write_hf_checkpoint
from hostile.helpers import assert_one_line_error, run_cli, write_pair
from readers.test_dcp import torchtitan_model, write_torchtitan

from ckptscan.errors import CkptScanError
from ckptscan.readers import open_checkpoint
from ckptscan.readers.bounded import (MAX_CONFIG_BYTES, MAX_DCP_METADATA_BYTES, MAX_DEPTH, MAX_INDEX_BYTES,
                                      check_depth, read_limited)
from ckptscan.readers.dcp import _MetadataUnpickler


def nested(depth: int) -> str:
    """Valid JSON: a dict inside a dict ... `depth` levels."""
    return '{"a": ' * depth + "1" + "}" * depth


def grow_sparse(path: Path, size: int) -> None:
    """Make `path` `size` bytes long without writing them (a hole costs no disk)."""
    with open(path, "r+b") as f:
        f.truncate(size)


def hf_checkpoint(root: Path, shards: int = 1) -> Path:
    config = llama_config(layers=2, experts=None)
    return write_hf_checkpoint(root / "checkpoint-100", llama_tensors(config, seed=1), config, shards=shards)


def test_config_larger_than_the_limit(tmp_path: Path) -> None:
    ckpt = hf_checkpoint(tmp_path)
    grow_sparse(ckpt / "config.json", MAX_CONFIG_BYTES + 1)
    with pytest.raises(CkptScanError, match=r"config\.json: config is larger than 16 MiB"):
        open_checkpoint(ckpt)


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 100_000])  # our limit; past json's own recursion limit
def test_config_nested_too_deep(tmp_path: Path, depth: int) -> None:
    ckpt = hf_checkpoint(tmp_path)
    (ckpt / "config.json").write_text(nested(depth))
    with pytest.raises(CkptScanError, match=r"config\.json: .*(nests more than 64 levels|nested too deeply)"):
        open_checkpoint(ckpt)


def test_config_at_the_depth_limit_is_read(tmp_path: Path) -> None:
    ckpt = hf_checkpoint(tmp_path)
    config = json.loads((ckpt / "config.json").read_text())
    config["deep"] = json.loads(nested(MAX_DEPTH - 1))  # MAX_DEPTH levels with the config itself
    (ckpt / "config.json").write_text(json.dumps(config))
    assert open_checkpoint(ckpt).config["deep"]["a"]["a"]["a"] is not None


def test_shard_index_larger_than_the_limit(tmp_path: Path) -> None:
    ckpt = hf_checkpoint(tmp_path, shards=2)
    (index,) = ckpt.glob("*.safetensors.index.json")
    grow_sparse(index, MAX_INDEX_BYTES + 1)
    with pytest.raises(CkptScanError, match=r"index\.json: shard index is larger than 100 MiB"):
        open_checkpoint(ckpt)


def test_shard_index_nested_too_deep(tmp_path: Path) -> None:
    ckpt = hf_checkpoint(tmp_path, shards=2)
    (index,) = ckpt.glob("*.safetensors.index.json")
    data = json.loads(index.read_text())
    data["metadata"] = json.loads(nested(MAX_DEPTH))
    index.write_text(json.dumps(data))
    with pytest.raises(CkptScanError, match=r"index\.json: shard index nests more than 64 levels"):
        open_checkpoint(ckpt)


def test_dcp_metadata_larger_than_the_limit(tmp_path: Path) -> None:
    step = write_torchtitan(tmp_path / "step-1", torchtitan_model(1))
    grow_sparse(step / ".metadata", MAX_DCP_METADATA_BYTES + 1)
    with pytest.raises(CkptScanError, match=r"\.metadata: DCP metadata is larger than 1024 MiB"):
        open_checkpoint(step)


def test_dcp_metadata_nested_too_deep(tmp_path: Path) -> None:
    step = write_torchtitan(tmp_path / "step-1", torchtitan_model(1))
    path = step / ".metadata"
    with open(path, "rb") as f:
        metadata = _MetadataUnpickler(f).load()
    deep: list = []
    for _ in range(MAX_DEPTH):
        deep = [deep]
    metadata.planner_data = {"extra": deep}
    path.write_bytes(pickle.dumps(metadata))
    with pytest.raises(CkptScanError, match=r"\.metadata: DCP metadata nests more than 64 levels"):
        open_checkpoint(step)


def test_read_limited_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)  # no writer: a blocking open would hang
    with pytest.raises(CkptScanError, match="not a regular file"):
        read_limited(fifo, 100, "config")
    with pytest.raises(CkptScanError, match="not a regular file"):
        read_limited(Path("/dev/zero"), 100, "config")


def test_read_limited_at_and_past_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    assert read_limited(path, 100, "file") == b"x" * 100
    with pytest.raises(CkptScanError, match="larger than"):
        read_limited(path, 99, "file")


def test_check_depth_survives_cycles_and_sharing() -> None:
    shared = {"k": [1, 2]}
    check_depth({"a": shared, "b": shared}, Path("x"), "thing")
    loop: list = []
    loop.append(loop)  # a cycle is visited once, not forever
    check_depth(loop, Path("x"), "thing")


def test_the_cli_says_it_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a, b = write_pair(tmp_path)
    grow_sparse(b / "config.json", MAX_CONFIG_BYTES + 1)
    assert_one_line_error(run_cli(capsys, "diff", a, b), str(b / "config.json"), "larger than 16 MiB")
