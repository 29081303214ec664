"""ckptscan.live.TrainerCallback in a real Hugging Face Trainer run (CPU):
live metrics equal `ckptscan trend` on the checkpoints the Trainer saved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from ckptscan.pipeline.api import scan  # noqa: E402
from ckptscan.detection.rules import Thresholds  # noqa: E402
from ckptscan.live import TrainerCallback  # noqa: E402
from ckptscan.document.plain import report_dict  # noqa: E402
from ckptscan.pipeline.run import resolve_run  # noqa: E402
from ckptscan.scan import ScanOptions  # noqa: E402
from live.helpers import assert_same, comparable, number_of_floats  # noqa: E402

EVERY = 4
STEPS = 40
VOCAB = 64


def tiny_mixtral() -> transformers.PreTrainedModel:
    config = transformers.MixtralConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=32)
    torch.manual_seed(0)
    return transformers.MixtralForCausalLM(config)


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n: int = 256, length: int = 16):
        self.ids = torch.randint(0, VOCAB, (n, length), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def run_trainer(out: Path, callback: TrainerCallback | None, attach: bool = False, **args) -> transformers.Trainer:
    settings = dict(max_steps=STEPS, per_device_train_batch_size=4, learning_rate=3e-3, save_strategy="steps",
                    save_steps=EVERY, logging_steps=EVERY, report_to=[], use_cpu=True, seed=0,
                    dataloader_num_workers=0, disable_tqdm=True)
    arguments = transformers.TrainingArguments(output_dir=str(out), **{**settings, **args})
    trainer = transformers.Trainer(model=tiny_mixtral(), args=arguments, train_dataset=RandomTokens(),
                                   callbacks=[callback] if callback is not None and not attach else None)
    if callback is not None and attach:
        callback.attach(trainer)
    trainer.train()
    return trainer


PROBE = {"input_ids": torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(1))}


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf")
    callback = TrainerCallback(every=EVERY, probe=PROBE, thresholds=Thresholds())
    trainer = run_trainer(out, callback, attach=True, report_to=["tensorboard"])
    return out, callback, trainer


def test_live_metrics_equal_trend_on_the_saved_checkpoints(hf_run):
    out, callback, _ = hf_run
    live = json.loads((out / "ckptscan" / "report.json").read_text())
    spec = resolve_run(out, probe=out / "ckptscan" / "probe.safetensors", loss_log=None, config=None)
    assert [c.step for c in spec.checkpoints] == list(range(EVERY, STEPS + 1, EVERY))
    offline = report_dict(scan(spec, ScanOptions(workers=1)))
    assert [(p["from_step"], p["to_step"]) for p in live["pairs"]] == \
        [(s, s + EVERY) for s in range(EVERY, STEPS, EVERY)]
    assert_same(comparable(live), comparable(offline))  # numbers to 1e-6, findings and verdict exactly
    assert number_of_floats(comparable(offline)) > 500
    assert offline["pairs"][-1]["layers"][1]["router"]["routing_entropy"] is not None
    # The Trainer's logged rates (trainer_state.json offline, its log live) give each pair its LR.
    assert all(pair["lr"] is not None for pair in offline["pairs"])


def test_the_metrics_reach_the_trainers_loggers(hf_run):
    """Through trainer.log: the log history and the TensorBoard integration.
    Each interval's metrics are logged once, at the step its background scan
    reported (from its own step, named by ckptscan/step, to the next
    monitored step, which waits for the scan)."""
    out, callback, trainer = hf_run
    name = "ckptscan/L0/delta2_entropy_norm"
    entries = [entry for entry in trainer.state.log_history if name in entry]
    by_interval = {entry["ckptscan/step"]: entry for entry in entries}
    assert len(by_interval) == len(entries) and sorted(by_interval) == list(range(2 * EVERY, STEPS + 1, EVERY))
    assert all(interval <= entry["step"] <= interval + EVERY for interval, entry in by_interval.items())
    report = json.loads((out / "ckptscan" / "report.json").read_text())
    assert {pair["to_step"]: pair["layers"][0]["attention"]["delta2_entropy_norm"] for pair in report["pairs"]} == \
        {interval: entry[name] for interval, entry in by_interval.items()}

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = [EventAccumulator(str(d)).Reload() for d in {p.parent for p in out.rglob("events.out.*")}]
    tag = "train/" + name  # the Trainer's TensorBoard integration files training logs under train/
    scalars = {(e.step, e.value) for acc in events if tag in acc.Tags()["scalars"] for e in acc.Scalars(tag)}
    # Two intervals may be logged at one trainer step (a scan that reports
    # late, under load, lands on the step of the next): compare the pairs.
    logged = sorted((entry["step"], entry[name]) for entry in entries)
    assert [step for step, _ in sorted(scalars)] == [step for step, _ in logged]
    assert [value for _, value in sorted(scalars)] == pytest.approx([value for _, value in logged])


def test_the_callback_leaves_training_bit_identical(tmp_path):
    short = dict(save_strategy="no", max_steps=12, logging_steps=1)
    plain = run_trainer(tmp_path / "plain", None, **short)
    callback = TrainerCallback(every=EVERY, probe=PROBE, thresholds=Thresholds())
    monitored = run_trainer(tmp_path / "live", callback, **short)
    losses = [[e["loss"] for e in t.state.log_history if "loss" in e] for t in (plain, monitored)]
    assert len(losses[0]) == 12 and losses[0] == losses[1]
    assert len(callback.monitor.report.pairs) == 2
    assert monitored.model.training  # train mode restored after the probe's forward


def test_stop_ends_training_at_the_alert(tmp_path):
    """A NaN written into a query projection at step 10 alerts on the interval
    ending at 12; with on_alert="stop" the Trainer stops when the background
    scan reports it: after step 12, by step 16 (whose snapshot waits for it)."""

    class Poison(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step == 10:
                with torch.no_grad():
                    model.model.layers[0].self_attn.q_proj.weight[0, 0] = float("nan")

    callback = TrainerCallback(every=EVERY, on_alert="stop", thresholds=Thresholds())
    arguments = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=STEPS, per_device_train_batch_size=4, save_strategy="no",
        report_to=[], use_cpu=True, disable_tqdm=True, logging_steps=1000)
    trainer = transformers.Trainer(model=tiny_mixtral(), args=arguments, train_dataset=RandomTokens(),
                                   callbacks=[Poison(), callback])
    trainer.train()
    assert 13 <= trainer.state.global_step <= 16
    assert callback.monitor.report.summary.first_alert_step["numeric"] == 12


def test_the_report_file_holds_every_pair_when_training_ends(tmp_path, monkeypatch):
    """The report file is written at spaced steps in long runs; the end of
    training writes the pairs not yet in it."""
    monkeypatch.setattr("ckptscan.live.monitor.REPORT_SPACING", 2)  # pairs 1, 2, 3, 4, 6 written as they come
    run_trainer(tmp_path, TrainerCallback(every=EVERY, thresholds=Thresholds()), max_steps=9 * EVERY,
                save_strategy="no")
    report = json.loads((tmp_path / "ckptscan" / "report.json").read_text())
    assert len(report["pairs"]) == 8 and report["pairs"][-1]["to_step"] == 9 * EVERY
