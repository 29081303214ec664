"""ckptscan never writes to checkpoints, and what it does write (reports,
cache entries) is written atomically: never half a file.

Tests run as root in CI, where `chmod a-w` stops nothing; the real check is
the before/after snapshot (listing, modes, sizes, mtimes, SHA-256 of every
file and directory) of the checkpoint tree.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
import torch
from factories import llama_config, llama_tensors, write_hf_checkpoint
from hostile.helpers import assert_one_line_error, run_cli, tree_snapshot, write_pair

import ckptscan.cli
import ckptscan.system.atomic as atomic_module
from ckptscan.system.atomic import write_atomic

TREND = hasattr(ckptscan.cli, "trend")


def _torch_bin_pair(root: Path) -> tuple[Path, Path]:
    """HF checkpoints saved as pytorch_model.bin (torch pickles, memory-mapped on read)."""
    config = llama_config(layers=2, experts=4)
    paths = []
    for i, step in enumerate((100, 200)):
        ckpt = root / f"checkpoint-{step}"
        ckpt.mkdir(parents=True)
        (ckpt / "config.json").write_text(json.dumps(config))
        tensors = {k: v.float() for k, v in llama_tensors(config, seed=i + 1).items()}
        torch.save(tensors, ckpt / "pytorch_model.bin")
        paths.append(ckpt)
    return paths[0], paths[1]


def _make_read_only(root: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + dirnames:
            p = Path(dirpath) / name
            p.chmod(stat.S_IMODE(p.stat().st_mode) & ~0o222)
    root.chmod(stat.S_IMODE(root.stat().st_mode) & ~0o222)


def _make_writable(root: Path) -> None:
    root.chmod(0o755)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + dirnames:
            (Path(dirpath) / name).chmod(0o755)


PAIRS = {
    "safetensors": lambda root: write_pair(root / "ckpts"),
    "safetensors-sharded-bf16": lambda root: write_pair(root / "ckpts", shards=3, dtype=torch.bfloat16),
    "torch-bin": lambda root: _torch_bin_pair(root / "ckpts"),
}


@pytest.mark.parametrize("make", PAIRS.values(), ids=PAIRS.keys())
def test_diff_changes_nothing_in_the_checkpoints(tmp_path: Path, capsys: pytest.CaptureFixture, make) -> None:
    a, b = make(tmp_path)
    before = tree_snapshot(tmp_path / "ckpts")
    (tmp_path / "out").mkdir()  # ckptscan makes no folder for a report file (issue 52)
    result = run_cli(capsys, "diff", a, b, "--json", tmp_path / "out" / "report.json")
    assert result.code in (0, 1), result.stderr
    assert tree_snapshot(tmp_path / "ckpts") == before
    assert (tmp_path / "out" / "report.json").is_file()


def test_diff_on_a_read_only_copy(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a, b = write_pair(tmp_path / "src")
    shutil.copytree(tmp_path / "src", tmp_path / "ro")
    _make_read_only(tmp_path / "ro")
    try:
        before = tree_snapshot(tmp_path / "ro")
        result = run_cli(capsys, "diff", tmp_path / "ro" / a.name, tmp_path / "ro" / b.name)
        assert result.code in (0, 1), result.stderr
        assert tree_snapshot(tmp_path / "ro") == before
    finally:
        _make_writable(tmp_path / "ro")


def _run(root: Path, steps=(100, 200, 300, 400)) -> Path:
    config = llama_config(layers=2, experts=4)
    for i, step in enumerate(steps):
        write_hf_checkpoint(root / f"checkpoint-{step}", llama_tensors(config, seed=i + 1), config)
    return root


@pytest.mark.skipif(not hasattr(ckptscan.cli, "inspect"), reason="ckptscan inspect is not there yet")
def test_inspect_changes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a, b = write_pair(tmp_path / "ckpts", shards=2)
    before = tree_snapshot(tmp_path / "ckpts")
    for target in (a, tmp_path / "ckpts"):  # a checkpoint, then the run
        result = run_cli(capsys, "inspect", target, "--json", tmp_path / "inspect.json")
        assert result.code == 0, result.stderr
    assert tree_snapshot(tmp_path / "ckpts") == before


@pytest.mark.skipif(not TREND, reason="ckptscan trend is not there yet")
def test_trend_with_cache_changes_nothing_in_the_run(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    run = _run(tmp_path / "run")
    _make_read_only(run)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    try:
        before = tree_snapshot(run)
        for _ in range(2):  # a cold and a warm cache
            result = run_cli(capsys, "trend", run, "--json", tmp_path / "report.json")
            assert result.code in (0, 1), result.stderr
        assert tree_snapshot(run) == before
        cached = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
        assert cached, "the cache should live under XDG_CACHE_HOME"
        assert not [p for p in (tmp_path / "cache").rglob("*.tmp")]
    finally:
        _make_writable(run)


class _Boom(Exception):
    pass


@pytest.mark.parametrize("interrupt", [_Boom, KeyboardInterrupt])
@pytest.mark.parametrize("where", ["write", "fsync", "replace"])
def test_interrupted_write_leaves_the_old_file_and_no_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          where: str, interrupt: type[BaseException]) -> None:
    target = tmp_path / "report.json"
    target.write_text('{"old": true}\n')

    def fail(*args, **kwargs):
        raise interrupt()

    if where == "write":
        # Half the text is written, then the failure.
        real_fdopen = os.fdopen

        class HalfWriter:
            def __init__(self, f):
                self.f = f

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return self.f.__exit__(*exc)

            def write(self, text):
                self.f.write(text[: len(text) // 2])
                self.f.flush()
                raise interrupt()

        monkeypatch.setattr(atomic_module.os, "fdopen", lambda *a, **k: HalfWriter(real_fdopen(*a, **k)))
    elif where == "fsync":
        monkeypatch.setattr(atomic_module.os, "fsync", fail)
    else:
        monkeypatch.setattr(atomic_module.os, "replace", fail)
    with pytest.raises(interrupt):
        write_atomic(target, json.dumps({"new": list(range(10_000))}))
    monkeypatch.undo()
    assert json.loads(target.read_text()) == {"old": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_atomic_write_gives_a_normal_file_mode(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    try:
        write_atomic(tmp_path / "new.json", "{}")
        assert stat.S_IMODE((tmp_path / "new.json").stat().st_mode) == 0o644
        (tmp_path / "kept.json").write_text("{}")
        (tmp_path / "kept.json").chmod(0o640)
        write_atomic(tmp_path / "kept.json", "[]")
        assert stat.S_IMODE((tmp_path / "kept.json").stat().st_mode) == 0o640
        assert (tmp_path / "kept.json").read_text() == "[]"
    finally:
        os.umask(umask)


def test_interrupted_report_write_in_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while the JSON report is being written: exit 130, the previous
    report intact, no temp file."""
    a, b = write_pair(tmp_path / "ckpts")
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.json").write_text('{"previous": 1}')

    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(atomic_module.os, "fsync", interrupted)
    result = run_cli(capsys, "diff", a, b, "--json", out / "report.json")
    assert result.code == 130
    assert "interrupted" in result.stderr.lower()
    assert json.loads((out / "report.json").read_text()) == {"previous": 1}
    assert [p.name for p in out.iterdir()] == ["report.json"]


