"""ckptscan.live.LightningCallback in real Lightning runs (CPU)."""

from __future__ import annotations

import csv
import json

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")

from ckptscan.detection.rules import Thresholds  # noqa: E402
from ckptscan.live import LightningCallback  # noqa: E402
from experiments.model import MixtralForCausalLM  # noqa: E402
from live.helpers import tiny_config  # noqa: E402

EVERY = 3


class TinyLM(pl.LightningModule):
    """The experiments' tiny Mixtral under `self.model`: state_dict names gain a `model.` prefix."""

    def __init__(self, poison_at: int | None = None):
        super().__init__()
        torch.manual_seed(0)
        self.model = MixtralForCausalLM(tiny_config())
        self.config = self.model.cfg.to_hf("float32")
        self.poison_at = poison_at

    def forward(self, x):  # what the probe batch goes through
        return self.model(x)

    def training_step(self, batch, batch_idx):
        (x,) = batch
        logits, _, _ = self.model(x)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 256), x[:, 1:].reshape(-1))
        self.log("loss", loss)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self.global_step == self.poison_at:
            with torch.no_grad():
                self.model.model.layers[0].self_attn.q_proj.weight[0, 0] = float("nan")

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


def fit(root, steps, callback=None, poison_at=None):
    data = torch.utils.data.TensorDataset(torch.randint(0, 256, (64, 32), generator=torch.Generator().manual_seed(0)))
    losses = []

    class Record(pl.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            losses.append(outputs["loss"].item())

    trainer = pl.Trainer(max_steps=steps, accelerator="cpu", devices=1, default_root_dir=str(root),
                         logger=pl.loggers.CSVLogger(str(root)), enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1,
                         callbacks=[Record()] + ([callback] if callback is not None else []))
    module = TinyLM(poison_at)
    torch.manual_seed(0)
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=4, shuffle=True))
    return trainer, losses


def test_the_callback_leaves_training_bit_identical_and_logs_its_metrics(tmp_path):
    _, plain = fit(tmp_path / "plain", 12)
    callback = LightningCallback(every=EVERY, probe=torch.randint(0, 256, (1, 32)), thresholds=Thresholds())
    trainer, monitored = fit(tmp_path / "live", 12, callback)
    assert monitored == plain and len(plain) == 12
    report = json.loads((tmp_path / "live" / "ckptscan" / "report.json").read_text())
    assert [(p["from_step"], p["to_step"]) for p in report["pairs"]] == [(3, 6), (6, 9), (9, 12)]
    # The trainer's logger (CSV here) has the metrics at the monitored steps.
    rows = list(csv.DictReader(open(trainer.logger.experiment.metrics_file_path)))
    name = "ckptscan/L1/delta2_entropy_norm"
    logged = {int(r["step"]): float(r[name]) for r in rows if r.get(name)}
    assert logged == {p["to_step"]: pytest.approx(p["layers"][1]["attention"]["delta2_entropy_norm"], rel=1e-6)
                      for p in report["pairs"]}


def test_stop_and_save_at_an_alert_when_scanning_in_the_step(tmp_path):
    """background=False: the NaN at step 7 alerts on the interval 6 → 9, acted on at step 9."""
    callback = LightningCallback(every=EVERY, on_alert="stop", thresholds=Thresholds(), background=False)
    trainer, _ = fit(tmp_path / "stop", 30, callback, poison_at=7)
    assert trainer.global_step == 9
    save = LightningCallback(every=EVERY, on_alert="save", thresholds=Thresholds(), background=False)
    fit(tmp_path / "save", 12, save, poison_at=7)
    assert sorted(p.name for p in (tmp_path / "save" / "ckptscan").glob("*.ckpt")) == [
        "alert-step-12.ckpt", "alert-step-9.ckpt"]


def test_stop_and_save_when_the_background_scan_reports(tmp_path):
    """The interval 6 → 9 alerts; its scan reports after step 9, by step 12
    (whose snapshot waits for it): training stops there. "save" saves the
    model at the step it is acted on, and the last interval's alert (9 → 12,
    reported as training ends) still saves the final model."""
    callback = LightningCallback(every=EVERY, on_alert="stop", thresholds=Thresholds())
    trainer, _ = fit(tmp_path / "stop", 30, callback, poison_at=7)
    assert 10 <= trainer.global_step <= 12
    assert callback.monitor.report.summary.first_alert_step["numeric"] == 9
    save = LightningCallback(every=EVERY, on_alert="save", thresholds=Thresholds())
    fit(tmp_path / "save", 12, save, poison_at=7)
    steps = sorted(int(p.stem.rsplit("-", 1)[1]) for p in (tmp_path / "save" / "ckptscan").glob("*.ckpt"))
    assert steps[-1] == 12 and all(10 <= step <= 12 for step in steps)


def test_the_report_file_holds_every_pair_when_training_ends(tmp_path, monkeypatch):
    """The report file is written at spaced steps in long runs; the end of
    training writes the pairs not yet in it."""
    monkeypatch.setattr("ckptscan.live.monitor.REPORT_SPACING", 2)  # pairs 1, 2, 3, 4, 6 written as they come
    callback = LightningCallback(every=EVERY, thresholds=Thresholds())
    fit(tmp_path, 8 * EVERY + EVERY, callback)
    report = json.loads((tmp_path / "ckptscan" / "report.json").read_text())
    assert len(report["pairs"]) == 8 and report["pairs"][-1]["to_step"] == 9 * EVERY
