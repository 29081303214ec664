"""`ckptscan.schema.load`, where reading a report lived, kept until the next
major version of the JSON schema: each name still works, is the one
`ckptscan.document.reading` defines, and warns, naming it."""

import warnings

import pytest

from ckptscan.document import reading
from ckptscan.schema import load as old


@pytest.mark.parametrize("name", ["GZIP_MAGIC", "READS", "REQUIRED", "as_json_values", "check_report", "load_report",
                                  "read_json_file", "read_report", "report_from_dict"])
def test_every_name_warns_and_is_the_moved_one(name):
    with pytest.warns(DeprecationWarning, match=rf"ckptscan\.schema\.load\.{name} is deprecated: "
                                                rf"use ckptscan\.document\.reading\.{name} "):
        assert getattr(old, name) is getattr(reading, name)


def test_an_unknown_name_is_an_attribute_error_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AttributeError, match="no attribute 'json'"):
            old.json  # noqa: B018
