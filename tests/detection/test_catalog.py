"""Detection judges every judged monitor of the registry, in its order, on
the alarm side and scale the reports draw it on."""

from ckptscan.detection.catalog import judged_monitors
from ckptscan.monitors import registry

from detection.helpers import layer_result


def test_every_judged_monitor_of_the_registry_is_judged_in_its_order():
    assert [m.name for m in judged_monitors()] == [m.name for m in registry.judged()]


def test_a_judged_monitor_keeps_the_registry_words_side_scale_and_reader():
    layer = layer_result(0)
    for judged, info in zip(judged_monitors(), registry.judged()):
        assert (judged.family, judged.label, judged.spec.bad, judged.spec.log) == (info.family, info.label, info.bad,
                                                                                  info.log)
        assert judged.read(layer) == info.read(layer)
