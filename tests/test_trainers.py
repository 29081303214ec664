"""The resume plan in the trainer's own words: the framework is named by its
own folder naming, and each argument is one the framework defines. Where the
test extra installs the framework (transformers), its own parser reads them."""

import inspect

import pytest

from ckptscan.trainers import FRAMEWORK_NAMES, SOURCES, framework_of, trainer_plan


@pytest.mark.parametrize("path, framework", [
    ("out/checkpoint-1300", "hf_trainer"),
    ("save/iter_0001300", "megatron"),
    ("dump/checkpoint/step-1300", "torchtitan"),
    ("save/step1300", "olmo_core"),
    ("base/run/checkpoints/1300", "maxtext"),
])
def test_each_frameworks_folder_naming_names_it(path, framework):
    assert framework_of(path)[0] == framework
    plan = trainer_plan(path, 1300, (1301, 1400))
    assert plan["framework"] == FRAMEWORK_NAMES[framework] and plan["source"] == SOURCES[framework]


@pytest.mark.parametrize("path", ["run/model.safetensors", "runs/checkpoint_3", "out/step-00001300",
                                  "save/iter_1300", "out/epoch=1-step=1300.ckpt"])
def test_a_naming_no_framework_owns_names_none_and_the_plan_stays_generic(path):
    """Accelerate's checkpoint_K counts saves, litgpt pads step-NNNNNNNN, Megatron pads to 7 digits."""
    assert framework_of(path) is None and trainer_plan(path, 1300, None) is None


def test_the_hugging_face_arguments_are_read_by_transformers_own_parser():
    transformers = pytest.importorskip("transformers")
    plan = trainer_plan("out/checkpoint-1300", 1300, (1301, 1400))
    flag, call = plan["arguments"]
    (args,) = transformers.HfArgumentParser(transformers.TrainingArguments).parse_args_into_dataclasses(
        ["--output_dir", "out", *flag.split(" ")])
    assert args.resume_from_checkpoint == "out/checkpoint-1300"
    assert call == 'trainer.train(resume_from_checkpoint="out/checkpoint-1300")'
    assert "resume_from_checkpoint" in inspect.signature(transformers.Trainer.train).parameters
    assert "ignore_data_skip" in {f.name for f in __import__("dataclasses").fields(transformers.TrainingArguments)}


def test_megatron_loads_the_step_from_its_save_folder_and_skips_iterations_one_by_one():
    """iterations_to_skip is 1-indexed: iteration 1301 is the update after iter_0001300."""
    plan = trainer_plan("save/iter_0001300", 1300, (1301, 1400), lr_rose=True)
    assert plan["arguments"] == ["--load save --ckpt-step 1300 --iterations-to-skip $(seq 1301 1400) "
                                 "--use-checkpoint-opt_param-scheduler"]  # one resume: every flag together


def test_olmo_core_skips_a_half_open_range_of_steps():
    """StepSkipRange(start, stop): start is the first step skipped, stop is exclusive."""
    plan = trainer_plan("save/step1300", 1300, (1301, 1400))
    assert plan["arguments"] == ['TrainerConfig(load_path="save/step1300", steps_to_skip=[StepSkipRange(start=1301, '
                                 'stop=1401)], ...)']
    assert "skips the steps 1301–1400" in plan["skip"]


def test_torchtitan_and_maxtext_resume_and_say_they_take_no_range_to_skip():
    titan = trainer_plan("dump/checkpoint/step-1300", 1300, (1301, 1400))
    assert titan["arguments"] == ["--dump_folder dump --checkpoint.enable --checkpoint.folder checkpoint "
                                  "--checkpoint.load_step 1300"]
    assert titan["skip"] == "torchtitan takes no range of steps to skip"
    maxtext = trainer_plan("base/run/checkpoints/1300", 1300, (1301, 1400))
    assert maxtext["arguments"] == ["run_name=<a new run name> load_full_state_path=base/run/checkpoints/1300/items"]
    assert maxtext["skip"].startswith("MaxText takes no range of steps to skip")
