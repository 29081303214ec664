"""Comparing reports made by different executors."""

import json
import math

from ckptscan.document.writing import report_json


def assert_reports_equal(a, b, tol=1e-12, where="report"):
    """Two reports (or their JSON values) equal, floats to `tol` (relative
    to max(1, |value|)), everything else exactly."""
    if not isinstance(a, (dict, list, int, float, str, bool, type(None))):
        a, b = json.loads(report_json(a)), json.loads(report_json(b))
    if isinstance(a, float) or isinstance(b, float):
        assert isinstance(a, (int, float)) and isinstance(b, (int, float)), (where, a, b)
        assert math.isclose(a, b, rel_tol=tol, abs_tol=tol), (where, a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), (where, a.keys() ^ b.keys())
        for key in a:
            assert_reports_equal(a[key], b[key], tol, f"{where}.{key}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), (where, len(a), len(b))
        for i, (x, y) in enumerate(zip(a, b)):
            assert_reports_equal(x, y, tol, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)
