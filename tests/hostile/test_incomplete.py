"""Incomplete checkpoints (a job still writing, a shard lost): `diff` fails
with one clear line; a run's analysis skips them with a warning and goes on."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from factories import llama_config, llama_tensors, write_hf_checkpoint
from hostile.helpers import assert_one_line_error, run_cli, write_pair

import ckptscan.cli
from ckptscan.pipeline.discovery import discover_run
from ckptscan.errors import CkptScanError

TREND = hasattr(ckptscan.cli, "trend")


def _sharded_pair(root: Path) -> tuple[Path, Path]:
    return write_pair(root, shards=2)


def _missing_shard(ckpt: Path) -> str:
    shard = sorted(ckpt.glob("model-*.safetensors"))[-1]
    shard.unlink()
    return shard.name


def _shard_missing_tensor(ckpt: Path) -> str:
    """Rewrite the index so it names a tensor in a shard that lacks it."""
    index_path = ckpt / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    name = "model.layers.1.self_attn.k_proj.weight"
    shards = sorted(set(index["weight_map"].values()))
    index["weight_map"][name] = next(s for s in shards if s != index["weight_map"][name])
    index_path.write_text(json.dumps(index))
    return name


def _index_names_absent_tensor(ckpt: Path) -> str:
    index_path = ckpt / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    name = "model.layers.7.self_attn.q_proj.weight"
    index["weight_map"][name] = sorted(set(index["weight_map"].values()))[0]
    index_path.write_text(json.dumps(index))
    return name


def _being_written(ckpt: Path) -> None:
    """What a save in progress looks like: the weights still under a temp name."""
    for file in ckpt.iterdir():
        if file.suffix == ".safetensors" or file.name.endswith(".index.json"):
            file.rename(file.with_name(file.name + ".tmp"))


def _index_not_yet_written(ckpt: Path) -> None:
    """Shards written, index not yet (HF save_pretrained writes it last),
    and the second shard not yet either."""
    (ckpt / "model.safetensors.index.json").unlink()
    _missing_shard(ckpt)


def _empty_shard(ckpt: Path) -> None:
    (ckpt / "model.safetensors").write_bytes(b"")


def test_index_naming_a_missing_shard(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a, b = _sharded_pair(tmp_path)
    shard = _missing_shard(b)
    assert_one_line_error(run_cli(capsys, "diff", a, b), str(b / "model.safetensors.index.json"), shard)


def test_shard_missing_a_tensor_the_index_names(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a, b = _sharded_pair(tmp_path)
    tensor = _shard_missing_tensor(b)
    assert_one_line_error(run_cli(capsys, "diff", a, b), str(b), f"'{tensor}'")


def test_index_naming_a_tensor_no_shard_has(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a, b = _sharded_pair(tmp_path)
    tensor = _index_names_absent_tensor(b)
    assert_one_line_error(run_cli(capsys, "diff", a, b), str(b), f"'{tensor}'")


@pytest.mark.parametrize("where", ["../checkpoint-100/{}", "{root}/checkpoint-100/{}", "/dev/null"])
def test_index_naming_a_shard_outside_its_directory(tmp_path: Path, capsys: pytest.CaptureFixture, where: str) -> None:
    """checkpoint-200's index pointing at checkpoint-100's shards would
    silently compare a checkpoint with itself."""
    a, b = _sharded_pair(tmp_path)
    index_path = b / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"] = {k: where.format(v, root=tmp_path) for k, v in index["weight_map"].items()}
    index_path.write_text(json.dumps(index))
    assert_one_line_error(run_cli(capsys, "diff", a, b), str(index_path), "not a file in the index's directory")


def test_checkpoint_still_being_written(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a, b = write_pair(tmp_path)
    _being_written(b)
    assert_one_line_error(run_cli(capsys, "diff", a, b), str(b))


def test_shards_without_their_index(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Shard 1 of 2 alone must not pass for a whole checkpoint."""
    a, b = _sharded_pair(tmp_path)
    _index_not_yet_written(b)
    assert_one_line_error(run_cli(capsys, "diff", a, b), str(b))


def test_zero_byte_shard(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a, b = write_pair(tmp_path)
    _empty_shard(b)
    assert_one_line_error(run_cli(capsys, "diff", a, b), str(b / "model.safetensors"))


def test_empty_checkpoint_directory(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a, b = write_pair(tmp_path)
    shutil.rmtree(b)
    b.mkdir()
    assert_one_line_error(run_cli(capsys, "diff", a, b), str(b))


BREAKAGES = {
    "missing-shard": _missing_shard,
    "shard-missing-tensor": _shard_missing_tensor,
    "being-written": _being_written,
    "index-not-yet-written": _index_not_yet_written,
}


def _run_with_broken(root: Path, broken_step: int, breakage) -> Path:
    """checkpoint-{100..400}; the one at `broken_step` is broken. Also a
    `tmp-checkpoint-500` and a `latest` pointer, which are not checkpoints."""
    config = llama_config(layers=2, experts=4)
    for i, step in enumerate((100, 200, 300, 400)):
        write_hf_checkpoint(root / f"checkpoint-{step}", llama_tensors(config, seed=i + 1), config, shards=2)
    breakage(root / f"checkpoint-{broken_step}")
    write_hf_checkpoint(root / "tmp-checkpoint-500", llama_tensors(config, seed=9), config)
    (root / "latest").write_text("checkpoint-400")
    return root


@pytest.mark.parametrize("breakage", BREAKAGES.values(), ids=BREAKAGES.keys())
def test_discovery_skips_the_incomplete_checkpoint(tmp_path: Path, breakage) -> None:
    run = discover_run(_run_with_broken(tmp_path, 200, breakage))
    assert [c.step for c in run.checkpoints] == [100, 300, 400]
    skipped = {Path(s["path"]).name: s["reason"] for s in run.skipped}
    assert "checkpoint-200" in skipped and skipped["checkpoint-200"]
    assert set(skipped) <= {"checkpoint-200", "tmp-checkpoint-500"}


@pytest.mark.skipif(not TREND, reason="ckptscan trend is not there yet")
def test_trend_warns_skips_and_analyses_the_rest(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = _run_with_broken(tmp_path, 200, _missing_shard)
    report_path = tmp_path / "report.json"
    result = run_cli(capsys, "trend", run, "--json", report_path, "--no-cache")
    assert result.code in (0, 1), result.stderr
    warning = [line for line in (result.stdout + result.stderr).splitlines() if "checkpoint-200" in line]
    assert warning and "skipped" in warning[0] and "Traceback" not in result.stderr
    report = json.loads(report_path.read_text())
    assert [c["step"] for c in report["checkpoints"]] == [100, 300, 400]
    assert [(p["from_step"], p["to_step"]) for p in report["pairs"]] == [(100, 300), (300, 400)]
    assert "checkpoint-200" in [Path(s["path"]).name for s in report["skipped"]]


def test_run_where_nothing_can_be_opened(tmp_path: Path) -> None:
    run = _run_with_broken(tmp_path, 100, _being_written)
    for step in (200, 300, 400):
        _being_written(run / f"checkpoint-{step}")
    with pytest.raises(CkptScanError, match="no checkpoint could be opened"):
        discover_run(run)
