"""The report as plain JSON values (`document/plain.py`): built field by
field, it equals what `dataclasses.asdict` then a walk of the copy gave, and
`--per-head` keeps the per-head results of the layers it names, nothing else
changed."""

import copy
import dataclasses
import json
import math
import numbers

import numpy as np
import pytest

from ckptscan import __version__
from ckptscan.document.plain import PER_HEAD, keeps_heads, report_dict
from ckptscan.document.writing import report_json
from ckptscan.errors import CkptScanError
from ckptscan.schema.results import SCHEMA_VERSION


def heads(data):
    """(pair index, layer) of every layer whose per-head results the JSON holds."""
    return [(i, layer["layer"]) for i, pair in enumerate(data["pairs"]) for layer in pair["layers"]
            if layer["attention"] and layer["attention"]["heads"]]


def test_per_head_results_are_kept_for_all_layers_unless_limited(reports):
    report = reports["loss"]
    everything = report_dict(report)
    assert report_dict(report, "all") == everything and "per_head" not in everything["settings"]
    assert len(heads(everything)) == sum(len(pair.layers) for pair in report.pairs)

    flagged = report_dict(report, "flagged")
    assert heads(flagged) == [(i, layer.layer) for i, pair in enumerate(report.pairs) for layer in pair.layers
                              if layer.status in ("warn", "alert")]
    assert heads(flagged) and flagged["settings"]["per_head"] == "flagged"

    newest = report_dict(report, "newest")
    assert heads(newest) == [(len(report.pairs) - 1, layer.layer) for layer in report.pairs[-1].layers]
    # Nothing else changes: the same keys, the other values equal.
    for limited in (flagged, newest):
        del limited["settings"]["per_head"]
        for pair, full in zip(limited["pairs"], everything["pairs"]):
            for layer, whole in zip(pair["layers"], full["layers"]):
                layer["attention"]["heads"] = whole["attention"]["heads"]
        assert limited == everything
    with pytest.raises(CkptScanError, match="--per-head"):
        report_dict(report, "some")


def asdict_then_walk(report, per_head="all"):
    """report_dict as it was built before it walked the dataclasses itself
    (`dataclasses.asdict`, then a walk of the copy, then the heads left out):
    the reference the faster build must equal, key order included."""
    def walk(value):
        if isinstance(value, bool) or value is None or isinstance(value, str):
            return value
        if isinstance(value, numbers.Integral):
            return int(value)
        if isinstance(value, numbers.Real):
            value = float(value)
            return value if math.isfinite(value) else None
        if isinstance(value, dict):
            return {str(k): walk(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [walk(v) for v in value]
        return value

    body = walk(dataclasses.asdict(report))
    command = body.pop("command")
    for pair in body["pairs"]:
        for layer in pair["layers"]:
            if not layer["families"]:  # written only when a registered family computed values
                del layer["families"]
    if per_head != "all":
        newest = len(body["pairs"]) - 1
        for index, pair in enumerate(body["pairs"]):
            for layer in pair["layers"]:
                if layer.get("attention") and not keeps_heads(per_head, layer["status"], index == newest):
                    layer["attention"]["heads"] = []
        body["settings"]["per_head"] = per_head
    return {"schema_version": SCHEMA_VERSION, "tool": {"name": "ckptscan", "version": __version__},
            "command": command, **body}


def with_odd_values(report):
    """`report` with what a scan can leave in it besides plain floats: numpy
    numbers, NaN and infinities, a tuple, non-string dict keys."""
    report = copy.deepcopy(report)
    layer = report.pairs[0].layers[0]
    layer.attention.delta2_entropy = np.float32(0.25)
    layer.attention.dwq_entropy = float("nan")
    layer.attention.heads[0].dwk_entropy = float("-inf")
    layer.attention.heads[1].head = np.int64(1)
    layer.changed_fraction = {"W_q": np.float64(0.5)}
    report.settings["layers"] = (0, 1)
    report.thresholds["by_layer"] = {3: 0.5}
    return report


@pytest.mark.parametrize("per_head", PER_HEAD)
def test_report_dict_is_what_asdict_then_a_walk_of_it_gave(reports, per_head):
    for report in (*reports.values(), with_odd_values(reports["loss"])):
        built = report_dict(report, per_head)
        assert json.dumps(built) == json.dumps(asdict_then_walk(report, per_head))
        assert report_json(report, per_head) == json.dumps(built, indent=2, allow_nan=False) + "\n"
    odd = report_dict(with_odd_values(reports["loss"]), per_head)["pairs"][0]["layers"][0]
    assert (odd["attention"]["delta2_entropy"], odd["attention"]["dwq_entropy"]) == (0.25, None)
    assert type(odd["changed_fraction"]["W_q"]) is float


def test_flagged_and_newest_keeps_the_heads_of_both(reports):
    report = reports["loss"]
    both = report_dict(report, "flagged+newest")
    assert set(heads(both)) == set(heads(report_dict(report, "flagged"))) | set(heads(report_dict(report, "newest")))
    assert len(heads(both)) < len(heads(report_dict(report)))  # it leaves some out
    assert both["settings"]["per_head"] == "flagged+newest"
