"""The trainer's learning-rate schedules, by hand."""

import argparse
import math

import pytest

from experiments.train import lr_at


def args(schedule: str) -> argparse.Namespace:
    return argparse.Namespace(lr=1e-3, warmup=100, steps=1000, min_lr_ratio=0.1, schedule=schedule,
                              decay_fraction=0.2)


@pytest.mark.parametrize("schedule", ["constant", "cosine", "wsd"])
def test_linear_warmup_then_peak(schedule):
    assert lr_at(0, args(schedule)) == pytest.approx(1e-5)
    assert lr_at(99, args(schedule)) == pytest.approx(1e-3)
    assert lr_at(100, args(schedule)) == pytest.approx(1e-3)


def test_constant_stays_at_the_peak():
    assert lr_at(999, args("constant")) == 1e-3


def test_cosine_halfway_and_floor():
    assert lr_at(550, args("cosine")) == pytest.approx(1e-4 + 0.5 * 9e-4 * (1 + math.cos(math.pi / 2)))
    assert lr_at(1000, args("cosine")) == pytest.approx(1e-4)


def test_wsd_is_stable_then_decays_linearly_over_the_last_fifth():
    a = args("wsd")
    assert lr_at(799, a) == 1e-3
    assert lr_at(800, a) == pytest.approx(1e-3)
    assert lr_at(900, a) == pytest.approx(1e-3 - 9e-4 * 0.5)
    assert lr_at(1000, a) == pytest.approx(1e-4)
