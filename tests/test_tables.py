"""Tables give back exactly the results they were given: random layers
(attention with heads, routers, findings, judgements), floats bit for bit
with NaN, ±inf, -0.0 and None, through the JSON text a pack holds."""

import dataclasses
import json
import math
import random
import types
import typing

import pytest
from exact import same

from ckptscan.caches import tables
from ckptscan.caches.judge_cache import PairJudgement
from ckptscan.schema.results import Finding, HeadResult, LayerResult, SeriesPoint

FLOATS = [math.nan, math.inf, -math.inf, -0.0, 0.0, 5e-324, 1.7976931348623157e308, 1.0]


def random_value(hint, rng):
    """A random value of type `hint`, read from the annotations (not from tables)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(hint) if a is not type(None)]
        return None if rng.random() < 0.3 else random_value(members[0], rng)
    if dataclasses.is_dataclass(hint):
        hints = typing.get_type_hints(hint)
        return hint(**{f.name: random_value(hints[f.name], rng) for f in dataclasses.fields(hint)})
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is list:
        return [random_value(args[0], rng) for _ in range(rng.randrange(4))]
    if origin is dict:
        return {rng.choice(["W_q", "W_k", "delta2_entropy_norm", "é"]): random_value(args[1], rng)
                for _ in range(rng.randrange(3))}
    if hint is float:
        return rng.choice(FLOATS) if rng.random() < 0.3 else rng.gauss(0, 10.0 ** rng.randrange(-300, 300))
    if hint is int:
        return rng.choice([0, -1, 7, 2**62])
    if hint is bool:
        return rng.random() < 0.5
    if hint is str:
        return rng.choice(["ok", "warn", "alert", "", "é"])
    raise TypeError(hint)


def round_trip(hint, values):
    return tables.decode(hint, json.loads(json.dumps(tables.encode(hint, values), allow_nan=True)))


@pytest.mark.parametrize("seed", range(25))
def test_random_pairs_of_layers_come_back_as_they_were(seed):
    rng = random.Random(seed)
    pairs = [[random_value(LayerResult, rng) for _ in range(rng.randrange(4))] for _ in range(rng.randrange(12))]
    back = round_trip(list[LayerResult], pairs)
    assert same(back, pairs)
    assert back is not pairs and all(b is not p for b, p in zip(back, pairs))


@pytest.mark.parametrize("seed", range(10))
def test_random_judgements_come_back_as_they_were(seed):
    rng = random.Random(seed)
    judged = [random_value(PairJudgement, rng) for _ in range(rng.randrange(1, 15))]
    assert same(round_trip(PairJudgement, judged), judged)


def test_nulls_and_nans_of_one_field_stay_apart():
    heads = [HeadResult(0, 0, math.nan, None, -0.0, math.inf) for _ in range(3)]
    heads.append(HeadResult(1, 0, None, 1.0, 2.0, 3.0))
    back = round_trip(HeadResult, heads)
    assert math.isnan(back[0].delta2_entropy) and back[3].delta2_entropy is None and back[0].delta3_entropy is None
    assert same(back, heads)


def test_nested_results_are_rebuilt_as_their_classes():
    layer = LayerResult(3, findings=[Finding("delta2_entropy_norm", "attention", "alert", 0.1, "collapsed")],
                        judgements={"delta2_entropy_norm": SeriesPoint("alert", 0.1, 0.8)})
    (back,) = round_trip(LayerResult, [layer])
    assert type(back.findings[0]) is Finding and type(back.judgements["delta2_entropy_norm"]) is SeriesPoint
    assert back == layer


def test_a_table_of_other_fields_is_refused():
    column = tables.encode(SeriesPoint, [SeriesPoint("ok", 1.0)])
    column["fields"][0][0] = "status"  # as a version with a renamed field wrote it
    with pytest.raises(ValueError, match="SeriesPoint"):
        tables.decode(SeriesPoint, column)


@pytest.mark.parametrize("damage", ["a longer column", "lengths past the items", "nulls past the rows",
                                    "keys past the items"])
def test_columns_that_do_not_add_up_are_refused(damage):
    layers = [LayerResult(0, judgements={"a": SeriesPoint("ok", 1.0)}, findings=[Finding("m", "f", "warn", 1.0, "x")]),
              LayerResult(1)]
    column = tables.encode(list[LayerResult], [layers, [None]])
    rows = column["items"]
    fields = dict(rows["fields"])
    if damage == "a longer column":
        fields["layer"]["raw"].append(7)
    if damage == "lengths past the items":
        column["lengths"] = {"raw": [3, 1]}
    if damage == "nulls past the rows":
        rows["none"] = {"raw": [False, False, False]}
    if damage == "keys past the items":
        fields["judgements"]["keys"] = {"raw": [["a", "b"], []]}
    with pytest.raises(ValueError):
        tables.decode(list[LayerResult], column)
