"""`ckptscan.report.json`, the format's old home, kept until the next major
version of the JSON schema: each name it offered still works, is the one its
new module defines, and warns, naming where to import it from now."""

import importlib
import warnings

import pytest

import ckptscan
from ckptscan.report import json as old

OFFERED = ["COMPACT_RESULTS", "PER_HEAD", "check_per_head", "compact", "keeps_heads", "plain", "plain_pair",
           "report_dict", "report_json", "sweep_dict", "sweep_message", "write_json", "write_sweep_json"]


@pytest.mark.parametrize("name", OFFERED)
def test_every_name_it_offered_warns_and_is_the_moved_one(name):
    with pytest.warns(DeprecationWarning, match=rf"ckptscan\.report\.json\.{name} is deprecated: use ckptscan\."):
        value = getattr(old, name)
    home = next(module for module in ("plain", "writing", "sweep")
                if hasattr(importlib.import_module(f"ckptscan.document.{module}"), name))
    assert value is getattr(importlib.import_module(f"ckptscan.document.{home}"), name)
    assert sorted(old.__all__) == OFFERED


def test_the_documented_import_of_write_json_names_the_public_one(tmp_path, reports):
    with pytest.warns(DeprecationWarning, match=r"use ckptscan\.write_json \(ckptscan\.report\.json is removed"):
        from ckptscan.report.json import write_json
    assert write_json is ckptscan.write_json
    write_json(reports["healthy"], tmp_path / "old.json")
    ckptscan.write_json(reports["healthy"], tmp_path / "new.json")
    assert (tmp_path / "old.json").read_bytes() == (tmp_path / "new.json").read_bytes()


def test_an_unknown_name_is_an_attribute_error_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AttributeError, match="no attribute 'dumps'"):
            old.dumps  # noqa: B018  (json's own names were never this module's)
