import sys
from pathlib import Path

import pytest

# Tests import the shared checkpoint writers as `factories`.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def not_in_github_actions(monkeypatch):
    """Tests that run inside GitHub Actions see the same CLI output as
    anywhere else: annotations are printed only where a test asks for them."""
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
