"""No module or folder of ckptscan is named like a standard-library module:
such a name shadows the library's own for a script run from inside the
folder, and tools that resolve imports by name draw arrows, even circles,
that the code does not have (`import json` in a module beside a json.py)."""

import sys
from pathlib import Path

import ckptscan

PACKAGE = Path(ckptscan.__file__).parent
# The ones named so, each with why: a stale entry fails as surely as a new name.
KNOWN = {
    "report/json.py": "the deprecated shim of the format's old home, ckptscan.report.json (docs/python-api.md), "
                      "removed at the next major version of the JSON schema",
}


def test_no_module_is_named_like_a_standard_library_module():
    named = [p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*")
             if "__pycache__" not in p.parts and (p.is_dir() or p.suffix == ".py")
             and (p.stem if p.is_dir() or p.stem != "__init__" else p.parent.name) in sys.stdlib_module_names]
    assert sorted(named) == sorted(KNOWN)
