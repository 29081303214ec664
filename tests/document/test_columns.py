"""Columns give back exactly the values they were given: random nested JSON
values, the pairs of real reports, floats bit for bit."""

import base64
import json
import random
import struct

import numpy as np
import pytest
from exact import same

from ckptscan.document import columns
from ckptscan.document.plain import plain_pair


def random_scalar(rng):
    kind = rng.randrange(7)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, 1, -3, 2**40])
    if kind == 3:
        return rng.choice([0.0, -0.0, 1.0, 5e-324, 1.7976931348623157e308, rng.random(), -rng.gauss(0, 1e6)])
    if kind == 4:
        return rng.choice(["ok", "warn", "", "é"])
    return rng.random()


def random_value(rng, depth=0):
    kind = rng.randrange(4 if depth < 3 else 1)
    if kind == 1:
        return {rng.choice("abcde"): random_value(rng, depth + 1) for _ in range(rng.randrange(4))}
    if kind == 2:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return random_scalar(rng)


def round_trip(values):
    """Through the JSON text, as the report's parts file holds it."""
    return columns.decode(json.loads(json.dumps(columns.encode(values), allow_nan=False)))


@pytest.mark.parametrize("seed", range(40))
def test_random_nested_values_come_back_as_they_were(seed):
    rng = random.Random(seed)
    # Rows alike (one shape, like a report's layers) and rows of anything.
    shape = random_value(rng, 1)
    alike = [json.loads(json.dumps(shape)) for _ in range(rng.randrange(1, 30))]
    for row in alike:
        if isinstance(row, dict):
            for key in row:
                row[key] = random_value(rng, 2) if rng.random() < 0.3 else row[key]
    for values in (alike, [random_value(rng) for _ in range(rng.randrange(30))]):
        assert same(round_trip(values), values)


def test_floats_are_packed_as_their_float64_bytes_and_nulls_stay_null():
    rng = np.random.default_rng(0)
    values = [float(v) for v in rng.standard_normal(200) * 10.0 ** rng.integers(-300, 300, 200)]
    values[7] = None
    values[8] = -0.0
    encoded = columns.encode(values)
    assert set(encoded) == {"f8"}
    assert np.frombuffer(base64.b64decode(encoded["f8"]), "<f8")[:7].tolist() == values[:7]
    assert same(round_trip(values), values)


def test_repeated_values_are_runs_and_a_few_strings_a_table():
    assert columns.encode(["ok"] * 50 + ["warn"] + ["ok"] * 49) == {"rle": ["ok", 50, "warn", 1, "ok", 49]}
    # 1, 1.0 and True are three runs; so are 0.0 and -0.0.
    assert columns.encode([1, 1.0, True, 0.0, -0.0] * 1)["raw"] == [1, 1.0, True, 0.0, -0.0]
    states = ["baseline", "judged", "warm_up", "judged"] * 25
    encoded = columns.encode(states)
    assert encoded["cat"] == ["baseline", "judged", "warm_up"] and round_trip(states) == states


def test_dicts_of_other_key_orders_stay_as_they_are():
    values = [{"a": 1.5, "b": 2.5}, {"b": 3.5, "a": 4.5}]
    assert columns.encode(values) == {"raw": values}
    assert [list(row) for row in round_trip(values)] == [["a", "b"], ["b", "a"]]


def test_a_report_pairs_come_back_as_report_dict_gave_them(reports):
    for report in reports.values():
        for per_head in ("all", "flagged+newest"):
            pairs = [plain_pair(pair, per_head, False) for pair in report.pairs]
            assert same(round_trip(pairs), pairs)
            # Keys once, floats packed: well under the bytes of the same pairs in schema 1.
            assert len(json.dumps(columns.encode(pairs))) < 0.6 * len(json.dumps(pairs, separators=(",", ":")))


def test_an_unknown_column_kind_is_an_error():
    with pytest.raises(ValueError, match="unknown column kind"):
        columns.decode({"zz": []})


def test_a_nan_among_nulls_stays_a_nan():
    """A report never holds a NaN, but the caches keep what was computed."""
    values = [1.5, None, float("nan"), -0.0, None, float("inf")] * 3
    encoded = columns.encode(values)
    assert set(encoded) == {"f8", "none"}
    back = columns.decode(json.loads(json.dumps(encoded, allow_nan=True)))
    assert [v is None for v in back] == [v is None for v in values]
    assert struct.pack("<d", back[2]) == struct.pack("<d", values[2]) and same(back[3], -0.0)
