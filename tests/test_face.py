"""`import ckptscan`: the entry points, what a scan is asked and what it
returns, each importable from the package and the same object as in its
module; the names the face no longer offers still import, with a
DeprecationWarning that names their module; anything else is an
AttributeError. Importing the package itself imports no torch."""

import importlib
import subprocess
import sys
import warnings

import pytest

import ckptscan

ENTRY_POINTS = {"scan_pair", "scan_run", "watch_run", "compare_runs", "load_report"}
REPORTS = {"ScanReport", "SweepReport", "WatchEvent"}


def test_the_face_holds_the_entry_points_and_the_reports_users_hold():
    assert ENTRY_POINTS | REPORTS | {"ScanRequest", "ScanOptions", "CkptScanError"} <= set(ckptscan.__all__)
    assert not set(ckptscan._DEPRECATED) & set(ckptscan.__all__)


@pytest.mark.parametrize("name", sorted(ckptscan._EXPORTS))
def test_each_public_name_is_its_module_s_object_without_a_warning(name):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        value = getattr(ckptscan, name)
    assert value is getattr(importlib.import_module(ckptscan._EXPORTS[name]), name)


@pytest.mark.parametrize("name", sorted(ckptscan._DEPRECATED))
def test_a_name_the_face_no_longer_offers_imports_with_a_deprecation_warning(name):
    module = ckptscan._DEPRECATED[name]
    with pytest.warns(DeprecationWarning, match=f"import it from {module}"):
        value = getattr(ckptscan, name)
    assert value is getattr(importlib.import_module(module), name)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        ckptscan.no_such_name  # noqa: B018 - the attribute access is what is tested


def test_importing_the_package_imports_no_torch():
    code = "import sys, ckptscan; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == \
        "False\n"
