import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests draw the same examples on every run (`derandomize`): a test
# that passed on a commit passes on it again, so CI never fails at random
# (a fresh random seed once found a threshold overflowing exp, now an
# @example). To search new examples: HYPOTHESIS_PROFILE=explore make test.
settings.register_profile("repeatable", derandomize=True, database=None)
settings.register_profile("explore")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))

# Tests import the shared checkpoint writers as `factories`.
sys.path.insert(0, str(Path(__file__).parent))

# Output is piped in every test, as in CI. pytest-xdist's workers set
# COLUMNS=80 and LINES=24, which would wrap the tables of every test that
# does not choose a width itself (those set COLUMNS with monkeypatch).
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)


@pytest.fixture(autouse=True)
def not_in_github_actions(monkeypatch):
    """Tests that run inside GitHub Actions see the same CLI output as
    anywhere else: annotations are printed only where a test asks for them."""
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)


# Under `pytest -n 2 --dist loadgroup` (make test) each group runs on one
# worker: a module's tests stay together (its module fixtures are built
# once), and so do the tests sharing an expensive session fixture: the
# object-store servers, the local Ray cluster, the scanned report runs and
# the documentation's warmed sample runs.
SHARED_SESSION_GROUPS = {
    "storage/": "object-store-servers",
    "executors/test_ray": "ray-cluster",
    "report/": "report-runs",
    "document/": "report-runs",
    "docs/test_examples.py": "docs-examples",
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    tests_dir = Path(__file__).parent
    for item in items:
        path = Path(str(item.fspath)).relative_to(tests_dir).as_posix()
        group = next((name for prefix, name in SHARED_SESSION_GROUPS.items() if path.startswith(prefix)), path)
        item.add_marker(pytest.mark.xdist_group(group))
