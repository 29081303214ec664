"""The registry of formats: every path is opened by the first registered
format that recognises it, in the precedence ckptscan has always had, and a
new format is one `Format` and one line in `FORMATS`."""

from pathlib import Path

import pytest
import torch

from ckptscan.errors import CkptScanError
from ckptscan.readers import Checkpoint, Format, formats, open_checkpoint

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


def test_every_format_has_a_name_an_opener_and_a_recogniser():
    names = [known.name for known in formats.FORMATS]
    assert len(set(names)) == len(names) and all(names)
    for known in formats.FORMATS:
        assert callable(known.open), known.name
        assert known.in_file is not None or known.in_folder is not None, known.name
        assert not known.nests or known.in_folder is not None, known.name


def test_the_registry_order_is_the_precedence():
    assert [known.name for known in formats.FORMATS] == [
        "safetensors-index", "safetensors-file", "safetensors-shards", "torch-index", "dcp", "megatron-legacy",
        "deepspeed", "torch-pickle", "orbax"]


# One marker of each format a folder can hold, in precedence order: each
# step removes the winner's marker and the next format in line wins.
FOLDER_MARKERS = [
    ("safetensors-index", "model.safetensors.index.json"),
    ("safetensors-shards", "model.safetensors"),
    ("torch-index", "pytorch_model.bin.index.json"),
    ("dcp", ".metadata"),
    ("megatron-legacy", "mp_rank_00/model_optim_rng.pt"),
    ("deepspeed", "mp_rank_00_model_states.pt"),
    ("torch-pickle", "pytorch_model.bin"),
    ("orbax", "_METADATA"),
]


def test_in_a_folder_holding_every_format_each_wins_over_those_after_it(tmp_path):
    for _, marker in FOLDER_MARKERS:
        (tmp_path / marker).parent.mkdir(exist_ok=True)
        (tmp_path / marker).touch()
    (tmp_path / "manifest.ocdbt").touch()  # an Orbax item is _METADATA beside an OCDBT manifest
    for name, marker in FOLDER_MARKERS:
        known, _ = formats.recognise(tmp_path, folder=True)
        assert known.name == name
        (tmp_path / marker).unlink()
    assert formats.recognise(tmp_path, folder=True) is None


def test_a_megatron_rank_file_is_its_iteration_not_a_plain_pickle(tmp_path):
    rank_file = tmp_path / "iter_0000010" / "mp_rank_00" / "model_optim_rng.pt"
    rank_file.parent.mkdir(parents=True)
    rank_file.touch()
    known, target = formats.recognise(rank_file, folder=False)
    assert (known.name, target) == ("megatron-legacy", tmp_path / "iter_0000010")
    elsewhere = tmp_path / "model_optim_rng.pt"
    elsewhere.touch()
    assert formats.recognise(elsewhere, folder=False)[0].name == "torch-pickle"


# Paths of the golden runs written by the real frameworks (tests/golden): the
# format that recognises each, and the checkpoint format and step it opens as
# (the same as before the registry).
GOLDEN_PATHS = [
    ("accelerate/step_dirs/step_3", "safetensors-shards", "safetensors", 3),
    ("accelerate/step_dirs/step_3/model.safetensors", "safetensors-file", "safetensors", 3),
    ("accelerate/automatic/checkpoints/checkpoint_0", "safetensors-shards", "safetensors", 3),
    ("accelerate/automatic/checkpoints/checkpoint_0/optimizer.bin", "torch-pickle", None, None),
    ("deepspeed/with_args/global_step2", "deepspeed", "deepspeed", 2),
    ("deepspeed/with_args/global_step2/mp_rank_00_model_states.pt", "torch-pickle", "deepspeed", 2),
    ("lightning/lightning_logs/version_0/checkpoints/last.ckpt", "torch-pickle", "lightning", 6),
    ("litgpt/step-00000002", "torch-pickle", "litgpt", 2),
    ("litgpt/final/lit_model.pth", "torch-pickle", "litgpt", 4),
    ("torchtitan/checkpoint/step-4", "dcp", "dcp", 4),
    ("torchtitan/checkpoint/step-4/.metadata", "dcp", "dcp", 4),
    ("orbax/checkpoints/2", "orbax", "orbax", 2),
    ("orbax/checkpoints/2/items", "orbax", "orbax", 2),
]


@pytest.mark.parametrize("relative, recognised_as, opened_as, step", GOLDEN_PATHS)
def test_golden_checkpoints_are_recognised_as_before(relative, recognised_as, opened_as, step):
    path = GOLDEN / relative
    known, _ = formats.recognise(path, folder=path.is_dir())
    assert known.name == recognised_as
    if opened_as == "orbax":
        pytest.importorskip("tensorstore")
    if opened_as is None:  # an optimizer state, recognised by its suffix: no model inside
        with pytest.raises(CkptScanError, match="no tensors found in this torch checkpoint"):
            open_checkpoint(path)
        return
    checkpoint = open_checkpoint(path)
    assert (checkpoint.format, checkpoint.step) == (opened_as, step)


@pytest.mark.parametrize("relative, inside", [("deepspeed/plain", "global_step2, global_step4"),
                                              ("torchtitan/checkpoint", "step-2, step-4")])
def test_a_run_folder_is_not_a_checkpoint_but_names_those_inside(relative, inside):
    with pytest.raises(CkptScanError, match=f"several checkpoints inside \\({inside}\\); open one of them"):
        open_checkpoint(GOLDEN / relative)


class OneTensorSource:
    def __init__(self, value: float):
        self.value = value

    def keys(self) -> list[str]:
        return ["w"]

    def shape(self, name: str) -> tuple[int, ...]:
        return (1,)

    def dtype(self, name: str) -> str:
        return "F32"

    def get(self, name: str, rows: tuple[int, int] | None = None) -> torch.Tensor:
        return torch.tensor([self.value])


def _open_scalar(path: Path) -> Checkpoint:
    return Checkpoint(path, "scalar", None, OneTensorSource(float(path.read_text())), meta={"step": 7})


SCALAR = Format("scalar", _open_scalar, in_file=lambda path: path if path.suffix == ".scalar" else None,
                in_folder=lambda folder: min(folder.glob("*.scalar"), default=None))


def test_a_new_format_is_one_registry_line(tmp_path, monkeypatch):
    monkeypatch.setattr(formats, "FORMATS", [*formats.FORMATS, SCALAR])
    step = tmp_path / "checkpoint-5"
    step.mkdir()
    (step / "w.scalar").write_text("2.5")
    for path in (step, step / "w.scalar"):
        checkpoint = open_checkpoint(path)
        # The registered opener read it; the step it records wins over the name, as for every format.
        assert (checkpoint.format, checkpoint.path, checkpoint.step) == ("scalar", path, 7)
        assert checkpoint.tensors.get("w").item() == 2.5


def test_an_unregistered_file_names_the_formats_expected(tmp_path):
    path = tmp_path / "w.scalar"
    path.write_text("2.5")
    with pytest.raises(CkptScanError, match="unsupported checkpoint file; expected \\*.safetensors"):
        open_checkpoint(path)
