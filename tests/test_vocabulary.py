"""The words of the results: severity order, and where each monitor's value is read."""

from ckptscan.vocabulary import BY_NAME, worst

from detection.helpers import layer_result


def test_worst_ranks_severities_and_ignores_other_statuses():
    assert worst(["ok", "warn", "info"]) == "warn"
    assert worst(["alert", "warn"]) == "alert"
    assert worst(["unchanged"]) == "ok" and worst([]) == "ok"


def test_each_monitor_reads_its_field_of_its_family():
    layer = layer_result(0, d2n=0.41, logit=7.5, eps=2.5, routing=0.7)
    assert BY_NAME["delta2_entropy_norm"].read(layer) == 0.41
    assert BY_NAME["qk_logit_bound"].read(layer) == 7.5
    assert BY_NAME["epsilon"].read(layer) == 2.5 and BY_NAME["routing_entropy_norm"].read(layer) == 0.7
    without_router = layer_result(0, router=False)
    assert BY_NAME["epsilon"].read(without_router) is None and BY_NAME["load_cv"].read(without_router) is None


def test_a_count_takes_its_noun_in_the_plural_only_when_it_is_not_one():
    from ckptscan.vocabulary import counted

    assert [counted(n, "pair") for n in (0, 1, 2)] == ["0 pairs", "1 pair", "2 pairs"]