def test_report_path_that_cannot_be_written(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a, b = write_pair(tmp_path / "ckpts")
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    result = run_cli(capsys, "diff", a, b, "--json", blocker / "report.json")
    assert_one_line_error(result, str(blocker / "report.json"))
    result = run_cli(capsys, "diff", a, b, "--json", tmp_path)  # a directory
    assert_one_line_error(result, str(tmp_path))


@pytest.mark.skipif(not TREND, reason="the cache comes with ckptscan trend")
def test_cache_entries_are_atomic_and_a_torn_entry_is_recomputed(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from ckptscan import ScanOptions
    from ckptscan.caches.pair_cache import PairCache
    from ckptscan.pipeline.metrics import compute
    from ckptscan.pipeline.run import resolve_pair

    a, b = write_pair(tmp_path / "ckpts")
    spec = resolve_pair(a, b)
    older, newer = spec.checkpoints
    layers = compute(spec, ScanOptions()).pairs[0].layers
    cache = PairCache(tmp_path / "cache")
    key = cache.key(older, newer, ScanOptions().cache_key())

    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(atomic_module.os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cache.put(key, layers)
    monkeypatch.undo()
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert cache.get(key) is None

    cache.put(key, layers)
    (entry,) = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    entry.write_text(entry.read_text()[:100])  # torn by something else (disk full, another tool)
    assert cache.get(key) is None
    cache.put(key, layers)
    assert cache.get(key) is not None
