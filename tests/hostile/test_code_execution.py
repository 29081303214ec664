"""A checkpoint is data: no file can make ckptscan run code.

Each malicious pickle below would create a marker file if unpickled by
`torch.load(weights_only=False)` or `pickle.load`; the tests check it is
refused with a clear error and the marker never appears.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import json
import os
import pickle
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch
from hostile.helpers import assert_one_line_error, deadline, run_cli, write_pair

import ckptscan
from ckptscan.errors import CkptScanError
from ckptscan.readers import open_checkpoint

PACKAGE = Path(ckptscan.__file__).parent


class _System:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


class _Exec:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return builtins.exec, (f"open({str(self.marker)!r}, 'w').close()",)


class _Popen:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return subprocess.Popen, (["touch", str(self.marker)],)


PAYLOADS = {"os.system": _System, "builtins.exec": _Exec, "subprocess.Popen": _Popen}


class _Call:
    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def _framework_named_payload(marker: Path) -> bytes:
    """A pickle calling `deepspeed.runtime.system` (a name posing as a training
    framework's, which ckptscan replaces with an inert stand-in) with a shell
    command, next to a plain `os.system` call."""
    module = types.ModuleType("deepspeed.runtime")
    module.system = lambda command: os.system(command)
    module.system.__module__, module.system.__qualname__ = "deepspeed.runtime", "system"
    sys.modules["deepspeed"] = sys.modules["deepspeed.runtime"] = module
    try:
        command = f"touch {marker}"
        return pickle.dumps({"args": _Call(module.system, command), "model": _Call(os.system, command)}, protocol=2)
    finally:
        del sys.modules["deepspeed"], sys.modules["deepspeed.runtime"]


def _write(kind: str, payload, directory: Path, marker: Path) -> Path:
    """Write one malicious checkpoint; return the path to hand to ckptscan."""
    evil = payload(marker)
    directory.mkdir(parents=True, exist_ok=True)
    if kind == "zip-bin":  # torch.save's zip format, HF file name
        torch.save({"model.embed_tokens.weight": torch.ones(2, 2), "evil": evil}, directory / "pytorch_model.bin")
        return directory
    if kind == "legacy-pt":  # pre-1.6 non-zip torch format
        torch.save({"w": torch.ones(2), "evil": evil}, directory / "model.pt", _use_new_zipfile_serialization=False)
        return directory / "model.pt"
    if kind == "raw-pickle":  # a plain pickle named like a checkpoint
        (directory / "weights.pth").write_bytes(pickle.dumps(evil))
        return directory / "weights.pth"
    if kind == "nanogpt-args":  # payload hidden in the metadata of a real-looking checkpoint
        torch.save({"model": {"transformer.h.0.attn.c_attn.weight": torch.ones(6, 2)}, "model_args": evil,
                    "iter_num": 5}, directory / "ckpt.pt")
        return directory / "ckpt.pt"
    if kind == "sharded-bin":  # the second shard of an index is the malicious one
        torch.save({"a": torch.ones(2)}, directory / "pytorch_model-00001-of-00002.bin")
        torch.save({"b": evil}, directory / "pytorch_model-00002-of-00002.bin")
        index = {"weight_map": {"a": "pytorch_model-00001-of-00002.bin", "b": "pytorch_model-00002-of-00002.bin"}}
        (directory / "pytorch_model.bin.index.json").write_text(json.dumps(index))
        return directory
    if kind == "framework-global":
        (directory / "model.pt").write_bytes(_framework_named_payload(marker))
        return directory / "model.pt"
    raise AssertionError(kind)


KINDS = ["zip-bin", "legacy-pt", "raw-pickle", "nanogpt-args", "sharded-bin"]


def _control(marker: Path, payload) -> None:
    """The payload really is live: plain pickle runs it. Without this the
    tests below could pass on a harmless file."""
    pickle.loads(pickle.dumps(payload(marker)))
    for _ in range(50):  # Popen's child may lag
        if marker.exists():
            break
        time.sleep(0.1)
    assert marker.exists()
    marker.unlink()


@pytest.mark.parametrize("payload", PAYLOADS.values(), ids=PAYLOADS.keys())
def test_payloads_are_live(tmp_path: Path, payload) -> None:
    _control(tmp_path / "marker", payload)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("payload", PAYLOADS.values(), ids=PAYLOADS.keys())
def test_malicious_pickle_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, payload) -> None:
    # torch honours this variable only where a caller leaves weights_only unset.
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    marker = tmp_path / "marker"
    target = _write(kind, payload, tmp_path / "checkpoint-1", marker)
    with pytest.raises(CkptScanError) as e:
        checkpoint = open_checkpoint(target)
        for name in checkpoint.tensors.keys():  # sharded pickles load lazily
            checkpoint.tensors.get(name)
    assert str(tmp_path / "checkpoint-1") in str(e.value)
    assert not marker.exists()


@pytest.mark.parametrize("kind", ["zip-bin", "legacy-pt", "sharded-bin"])
def test_cli_refuses_malicious_pickle(tmp_path: Path, capsys: pytest.CaptureFixture, kind: str) -> None:
    marker = tmp_path / "marker"
    a, _ = write_pair(tmp_path)
    target = _write(kind, _System, tmp_path / "evil", marker)
    result = run_cli(capsys, "diff", a, target)
    assert_one_line_error(result, str(tmp_path / "evil"))
    assert not marker.exists()


def test_framework_named_globals_run_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    target = _write("framework-global", _System, tmp_path, marker)
    with pytest.raises(CkptScanError, match="posix.system|os.system"):
        open_checkpoint(target)
    assert not marker.exists()


def test_training_state_files_next_to_safetensors_are_never_unpickled(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """HF Trainer checkpoints hold pickles besides the weights
    (training_args.bin is a full pickle of TrainingArguments); a scan of the
    safetensors weights must not touch them."""
    marker = tmp_path / "marker"
    a, b = write_pair(tmp_path)
    for ckpt in (a, b):
        for name in ("training_args.bin", "optimizer.pt", "scheduler.pt", "rng_state.pth", "pytorch_model.bin"):
            torch.save({"state": _System(marker)}, ckpt / name)
    result = run_cli(capsys, "diff", a, b)
    assert result.code in (0, 1), result.stderr
    assert not marker.exists()


def _self_containing() -> dict:
    state = {"w": torch.ones(2)}
    state["again"] = state
    return state


def _shared_tower() -> dict:
    """40 levels of {"a": d, "b": d}: a few hundred bytes, 2^40 entries as a tree."""
    state = {"w": torch.ones(2)}
    for _ in range(40):
        state = {"a": state, "b": state}
    return state


def _deep() -> dict:
    state = {"w": torch.ones(2)}
    for _ in range(5000):
        state = {"x": state}
    return state


def _self_containing_args() -> dict:
    args = argparse.Namespace(lr=1.0)
    args.self = [args]
    return {"model": {"w": torch.ones(2)}, "model_args": args}


PICKLE_BOMBS = {"cycle": _self_containing, "shared-tower": _shared_tower, "deep": _deep,
                "cyclic-args": _self_containing_args}


@pytest.mark.parametrize("make", PICKLE_BOMBS.values(), ids=PICKLE_BOMBS.keys())
def test_pickle_structure_bombs_are_refused_promptly(tmp_path: Path, capsys: pytest.CaptureFixture, make) -> None:
    """Memo references let a small pickle build a cycle or an exponential
    tree out of plain dicts, which the weights-only unpickler allows."""
    a, _ = write_pair(tmp_path)
    path = tmp_path / "bomb.pt"
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)  # so that pickle can write the deep one
    try:
        torch.save(make(), path)
    finally:
        sys.setrecursionlimit(limit)
    with deadline(20):
        result = run_cli(capsys, "diff", a, path)
    assert_one_line_error(result, str(path), "refusing")


# Calls that deserialise arbitrary objects. torch.load is allowed only with
# weights_only=True written at the call site.
FORBIDDEN_CALLS = {
    ("pickle", "load"), ("pickle", "loads"), ("pickle", "Unpickler"),
    ("dill", "load"), ("dill", "loads"), ("cloudpickle", "load"), ("cloudpickle", "loads"),
    ("joblib", "load"), ("marshal", "loads"), ("marshal", "load"), ("shelve", "open"),
    ("jit", "load"), ("torch.jit", "load"), ("yaml", "load"), ("yaml", "unsafe_load"),
    ("serialization", "add_safe_globals"),  # process-wide: would widen the user's own torch.load
}
FORBIDDEN_NAMES = {"eval", "exec", "__import__"}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return "?"


def unsafe_calls(source: str, where: str) -> list[str]:
    """Every call in `source` that could deserialise code."""
    problems = []
    for call in (n for n in ast.walk(ast.parse(source, where)) if isinstance(n, ast.Call)):
        name = _dotted(call.func)
        head, _, tail = name.rpartition(".")
        here = f"{where}:{call.lineno}: {name}"
        keywords = {k.arg: k.value for k in call.keywords}
        if name == "torch.load" or name == "load":
            weights_only = keywords.get("weights_only")
            if not (isinstance(weights_only, ast.Constant) and weights_only.value is True):
                problems.append(f"{here} without a literal weights_only=True")
        elif (head.rsplit(".", 1)[-1], tail) in FORBIDDEN_CALLS or (head, tail) in FORBIDDEN_CALLS:
            problems.append(here)
        elif name in FORBIDDEN_NAMES:
            problems.append(here)
        elif tail == "load" and head in ("numpy", "np"):
            allow = keywords.get("allow_pickle")
            if isinstance(allow, ast.Constant) and allow.value is True:
                problems.append(f"{here}(allow_pickle=True)")
    return problems


def test_source_never_loads_pickles_unsafely() -> None:
    problems = [
        problem
        for path in sorted(PACKAGE.rglob("*.py"))
        for problem in unsafe_calls(path.read_text(encoding="utf-8"), str(path))
    ]
    assert not problems, "\n".join(problems)


def test_the_source_check_can_fail() -> None:
    bad = (
        "import torch, pickle, numpy as np\n"
        "torch.load(f)\n"
        "torch.load(f, weights_only=False)\n"
        "torch.load(f, weights_only=True)\n"
        "pickle.loads(b)\n"
        "np.load(f, allow_pickle=True)\n"
        "torch.serialization.add_safe_globals([x])\n"
        "eval(s)\n"
    )
    assert len(unsafe_calls(bad, "bad.py")) == 6


def test_source_has_no_weights_only_false() -> None:
    offenders = [
        f"{path}:{n}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "weights_only=False" in line.replace(" ", "")
    ]
    assert not offenders, offenders
