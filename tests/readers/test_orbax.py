"""Orbax step folders read through tensorstore: scanned layers exposed per
layer, row reads, and broken folders as one clear error (on copies of the
golden run written by Orbax, tests/golden/orbax)."""

import shutil
from pathlib import Path

import pytest
import torch

from ckptscan.errors import CkptScanError
from ckptscan.readers import open_checkpoint

tensorstore = pytest.importorskip("tensorstore")
STEP = Path(__file__).resolve().parents[1] / "golden" / "orbax" / "checkpoints" / "4"
QUERY = "params.params.decoder.layers.self_attention.query.kernel"


def stored(key):
    spec = {"driver": "zarr", "kvstore": {"driver": "ocdbt", "base": (STEP / "items").resolve().as_uri() + "/"},
            "path": key}
    return torch.from_numpy(tensorstore.open(spec).result().read().result().copy())


def test_scanned_layers_are_exposed_per_layer_and_read_by_rows():
    checkpoint = open_checkpoint(STEP)
    assert (checkpoint.format, checkpoint.step, checkpoint.path) == ("orbax", 4, STEP)
    whole = stored(QUERY)  # [D, L, H, d]
    for layer in range(whole.shape[1]):
        name = QUERY.replace(".layers.", f".layers.{layer}.")
        assert checkpoint.tensors.shape(name) == (32, 4, 8) and checkpoint.tensors.dtype(name) == "F32"
        assert torch.equal(checkpoint.tensors.get(name), whole[:, layer])
        assert torch.equal(checkpoint.tensors.get(name, rows=(3, 7)), whole[3:7, layer])
    assert "params.params.token_embedder.embedding" in checkpoint.tensors.keys()  # not scanned: as stored


def test_a_broken_metadata_file_is_one_clear_error(tmp_path):
    step = shutil.copytree(STEP, tmp_path / "4")
    (step / "items" / "_METADATA").write_text("{not json")
    with pytest.raises(CkptScanError, match=r"_METADATA: invalid JSON"):
        open_checkpoint(step)


def test_missing_array_data_is_one_clear_error(tmp_path):
    step = shutil.copytree(STEP, tmp_path / "4")
    for data in (step / "items" / "ocdbt.process_0" / "d").iterdir():
        data.unlink()
    with pytest.raises(CkptScanError, match="cannot (open|read) the array"):
        checkpoint = open_checkpoint(step)
        checkpoint.tensors.get(QUERY.replace(".layers.", ".layers.0."))
