"""Detection judges every monitor the vocabulary names, in its order, on the
alarm side and scale the reports draw it on."""

from ckptscan import vocabulary
from ckptscan.detection.catalog import MONITORS

from detection.helpers import layer_result


def test_every_monitor_of_the_vocabulary_is_judged_in_its_order():
    assert [m.name for m in MONITORS] == [m.name for m in vocabulary.MONITORS]


def test_a_judged_monitor_keeps_the_vocabulary_words_side_scale_and_reader():
    layer = layer_result(0)
    for judged, info in zip(MONITORS, vocabulary.MONITORS):
        assert (judged.family, judged.label, judged.spec.bad, judged.spec.log) == (info.family, info.label, info.bad,
                                                                                  info.log)
        assert judged.read(layer) == info.read(layer)
