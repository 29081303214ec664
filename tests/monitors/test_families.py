"""The built-in families' monitors: where each monitor's value is read."""

from ckptscan.monitors import registry

from detection.helpers import layer_result


def test_each_monitor_reads_its_field_of_its_family():
    layer = layer_result(0, d2n=0.41, logit=7.5, eps=2.5, routing=0.7)
    assert registry.spec("delta2_entropy_norm").read(layer) == 0.41
    assert registry.spec("qk_logit_bound").read(layer) == 7.5
    assert registry.spec("epsilon").read(layer) == 2.5 and registry.spec("routing_entropy_norm").read(layer) == 0.7
    without_router = layer_result(0, router=False)
    assert registry.spec("epsilon").read(without_router) is None
    assert registry.spec("load_cv").read(without_router) is None
