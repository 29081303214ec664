"""A Hugging Face Trainer's logged learning rates (trainer_state.json) as the
pairs' LR, and where they stand against a loss log and a saved scheduler."""

import json

import numpy as np
import pytest
from factories import llama_config, llama_tensors, write_hf_checkpoint

from ckptscan.errors import CkptScanError
from ckptscan.pipeline.metrics import compute, stated_lr
from ckptscan.readers.base import Checkpoint
from ckptscan.readers.opening import open_checkpoint
from ckptscan.readers.trainer_state import read_lr_history
from ckptscan.schema.results import PairResult
from ckptscan.pipeline.run import resolve_run
from ckptscan.scan import ScanOptions

CONFIG = llama_config(layers=1)
STEPS = (0, 10, 20)
LOGGING_STEPS = 2


def trainer_state(step, rates, evaluate=True):
    """The file as transformers' TrainerState.save_to_json writes it: one
    entry per logging step up to `step`, eval entries (no learning_rate) between."""
    history = []
    for s in range(LOGGING_STEPS, step + 1, LOGGING_STEPS):
        history.append({"epoch": s / 100, "grad_norm": 1.0, "learning_rate": rates[s], "loss": 3.0, "step": s})
        if evaluate and s % 10 == 0:
            history.append({"epoch": s / 100, "eval_loss": 2.9, "eval_runtime": 1.0, "step": s})
    return {"best_metric": None, "epoch": step / 100, "global_step": step, "log_history": history,
            "logging_steps": LOGGING_STEPS, "max_steps": 20, "train_batch_size": 8}


@pytest.fixture
def rates():
    return np.random.default_rng(0).uniform(1e-4, 1e-3, size=STEPS[-1] + 1)


@pytest.fixture
def run(tmp_path, rates):
    for step in STEPS:
        folder = write_hf_checkpoint(tmp_path / f"checkpoint-{step}", llama_tensors(CONFIG, step + 1), CONFIG)
        (folder / "trainer_state.json").write_text(json.dumps(trainer_state(step, rates), indent=2))
    return tmp_path


def expected(rates, a, b):
    """The mean of the rates logged at steps a < s ≤ b (entry s: the rate
    update s used, the one that made step s), float64."""
    logged = [s for s in range(LOGGING_STEPS, STEPS[-1] + 1, LOGGING_STEPS) if a < s <= b]
    return float(np.mean(rates[logged]))


def test_the_logged_rates_are_read_in_step_order_without_the_evaluations(run, rates):
    history = read_lr_history(run / "checkpoint-20")
    assert [s for s, _ in history] == list(range(2, 21, 2))
    assert [lr for _, lr in history] == [float(rates[s]) for s in range(2, 21, 2)]
    assert read_lr_history(run / "checkpoint-0") is None  # nothing logged yet
    assert open_checkpoint(run / "checkpoint-20").meta["lr_history"] == history


def test_each_pair_gets_the_mean_rate_of_its_own_updates(run, rates):
    metrics = compute(resolve_run(run, loss_log=None), ScanOptions())
    assert [(p.from_step, p.to_step) for p in metrics.pairs] == [(0, 10), (10, 20)]
    for pair in metrics.pairs:
        assert pair.lr == pytest.approx(expected(rates, pair.from_step, pair.to_step), rel=1e-12)


def test_a_loss_log_wins_over_the_trainer_state(run, rates):
    log = run / "train_log.jsonl"
    log.write_text("".join(json.dumps({"step": s, "loss": 3.0, "lr": 0.5}) + "\n" for s in range(20)))
    metrics = compute(resolve_run(run, loss_log=log), ScanOptions())
    assert [p.lr for p in metrics.pairs] == [0.5, 0.5]


def test_the_trainer_state_wins_over_a_saved_scheduler_rate(tmp_path):
    """The newer checkpoint's history holds the very updates between the two;
    an older checkpoint's scheduler rate only the interval's first."""
    older = Checkpoint(tmp_path, "t", 0, None, meta={"lr": 9.0})  # type: ignore[arg-type]
    newer = Checkpoint(tmp_path, "t", 4, None, meta={"lr_history": [(0, 1.0), (2, 3.0), (4, 7.0)]})  # type: ignore[arg-type]
    pair = PairResult(0, 4, [])
    stated_lr(pair, older, newer)
    assert pair.lr == 5.0  # updates 2 and 4: the ones between step 0 and step 4
    unlogged = PairResult(0, 4, [])
    stated_lr(unlogged, older, Checkpoint(tmp_path, "t", 4, None))  # type: ignore[arg-type]
    assert unlogged.lr == 9.0


@pytest.mark.parametrize("history, complaint", [
    ("nope", "'log_history' is str, expected a list"),
    ([{"step": "2", "learning_rate": 1e-3}], "log_history[0]: step '2' is not an integer"),
    ([{"step": 2, "learning_rate": "high"}], "log_history[0]: learning_rate 'high' is not a finite rate ≥ 0"),
    ([{"step": 2, "learning_rate": float("nan")}], "learning_rate nan is not a finite rate"),
])
def test_a_malformed_history_is_one_line_naming_the_file(run, history, complaint):
    path = run / "checkpoint-10" / "trainer_state.json"
    path.write_text(json.dumps({"log_history": history}))
    with pytest.raises(CkptScanError) as error:
        open_checkpoint(run / "checkpoint-10")
    assert complaint in str(error.value) and str(path) in str(error.value) and "\n" not in str(error.value)
