"""The results' severity order."""

from ckptscan.results import worst


def test_worst_ranks_severities_and_ignores_other_statuses():
    assert worst(["ok", "warn", "info"]) == "warn"
    assert worst(["alert", "warn"]) == "alert"
    assert worst(["unchanged"]) == "ok" and worst([]) == "ok"
