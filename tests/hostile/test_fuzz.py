"""Fuzzing: arbitrary safetensors headers and bytes, and arbitrary
config.json contents, end in a result or a CkptScanError, never in another
exception, a crash or a hang.

Each property runs a few hundred cases; the whole file stays well under a
minute on two cores.
"""

from __future__ import annotations

import json
import math
import shutil
import struct
import tempfile
from pathlib import Path

import pytest
from factories import llama_config, llama_tensors, write_hf_checkpoint
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptscan import scan_pair
from ckptscan.errors import CkptScanError
from ckptscan.readers import open_checkpoint
from ckptscan.readers.safetensors import DTYPES, read_header, read_tensor

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
SCAN_FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))

DTYPE_NAMES = [*DTYPES, "F128", "f32", "", "Q4_K", "F8_E8M0", "C64"]
NUMBERS = st.one_of(
    st.integers(-(2**70), 2**70),
    st.integers(0, 64),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
)
JSON_LEAF = st.one_of(NUMBERS, st.text(max_size=8))
JSON_ANY = st.recursive(JSON_LEAF, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(st.text(max_size=6), inner, max_size=4)),
                        max_leaves=12)


@st.composite
def valid_headers(draw) -> tuple[dict, bytes]:
    """A valid header (tensors of any dtype, packed in random order) and its data."""
    names = draw(st.lists(st.text(min_size=1, max_size=6), max_size=4, unique=True))
    header, offset = {}, 0
    for name in names:
        dtype = draw(st.sampled_from(list(DTYPES)))
        shape = draw(st.lists(st.integers(0, 5), max_size=3))
        size = math.prod(shape) * DTYPES[dtype].itemsize
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    if draw(st.booleans()):
        header["__metadata__"] = draw(st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2))
    return header, draw(st.binary(min_size=offset, max_size=offset + 8))


FIELD_VALUES = {
    "dtype": st.one_of(st.sampled_from(DTYPE_NAMES), JSON_ANY),
    "shape": st.one_of(st.lists(st.integers(-2, 2**40), max_size=3), JSON_ANY),
    "data_offsets": st.one_of(st.lists(st.integers(-8, 400), min_size=2, max_size=2),
                              st.lists(NUMBERS, max_size=3), JSON_ANY),
}


@st.composite
def mutated_header(draw, header: dict) -> dict:
    """0-2 edits of a valid header: a field replaced or dropped, an entry
    replaced, a tensor's offsets shifted onto another's."""
    header = json.loads(json.dumps(header))
    names = [n for n in header if n != "__metadata__"]
    for _ in range(draw(st.integers(0, 2))):
        if not names:
            break
        name = draw(st.sampled_from(names))
        entry = header[name]
        edit = draw(st.sampled_from(["set", "drop", "entry", "shift", "metadata"]))
        if not isinstance(entry, dict) or edit == "entry":
            header[name] = draw(JSON_ANY)
        elif edit == "set":
            key = draw(st.sampled_from(list(FIELD_VALUES)))
            entry[key] = draw(FIELD_VALUES[key])
        elif edit == "drop":
            entry.pop(draw(st.sampled_from(list(FIELD_VALUES))), None)
        elif edit == "shift" and isinstance(entry.get("data_offsets"), list) and len(entry["data_offsets"]) == 2:
            delta = draw(st.integers(-16, 16))
            entry["data_offsets"] = [o + delta if isinstance(o, int) else o for o in entry["data_offsets"]]
        elif edit == "metadata":
            header["__metadata__"] = draw(JSON_ANY)
    return header


@st.composite
def safetensors_files(draw) -> bytes:
    """Mostly near-valid files, so every check past the first gets exercised."""
    header, data = draw(valid_headers())
    header = draw(mutated_header(header))
    raw = json.dumps(header, allow_nan=True).encode()
    kind = draw(st.sampled_from(["exact"] * 6 + ["garbage-header", "half-header", "any-header"]))
    if kind == "garbage-header":
        raw = draw(st.binary(max_size=64))
    elif kind == "half-header":
        raw = raw[: len(raw) // 2]
    elif kind == "any-header":
        raw = json.dumps(draw(JSON_ANY), allow_nan=True).encode()
    raw += b" " * draw(st.integers(0, 3))  # the format allows trailing spaces
    length = draw(st.one_of(st.just(len(raw)), st.just(len(raw)), st.integers(0, 2**64 - 1),
                            st.integers(0, len(raw) + 16)))
    file = struct.pack("<Q", length) + raw + data
    cut = draw(st.one_of(st.none(), st.none(), st.none(), st.integers(0, len(file))))
    return file if cut is None else file[:cut]


@pytest.fixture(scope="module")
def workdir():
    path = Path(tempfile.mkdtemp(prefix="ckptscan-fuzz-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@FUZZ
@given(content=safetensors_files())
def test_fuzz_safetensors_reader(workdir: Path, content: bytes) -> None:
    path = workdir / "model.safetensors"
    path.write_bytes(content)
    try:
        entries_, _ = read_header(path)
    except CkptScanError as e:
        assert str(path) in str(e)
        return
    # A header that validates describes its file exactly: every tensor reads
    # back with its declared shape, from inside the file.
    size = len(content)
    for name, entry in entries_.items():
        assert 8 <= entry.start <= entry.end <= size
        tensor = read_tensor(entry, name)
        assert tuple(tensor.shape) == entry.shape
        assert tensor.numel() * tensor.element_size() == entry.end - entry.start


@FUZZ
@given(data=st.data())
def test_fuzz_mutated_real_file(workdir: Path, data) -> None:
    """Byte flips, insertions and truncations of a real safetensors file."""
    original = _real_file(workdir)
    content = bytearray(original)
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "insert", "truncate", "delete"]))
        if not content:
            break
        at = data.draw(st.integers(0, len(content) - 1))
        if op == "flip":
            content[at] ^= data.draw(st.integers(1, 255))
        elif op == "insert":
            content[at:at] = data.draw(st.binary(min_size=1, max_size=8))
        elif op == "truncate":
            del content[at:]
        else:
            del content[at:at + data.draw(st.integers(1, 16))]
    path = workdir / "mutated.safetensors"
    path.write_bytes(bytes(content))
    try:
        entries_, _ = read_header(path)
    except CkptScanError:
        return
    for name, entry in entries_.items():
        assert read_tensor(entry, name).shape == entry.shape


