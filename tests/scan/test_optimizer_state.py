"""Adam's second moments read from a real torch DCP save of a real AdamW
(`get_optimizer_state_dict`, flattened, beside the model as torchtitan saves
it): the share of each layer's W_q/W_k parameters with v < ε², against the
optimizer's own state in memory; only those moments are read; a layer whose
history decayed warns; a checkpoint without the state is not judged."""

import json

import numpy as np
import pytest
import torch
from format_writers import write_dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict
from transformers import LlamaConfig, LlamaForCausalLM

from ckptscan import scan_pair, scan_run
from ckptscan.errors import CkptScanError
from ckptscan.readers.opening import open_checkpoint
from ckptscan.readers.optimizer_state import NONE_SAVED, NOT_BY_NAME, unread_reason
from ckptscan.scan import ScanOptions

EPS = 1e-8
LAYERS = 2
PROJECTIONS = ("q_proj", "k_proj")


def config():
    return LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=64, max_position_embeddings=32, tie_word_embeddings=False)


def train(steps, quiet_layer=None, beta2=0.95, seed=0):
    """Real AdamW steps on random tokens; `quiet_layer`'s W_q and W_k get
    zero gradients after the first step, so their v decays by β₂ a step."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, beta2), eps=EPS)
    gen = torch.Generator().manual_seed(seed)
    for step in range(steps):
        x = torch.randint(0, 64, (4, 16), generator=gen)
        model(input_ids=x, labels=x).loss.backward()
        if quiet_layer is not None and step > 0:
            for name in PROJECTIONS:
                getattr(model.model.layers[quiet_layer].self_attn, name).weight.grad.zero_()
        opt.step()
        opt.zero_grad(set_to_none=False)
    return model, opt


def save(directory, model, opt, optimizer=True):
    state = {"model": get_model_state_dict(model)}
    if optimizer:
        state["optimizer"] = get_optimizer_state_dict(model, opt, options=StateDictOptions(
            flatten_optimizer_state_dict=True))
    write_dcp(directory, state)
    (directory / "config.json").write_text(json.dumps(config().to_dict()))
    return directory


def brute_force_share(model, opt, layer):
    """Over the layer's W_q and W_k: the fraction of v < ε², float64 numpy."""
    v = [opt.state[getattr(model.model.layers[layer].self_attn, n).weight]["exp_avg_sq"].double().numpy()
         for n in PROJECTIONS]
    return float(sum((x < EPS ** 2).sum() for x in v) / sum(x.size for x in v))


@pytest.fixture
def run(tmp_path):
    """step-2 healthy; step-80: layer 1's projections quiet since step 1, β₂ 0.5."""
    healthy = train(2)
    quiet = train(80, quiet_layer=1, beta2=0.5)
    save(tmp_path / "step-2", *healthy)
    save(tmp_path / "step-80", *quiet)
    return tmp_path, quiet


def test_the_decayed_share_is_the_optimizers_own_and_only_those_moments_are_read(run, monkeypatch):
    path, (model, opt) = run
    read: list[str] = []
    original = FileSystemReader.read_data

    def recording(self, plan, planner):
        read.extend(item.storage_index.fqn for item in plan.items)
        return original(self, plan, planner)

    monkeypatch.setattr(FileSystemReader, "read_data", recording)
    report = scan_run(path, ScanOptions(), config=None, loss_log=None)
    (pair,) = report.pairs
    expected = [brute_force_share(model, opt, layer) for layer in range(LAYERS)]
    assert expected[0] == 0.0 and expected[1] == 1.0  # the healthy layer and the quiet one
    assert [layer.families["optimizer"]["v_below_eps2"] for layer in pair.layers] == expected
    assert "optimizer_state" not in report.settings
    optimizer_reads = {key for key in read if key.startswith("optimizer.")}
    wanted = {f"optimizer.{part}.model.layers.{i}.self_attn.{n}.weight.{leaf}" for i in range(LAYERS)
              for n in PROJECTIONS for part, leaf in (("state", "exp_avg_sq"), ("param_groups", "eps"))}
    assert optimizer_reads == wanted  # never exp_avg, a step counter, or another parameter's state
    assert not [f for layer in pair.layers for f in layer.findings if f.family == "optimizer"]  # a run's warm-up
    (judged,) = scan_pair(path / "step-2", path / "step-80", ScanOptions(), config=None).pairs  # a diff judges it
    warned = [(layer.layer, f) for layer in judged.layers for f in layer.findings if f.family == "optimizer"]
    assert [(layer, f.severity) for layer, f in warned] == [(1, "warn")]
    warned = [f for _, f in warned]
    assert "100% of the layer's W_q/W_k parameters have an Adam second moment below ε² at step 80" in warned[0].message


def test_without_optimizer_state_nothing_is_judged_and_the_reason_is_one_line(tmp_path):
    for step, seed in ((2, 0), (4, 1)):
        save(tmp_path / f"step-{step}", *train(2, seed=seed), optimizer=False)
    report = scan_run(tmp_path, ScanOptions(), config=None, loss_log=None)
    assert all("optimizer" not in layer.families for pair in report.pairs for layer in pair.layers)
    assert not [f for pair in report.pairs for layer in pair.layers for f in layer.findings if f.family == "optimizer"]
    assert report.settings["optimizer_state"] == NONE_SAVED  # said once, for the report
    checkpoint = open_checkpoint(tmp_path / "step-4")
    assert unread_reason(checkpoint) == NONE_SAVED
    (tmp_path / "step-4" / "optimizer.pt").write_bytes(b"")  # an HF Trainer's, keyed by position
    assert unread_reason(checkpoint) == NOT_BY_NAME == "not read: optimizer.pt indexes parameters by position"


def test_a_corrupt_moment_is_one_line_naming_it(run):
    path, (model, opt) = run
    bad = path / "bad-step-80"
    opt.state[model.model.layers[0].self_attn.q_proj.weight]["exp_avg_sq"][0, 0] = -1.0
    save(bad, model, opt)
    from ckptscan.readers.optimizer_state import second_moment

    with pytest.raises(CkptScanError) as error:
        second_moment(open_checkpoint(bad), "model.layers.0.self_attn.q_proj.weight")
    message = str(error.value)
    assert "optimizer.state.model.layers.0.self_attn.q_proj.weight.exp_avg_sq" in message and str(bad) in message
    assert "negative or non-finite" in message and "\n" not in message
    assert np.isfinite(brute_force_share(model, opt, 1))
