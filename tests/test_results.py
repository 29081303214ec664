"""The results' severity order."""

from ckptscan.schema.results import counted, worst


def test_worst_ranks_severities_and_ignores_other_statuses():
    assert worst(["ok", "warn", "info"]) == "warn"
    assert worst(["alert", "warn"]) == "alert"
    assert worst(["unchanged"]) == "ok" and worst([]) == "ok"


def test_a_count_takes_its_noun_in_the_plural_only_when_it_is_not_one():
    assert [counted(n, "pair") for n in (0, 1, 2)] == ["0 pairs", "1 pair", "2 pairs"]