_REAL: dict[str, bytes] = {}


def _real_file(workdir: Path) -> bytes:
    if "file" not in _REAL:
        config = llama_config(layers=1, hidden=16, heads=2, kv_heads=1)
        directory = write_hf_checkpoint(workdir / "real", llama_tensors(config, seed=1), config)
        _REAL["file"] = (directory / "model.safetensors").read_bytes()
    return _REAL["file"]


CONFIG_KEYS = ["model_type", "hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
               "head_dim", "num_local_experts", "num_experts_per_tok", "n_head", "n_embd", "num_kv_heads",
               "num_experts", "text_config", "architectures", "qk_layernorm", "rope_theta"]
CONFIG_VALUES = st.one_of(
    st.integers(-3, 70), st.sampled_from([0, 1, 2, 4, 8, 16, 64, 2**31, 2**63]), st.floats(allow_nan=True),
    st.sampled_from(["llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "olmo2", "gpt2", "falcon", "bert",
                     "deepseek_v3", "", "4"]),
    st.booleans(), st.none(), JSON_ANY,
)


@st.composite
def configs(draw) -> object:
    base = llama_config(layers=2, experts=4)
    if draw(st.integers(0, 4)):  # mostly a real config with a few fields changed
        for key in draw(st.lists(st.sampled_from(CONFIG_KEYS), max_size=4, unique=True)):
            base[key] = draw(CONFIG_VALUES)
        for key in draw(st.lists(st.sampled_from(list(base)), max_size=2, unique=True)):
            del base[key]
        return base
    return draw(JSON_ANY)


@pytest.fixture(scope="module")
def config_pair(workdir: Path) -> tuple[Path, Path]:
    config = llama_config(layers=2, experts=4)
    a = write_hf_checkpoint(workdir / "checkpoint-100", llama_tensors(config, seed=1), config)
    b = write_hf_checkpoint(workdir / "checkpoint-200", llama_tensors(config, seed=2), config)
    return a, b


@SCAN_FUZZ
@given(config=configs(), raw_text=st.one_of(st.none(), st.text(max_size=40)))
def test_fuzz_config_json(config_pair: tuple[Path, Path], config: object, raw_text: str | None) -> None:
    """Any config.json (valid JSON of any shape, or not JSON at all) for the
    newer checkpoint: a scan result or a CkptScanError."""
    a, b = config_pair
    text = raw_text if raw_text is not None else json.dumps(config, allow_nan=True)
    (b / "config.json").write_text(text)
    try:
        report = scan_pair(a, b)
    except CkptScanError:
        return
    for layer in report.pairs[0].layers:
        value = layer.attention.delta2_entropy if layer.attention else None
        assert value is None or math.isfinite(value)


@SCAN_FUZZ
@given(config=configs())
def test_fuzz_config_json_open(config_pair: tuple[Path, Path], config: object) -> None:
    """The same, for both checkpoints at once and through `open_checkpoint`."""
    a, b = config_pair
    for path in (a, b):
        (path / "config.json").write_text(json.dumps(config, allow_nan=True))
    try:
        open_checkpoint(b)
        scan_pair(a, b)
    except CkptScanError:
        pass


SHARD_NAMES = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
TENSOR_NAMES = [f"model.layers.{i}.self_attn.{p}_proj.weight" for i in range(2) for p in "qk"]


@pytest.fixture(scope="module")
def sharded(workdir: Path) -> Path:
    config = llama_config(layers=2, experts=4)
    return write_hf_checkpoint(workdir / "sharded" / "checkpoint-300", llama_tensors(config, seed=3), config, shards=2)


INDEX = st.one_of(
    st.fixed_dictionaries({"weight_map": st.dictionaries(
        st.one_of(st.sampled_from(TENSOR_NAMES), st.text(max_size=8)),
        st.one_of(st.sampled_from(SHARD_NAMES), st.sampled_from(["../x", "/etc/hostname", ".", "", "sub/x"]),
                  JSON_LEAF),
        max_size=6)}),
    JSON_ANY,
)


@FUZZ
@given(index=INDEX)
def test_fuzz_index_json(sharded: Path, index: object) -> None:
    """Any shard index: opening the checkpoint gives a checkpoint whose
    tensors all come from files in its directory, or a CkptScanError."""
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index, allow_nan=True))
    try:
        checkpoint = open_checkpoint(sharded)
    except CkptScanError:
        return
    assert all(f.resolve().parent == sharded.resolve() for f in checkpoint.files)
