"""--model-config files and the configs frameworks store beside the weights,
read into config.json's names with where each came from."""

from __future__ import annotations

import json

import pytest

from ckptscan.errors import CkptScanError
from ckptscan.layouts.stated_config import framework_config, load_model_config, normalise
from ckptscan.readers.base import Checkpoint


def _values(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return dict(load_model_config(path).values)


def test_a_torchtitan_job_toml_names_a_flavour_whose_numbers_are_torchtitans(tmp_path):
    # llama3 8B in torchtitan 0.3.0 models/llama3/__init__.py: dim 4096, 32 layers, 32 heads, 8 KV heads.
    values = _values(tmp_path, "job.toml", '[job]\ndump_folder = "out"\n[model]\nname = "llama3"\nflavor = "8B"\n')
    assert (values["num_attention_heads"], values["num_key_value_heads"], values["hidden_size"],
            values["num_hidden_layers"]) == (32, 8, 4096, 32)
    with pytest.raises(CkptScanError, match="flavor 'tiny' is not in ckptscan's table"):
        _values(tmp_path, "other.toml", '[model]\nname = "llama3"\nflavor = "tiny"\n')
    with pytest.raises(CkptScanError, match="without a \\[model\\] table"):
        _values(tmp_path, "bad.toml", '[job]\nx = 1\n')


def test_litgpt_yaml_and_config_json_read_into_config_json_names(tmp_path):
    values = _values(tmp_path, "model_config.yaml", "n_head: 8\nn_query_groups: 2\nhead_size: 16\nn_embd: 128\n")
    assert (values["num_attention_heads"], values["num_key_value_heads"], values["head_dim"],
            values["hidden_size"]) == (8, 2, 16, 128)
    config = {"model_type": "qwen3", "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8}
    assert _values(tmp_path, "config.json", json.dumps(config)) == config


def test_a_file_stating_no_heads_is_refused_in_one_line(tmp_path):
    with pytest.raises(CkptScanError, match="no number of attention heads found"):
        _values(tmp_path, "config.json", json.dumps({"hidden_size": 64}))
    with pytest.raises(CkptScanError, match="cannot parse"):
        _values(tmp_path, "config.json", "{not json")
    with pytest.raises(CkptScanError, match="cannot read"):
        load_model_config(tmp_path / "missing.json")


def test_megatron_style_args_count_query_groups_only_with_gqa():
    assert "num_key_value_heads" not in normalise({"num_attention_heads": 8, "num_query_groups": 2})
    assert normalise({"num_attention_heads": 8, "num_query_groups": 2, "group_query_attention": True}
                     )["num_key_value_heads"] == 2


def test_lightning_hyper_parameters_are_searched_for_a_model_config():
    hparams = {"lr": 0.1, "model": {"config": {"num_attention_heads": 4, "num_key_value_heads": 2}}}
    checkpoint = Checkpoint(path=None, format="lightning", step=1, tensors=None, meta={"hyper_parameters": hparams})
    config = framework_config(checkpoint)
    assert config["num_attention_heads"] == 4 and config.source == "Lightning hyper_parameters.model.config"
    assert framework_config(Checkpoint(None, "lightning", 1, None, meta={"hyper_parameters": {"lr": 0.1}})) is None
