"""A pack gives back the names and columns it was given, floats bit for bit
from its binary part; anything that is not a whole pack is a PackError."""

import json
import math
import struct

import pytest

from ckptscan.caches import tables
from ckptscan.caches.packs import MAGIC, PackError, common_prefix, read_pack, write_pack
from ckptscan.schema.results import AttentionResult, HeadResult, LayerResult, SeriesPoint


def layers():
    heads = [HeadResult(h, 0, 0.1 * h, math.nan, -0.0, math.inf, None, 2.5e-300) for h in range(4)]
    return [[LayerResult(0, judgements={"x": SeriesPoint("ok", 1.0 / 3)}, stored_dtype={"f8": "BF16"}),
             LayerResult(1, nonfinite={"W_q": 2})], [LayerResult(0), LayerResult(1)]] * 3 + \
        [[LayerResult(2, changed_fraction={"W_q": 0.5, "W_k": math.nan})]] + \
        [[LayerResult(3, attention=None, families={"output": {"logit_scale": 7.0, "f8": None}})]] + \
        [[LayerResult(4, router=None)] for _ in range(2)] + [[_with_heads(heads)]]


def _with_heads(heads):
    return LayerResult(5, AttentionResult(*[0.5] * 9, heads=heads))


def test_a_pack_gives_back_its_names_and_rows_bit_for_bit(tmp_path):
    rows = layers()
    write_pack(tmp_path / "p.pack", ["a", "b"], tables.encode(list[LayerResult], rows))
    names, column = read_pack(tmp_path / "p.pack")
    back = tables.decode(list[LayerResult], column)
    assert names == ["a", "b"]
    assert json.dumps([[repr(layer) for layer in pair] for pair in back]) == \
        json.dumps([[repr(layer) for layer in pair] for pair in rows])  # repr shows nan, -0.0, inf as they are
    heads = back[-1][0].attention.heads
    assert struct.pack("<d", heads[3].dwq_entropy) == struct.pack("<d", -0.0) and math.isnan(heads[0].delta3_entropy)


def test_its_floats_are_bytes_after_the_header_not_base64_in_it(tmp_path):
    rows = [[_with_heads([HeadResult(h, 0, float(h), 1.0, 2.0, 3.0) for h in range(64)])]]
    write_pack(tmp_path / "p.pack", ["a"], tables.encode(list[LayerResult], rows))
    data = (tmp_path / "p.pack").read_bytes()
    (length,) = struct.unpack_from("<Q", data, len(MAGIC))
    header = data[len(MAGIC) + 12:len(MAGIC) + 12 + length]
    assert b'"f8@"' in header and b'"f8":' not in header
    assert struct.pack("<64d", *map(float, range(64))) in data[len(MAGIC) + 12 + length:]


def test_a_raw_value_shaped_like_a_float_column_is_left_as_it_is(tmp_path):
    column = {"raw": [{"f8": "AAAAAAAA8D8="}, {"f8@": [0, 1]}]}
    write_pack(tmp_path / "p.pack", [], column)
    assert read_pack(tmp_path / "p.pack")[1] == column


@pytest.mark.parametrize("damage", ["empty", "magic", "cut header", "cut floats", "a bit flipped in a length",
                                    "a bit flipped in a float"])
def test_what_is_not_a_whole_pack_is_a_pack_error(tmp_path, damage):
    path = tmp_path / "p.pack"
    write_pack(path, ["a", "b"], tables.encode(list[LayerResult], [[_with_heads([])], [LayerResult(1)] * 2]))
    data = bytearray(path.read_bytes())
    (length,) = struct.unpack_from("<Q", data, len(MAGIC))
    start = len(MAGIC) + 12
    if damage == "a bit flipped in a length":  # [1, 2] -> [3, 2]: one layer moved between the pairs
        at = data.index(b'"lengths": {"raw": [1, 2]}') + len(b'"lengths": {"raw": [')
        data[at] ^= 0b10
    if damage == "a bit flipped in a float":
        data[-3] ^= 1
    damaged = {"empty": b"", "magic": b"x" + data[1:], "cut header": data[:start + length // 2],
               "cut floats": data[:-8]}.get(damage, bytes(data))
    path.write_bytes(damaged)
    with pytest.raises(PackError):
        read_pack(path)


def test_a_pack_of_another_format_is_a_pack_error(tmp_path, monkeypatch):
    from ckptscan.caches import packs

    monkeypatch.setattr(packs, "PACK_FORMAT", 9)
    write_pack(tmp_path / "p.pack", ["a"], tables.encode(list[LayerResult], [[LayerResult(0)]]))
    monkeypatch.undo()
    with pytest.raises(PackError, match="another pack format"):
        read_pack(tmp_path / "p.pack")


def test_common_prefix_counts_the_names_shared_from_the_first():
    assert common_prefix(["a", "b", "c"], ["a", "b", "x", "c"]) == 2
    assert common_prefix([], ["a"]) == 0 and common_prefix(["a"], ["a"]) == 1
