"""Loss logs: JSON Lines and CSV, non-finite losses, divergence, pair losses."""

import json
import math

import pytest

from ckptscan.errors import CkptScanError
from ckptscan.inputs.loss_log import LossLog, divergence_step, read_loss_log


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def log_of(losses):
    return LossLog(None, list(range(len(losses))), [math.nan if v is None else v for v in losses])


def test_jsonl_with_null_loss_and_lr(tmp_path):
    path = write_jsonl(tmp_path / "log.jsonl", [
        {"step": 1, "loss": 2.0, "lr": 1e-3, "grad_norm": 1.0},
        {"step": 0, "loss": 3.0, "lr": 5e-4},
        {"step": 2, "loss": None, "lr": 1e-3},
    ])
    log = read_loss_log(path)
    assert log.steps == [0, 1, 2]
    assert log.losses[:2] == [3.0, 2.0] and math.isnan(log.losses[2])
    assert log.lrs == [5e-4, 1e-3, 1e-3]
    assert log.warmup_end() == 1


def test_csv_with_nan_and_without_lr(tmp_path):
    path = tmp_path / "log.csv"
    path.write_text("step,loss\n0,3.0\n1,nan\n2,\n3,1.5\n")
    log = read_loss_log(path)
    assert log.steps == [0, 1, 2, 3]
    assert [math.isnan(v) for v in log.losses] == [False, True, True, False]
    assert log.lrs is None and log.warmup_end() is None


def test_pair_loss_is_the_mean_of_the_updates_between_checkpoints():
    log = log_of([4.0, 3.0, 2.0, 1.0, None, 1.0])
    assert log.pair_loss(0, 2) == 3.5  # updates 0 and 1 turn checkpoint-0 into checkpoint-2
    assert log.pair_loss(2, 4) == 1.5
    assert log.pair_loss(4, 6) is None  # a non-finite loss inside
    assert log.pair_loss(10, 20) is None  # nothing logged
    assert log.pair_loss(None, 2) is None


def test_divergence_is_a_lasting_rise_above_the_best_smoothed_loss():
    falling = [3.0 - 0.01 * i for i in range(100)]  # best smoothed loss ≈ 2.0
    rising = [2.0 + 0.05 * i for i in range(1, 60)]
    steps = falling + rising
    step = divergence_step(log_of(steps), window=5, margin=0.5)
    # Brute force: the first t whose smoothed loss, and every later one, exceeds the running best + margin.
    smoothed = [sum(steps[max(0, i - 4): i + 1]) / len(steps[max(0, i - 4): i + 1]) for i in range(len(steps))]
    expected = next(t for t in range(len(steps) - 5)
                    if all(s > min(smoothed[: t + 1]) + 0.5 for s in smoothed[t:]))
    assert step == expected and 100 < step < 130


def test_the_last_window_of_a_log_cannot_diverge():
    losses = [2.0] * 100 + [5.0] * 4  # a rise in the last 4 logged steps: not yet "for good"
    assert divergence_step(log_of(losses), window=5, margin=0.5) is None
    assert divergence_step(log_of(losses + [5.0] * 5), window=5, margin=0.5) == 100


def test_a_spike_that_recovers_is_not_a_divergence():
    losses = [2.0] * 50 + [5.0] * 3 + [2.0] * 50
    assert divergence_step(log_of(losses), window=5, margin=0.5) is None


def test_a_nan_loss_diverges_for_good():
    losses = [2.0] * 50 + [None] * 20
    assert divergence_step(log_of(losses), window=5, margin=0.5) == 50


@pytest.mark.parametrize("name, text, message", [
    ("log.jsonl", "{not json}\n", "line 1: not JSON"),
    ("log.jsonl", '{"step": 1}\n', "needs 'step' and 'loss'"),
    ("log.jsonl", '{"step": "x", "loss": 1}\n', "not an integer"),
    ("log.jsonl", '{"step": 1, "loss": "high"}\n', "not a number"),
    ("log.jsonl", '{"step": 1, "loss": 1}\n{"step": 1, "loss": 2}\n', "logged twice"),
    ("log.jsonl", "", "no records"),
    ("log.csv", "step,value\n1,2\n", "lacks 'step' and 'loss'"),
])
def test_bad_logs_are_user_errors_naming_the_file(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(CkptScanError, match=message) as info:
        read_loss_log(path)
    assert str(path) in str(info.value)
