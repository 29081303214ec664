"""Megatron-LM save directories written by real megatron-core, on CPU.

Unlike make_golden.py this runs in ckptscan's own test environment (the test
extra installs megatron-core and psutil), so the tests run it too. A tiny GPT
(hidden 32, 2 layers, 4 query heads in 2 query groups, head_dim 8, SwiGLU
FFN 64, vocabulary 64, float32) is built from Megatron's local layer spec,
trained with SGD on random tokens, and saved as Megatron-LM's
`save_checkpoint` does: a `--save` directory of `iter_NNNNNNN/` folders and
`latest_checkpointed_iteration.txt`, each checkpoint the state dict
{args, checkpoint_version, iteration, model, opt_param_scheduler} (no
optimizer state, as with --no-save-optim), written with
`dist_checkpointing.save` (`--ckpt-format torch_dist`, the default) or
`torch.save` of each rank's `mp_rank_TT[_PPP]/model_optim_rng.pt`
(`--ckpt-format torch`).
Megatron-LM itself (megatron.training) is not on PyPI; `args` holds the
argparse fields it would, named as its flags are.

    python tests/golden/make_megatron.py OUT            # every run below, into OUT
    python tests/golden/make_megatron.py OUT dense moe  # some of them

Runs: `dense` (torch_dist, iterations 10 and 20), `moe` (4 experts, top-2,
sigmoid scores with an expert bias updated as finalize_model_grads updates
it, no grouped GEMM; iterations 10 and 20), `gated` (the dense model with
--attention-output-gate and --qk-layernorm), `legacy` (the dense weights in
the torch format), and four runs on two gloo ranks, each in both formats
(`NAME/` torch_dist, `legacy_NAME/` the torch format): `tp2` / `pp2`, the
dense run loaded back with `dist_checkpointing.load` into a model sharded
over the ranks (tensor parallel 2, or pipeline parallel 2) and saved again;
`vpp`, 4 layers at pipeline parallel 2 with two virtual pipeline chunks a
rank, and `uneven`, 3 MoE layers at pipeline parallel 2 split 2 + 1, both
saved at iteration 10 as initialised (their torch_dist save the reference of
their rank files). The two-rank runs are this script started again on each
rank (all four in one world: one start-up of megatron-core per rank). Beside
the runs, megatron_split/ holds Megatron's own q/k split (with QK norms: taken
before them, their gains beside), router weights and learning rates of each
saved iteration (`megatron_split`), and its scheduler's learning rate for
every decay style (`lr_schedules`).
tests/golden/megatron/ holds `dense`, `moe`, `gated`, `legacy` and
megatron_split/, written with megatron-core 0.16.1, torch 2.13.0+cpu, Python
3.11; and `dense-0.15.3`, the dense run written with megatron-core 0.15.3
(installed with `pip install --no-deps --target DIR megatron-core==0.15.3`,
the script run with PYTHONPATH=DIR), whose `.metadata` pickles megatron's own
subclasses of DCP's classes. Every file but `.metadata` (which records the
save's id and path) comes out byte for byte the same when regenerated. The
two-rank runs are not committed: the tests run the script for them
(tests/format_writers.py `megatron_saves`).

megatron-core needs a few shims to run without a GPU (`cpu_shims`); the
default causal mask is built on CUDA, so the training step passes
`pretrain_gpt`'s explicit one; the RNG tracker is the inference one, whose
`fork()` needs no CUDA; layers use the local spec (no Transformer Engine).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

# torch (seconds to import on a small machine) is imported by the processes
# that build models (`import_torch`), not by the one that only starts the ranks.
torch: Any = None
F: Any = None

HIDDEN, LAYERS, HEADS, GROUPS, HEAD_DIM, FFN, VOCAB, SEQ, EXPERTS, TOP_K = 32, 2, 4, 2, 8, 64, 64, 16, 4, 2
MOE_FFN = 32  # per expert: keeps the committed MoE run small
ITERATIONS = (10, 20)
GLOBAL_BATCH = 2
# The learning-rate schedule, in Megatron-LM's flags (iterations; the
# scheduler counts samples: iterations x global batch size).
LR, MIN_LR, WARMUP_ITERS, DECAY_ITERS, LR_DECAY_STYLE = 0.05, 0.005, 4, 30, "cosine"
RUNS = ("dense", "moe", "gated", "legacy", "tp2", "pp2", "vpp", "uneven")
# Megatron's own q/k split of each saved iteration, beside the runs (never inside one).
SPLITS = "megatron_split"


def _not_compiled(model=None, **options):
    """`torch.compile` as Megatron's own `disable_jit_fuser` makes its `jit_fuser`: the function as it is."""
    return model if model is not None else (lambda function: function)


def import_torch() -> None:
    """torch, for the module's functions (see `torch` above)."""
    global torch, F
    import torch
    import torch.nn.functional as F


def cpu_shims() -> None:
    """megatron-core 0.16 calls `torch.cuda.current_device()` in the rotary
    embedding, the router and the checkpoint saver, `torch.cuda.synchronize()`
    in the async file writer, and names Transformer Engine's `te_general_gemm`
    in the router's logits without importing it when TE is absent. Its fused
    GPU kernels are wrapped in `torch.compile` when megatron.core is imported,
    which imports Inductor: half of megatron-core's start-up, for kernels
    these models never call (no bias-activation or RoPE fusion).
    Two of its optional imports, only for logging, cost seconds more: wandb
    and TensorBoard are made absent. The async writer sends its results to a
    Manager it starts in a fresh interpreter (spawn, for CUDA's sake), which
    imports torch to unpickle them; forked, it has torch already."""
    import multiprocessing

    sys.modules.update({"wandb": None, "torch.utils.tensorboard": None})
    torch.compile = _not_compiled
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *args, **kwargs: None
    warnings.filterwarnings("ignore", message=".*(Apex|Transformer Engine|TE) .*")
    from megatron.core.transformer.moe import moe_utils

    moe_utils.te_general_gemm = None
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    filesystem_async._results_queue = multiprocessing.get_context("fork").Manager().Queue()


def init_process_group() -> None:
    """A gloo process group: the environment `run_ranks` gives each rank, or a single rank."""
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    torch.distributed.init_process_group("gloo")


@dataclasses.dataclass(frozen=True)
class Sizes:
    """A model's layer count and how Megatron splits it over ranks."""

    layers: int = LAYERS
    tp: int = 1
    pp: int = 1
    vpp: int | None = None  # model chunks per pipeline rank (interleaved schedule)
    first_stage: int | None = None  # layers on the first pipeline stage, when not an even share


def init_model_parallel(sizes: Sizes = Sizes()) -> None:
    """Megatron's model-parallel groups, and the RNG tracker that needs no CUDA."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import random

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=sizes.tp,
                                             pipeline_model_parallel_size=sizes.pp,
                                             virtual_pipeline_model_parallel_size=sizes.vpp)
    random.initialize_rng_tracker(inference_rng_tracker=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(kind: str, sizes: Sizes = Sizes()):
    """`kind`: "dense", "moe" or "gated" (the dense model with an attention output gate and QK norms)."""
    from megatron.core.transformer import TransformerConfig

    extra: dict = {
        "dense": {},
        "moe": dict(num_moe_experts=EXPERTS, moe_router_topk=TOP_K, moe_grouped_gemm=False,
                    moe_ffn_hidden_size=MOE_FFN, moe_aux_loss_coeff=0.0, moe_token_dispatcher_type="allgather",
                    moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True),
        "gated": dict(attention_output_gate=True, qk_layernorm=True),
    }[kind]
    return TransformerConfig(
        num_layers=sizes.layers, hidden_size=HIDDEN, ffn_hidden_size=FFN, num_attention_heads=HEADS,
        num_query_groups=GROUPS, kv_channels=HEAD_DIM, gated_linear_unit=True, activation_func=F.silu,
        add_bias_linear=False, normalization="RMSNorm", use_cpu_initialization=True, params_dtype=torch.float32,
        pipeline_dtype=torch.float32, tensor_model_parallel_size=sizes.tp, pipeline_model_parallel_size=sizes.pp,
        virtual_pipeline_model_parallel_size=sizes.vpp, num_layers_in_first_pipeline_stage=sizes.first_stage,
        sequence_parallel=False, hidden_dropout=0.0, attention_dropout=0.0, bias_dropout_fusion=False,
        apply_rope_fusion=False, masked_softmax_fusion=False, gradient_accumulation_fusion=False, **extra)


def model(kind: str, sizes: Sizes = Sizes(), vp_stage: int | None = None):
    """This rank's GPT (with virtual pipeline chunks: its chunk `vp_stage`), as
    Megatron-LM's `model_provider` builds it."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec(num_experts=EXPERTS if kind == "moe" else None, moe_grouped_gemm=False,
                                    qk_layernorm=kind == "gated", normalization="RMSNorm")
    return GPTModel(config(kind, sizes), spec, vocab_size=VOCAB, max_sequence_length=SEQ,
                    pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
                    post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
                    share_embeddings_and_output_weights=False, position_embedding_type="rope", vp_stage=vp_stage)


def args(kind: str, iteration: int, ckpt_format: str, sizes: Sizes = Sizes()) -> argparse.Namespace:
    """The fields of Megatron-LM's parsed arguments this model was built from."""
    return argparse.Namespace(
        num_layers=sizes.layers, hidden_size=HIDDEN, ffn_hidden_size=FFN, num_attention_heads=HEADS,
        group_query_attention=True, num_query_groups=GROUPS, kv_channels=HEAD_DIM, swiglu=True,
        normalization="RMSNorm", position_embedding_type="rope", untie_embeddings_and_output_weights=True,
        add_bias_linear=False, seq_length=SEQ, max_position_embeddings=SEQ, padded_vocab_size=VOCAB,
        num_experts=EXPERTS if kind == "moe" else None, moe_ffn_hidden_size=MOE_FFN if kind == "moe" else None,
        qk_layernorm=kind == "gated", attention_output_gate=kind == "gated",
        moe_router_topk=TOP_K, moe_grouped_gemm=False,
        moe_router_score_function="sigmoid" if kind == "moe" else "softmax",
        moe_router_enable_expert_bias=kind == "moe", transformer_impl="local",
        params_dtype=torch.float32, tensor_model_parallel_size=sizes.tp, pipeline_model_parallel_size=sizes.pp,
        virtual_pipeline_model_parallel_size=sizes.vpp, decoder_first_pipeline_num_layers=sizes.first_stage,
        expert_model_parallel_size=1, micro_batch_size=GLOBAL_BATCH, global_batch_size=GLOBAL_BATCH,
        train_iters=DECAY_ITERS, lr=LR, min_lr=MIN_LR, lr_warmup_init=0.0, lr_warmup_iters=WARMUP_ITERS,
        lr_decay_iters=DECAY_ITERS, lr_decay_style=LR_DECAY_STYLE, weight_decay=0.0, optimizer="sgd",
        ckpt_format=ckpt_format, iteration=iteration, save="checkpoints")


def scheduler(optimizer):
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    return OptimizerParamScheduler(optimizer, init_lr=0.0, max_lr=LR, min_lr=MIN_LR,
                                   lr_warmup_steps=WARMUP_ITERS * GLOBAL_BATCH,
                                   lr_decay_steps=DECAY_ITERS * GLOBAL_BATCH, lr_decay_style=LR_DECAY_STYLE,
                                   start_wd=0.0, end_wd=0.0, wd_incr_steps=DECAY_ITERS * GLOBAL_BATCH,
                                   wd_incr_style="constant")


def causal_mask() -> torch.Tensor:
    """`pretrain_gpt`'s explicit mask (True = masked): the default is built on CUDA."""
    return torch.triu(torch.ones(1, 1, SEQ, SEQ, dtype=torch.bool), diagonal=1)


def train_step(gpt, optimizer, sched, iteration: int) -> None:
    tokens = torch.randint(0, VOCAB, (GLOBAL_BATCH, SEQ + 1), generator=torch.Generator().manual_seed(iteration))
    positions = torch.arange(SEQ).unsqueeze(0).expand(GLOBAL_BATCH, SEQ)
    loss = gpt(tokens[:, :-1], positions, causal_mask(), labels=tokens[:, 1:]).float().mean()
    optimizer.zero_grad()
    loss.backward()
    if gpt.config.moe_router_enable_expert_bias:  # as finalize_model_grads does after the backward pass
        from megatron.core.distributed.finalize_model_grads import (
            _update_router_expert_bias,
            reset_model_temporary_tensors,
        )

        _update_router_expert_bias([gpt], gpt.config)
        reset_model_temporary_tensors(gpt.config, [gpt])
    optimizer.step()
    sched.step(increment=GLOBAL_BATCH)


def iteration_dir(save: Path, iteration: int) -> Path:
    return save / f"iter_{iteration:07d}"


def _models(chunks: list) -> dict:
    """Megatron-LM's keys for a rank's model chunks: `model`, or `model0`, `model1`, ...
    with virtual pipeline chunks."""
    return {"model": chunks[0]} if len(chunks) == 1 else {f"model{v}": chunk for v, chunk in enumerate(chunks)}


def save_torch_dist(chunks: list, state: dict, directory: Path) -> None:
    from megatron.core import dist_checkpointing

    directory.mkdir(parents=True, exist_ok=True)
    models = {key: chunk.sharded_state_dict() for key, chunk in _models(chunks).items()}
    dist_checkpointing.save({**state, **models}, str(directory))


def save_legacy(chunks: list, state: dict, directory: Path) -> None:
    """`--ckpt-format torch`: each rank's own state dict, in the folder
    Megatron-LM's `get_checkpoint_name` gives it (`mp_rank_TT`, `_PPP`
    appended when pipeline parallel)."""
    from megatron.core import parallel_state

    tp, pp = parallel_state.get_tensor_model_parallel_rank(), parallel_state.get_pipeline_model_parallel_rank()
    name = f"mp_rank_{tp:02d}" + (f"_{pp:03d}" if parallel_state.get_pipeline_model_parallel_world_size() > 1 else "")
    (directory / name).mkdir(parents=True)
    models = {key: chunk.state_dict_for_save_checkpoint() for key, chunk in _models(chunks).items()}
    torch.save({**state, **models}, directory / name / "model_optim_rng.pt")


def common_state(kind: str, iteration: int, ckpt_format: str, sched, sizes: Sizes = Sizes()) -> dict:
    return {"args": args(kind, iteration, ckpt_format, sizes), "checkpoint_version": 3.0, "iteration": iteration,
            "opt_param_scheduler": sched.state_dict()}


def megatron_split(gpt, optimizer) -> dict[str, torch.Tensor]:
    """Per layer, the query and key head blocks [heads, head_dim, hidden] as
    Megatron's own `SelfAttention.get_query_key_value_tensors` splits them, and
    the router weight; and the learning rate Megatron's scheduler set for the
    next update: the reference the tests hold ckptscan's numbers to.
    The identity as hidden states makes the projection return the weight rows
    exactly (no bias). With QK norms the blocks are taken before them (the
    norm of a weight row is no weight) and their gains stored beside; with an
    output gate the split is asked for the gate too, as attention's forward
    asks (the blocks then skip the gate's rows)."""
    eye = torch.eye(HIDDEN).unsqueeze(1)  # [sequence = hidden, batch 1, hidden]
    split = {"lr": torch.tensor(optimizer.param_groups[0]["lr"], dtype=torch.float64)}
    with torch.no_grad():
        for i, layer in enumerate(gpt.decoder.layers):
            attention = layer.self_attention
            norms = attention.q_layernorm, attention.k_layernorm
            attention.q_layernorm = attention.k_layernorm = None
            # megatron-core 0.15 has no output gate (nor the argument)
            gated = {"output_gate": True} if getattr(attention.config, "attention_output_gate", False) else {}
            query, key = attention.get_query_key_value_tensors(eye, None, **gated)[:2]
            attention.q_layernorm, attention.k_layernorm = norms
            split[f"{i}.query"] = query[:, 0].permute(1, 2, 0).contiguous()  # [hidden, heads, d] -> [heads, d, hidden]
            split[f"{i}.key"] = key[:, 0].permute(1, 2, 0).contiguous()
            for name, norm in zip(("q_norm", "k_norm"), norms, strict=True):
                if hasattr(norm, "weight"):  # without QK norms they are IdentityOp
                    split[f"{i}.{name}"] = norm.weight.detach().clone()
            if hasattr(layer.mlp, "router"):
                split[f"{i}.router"] = layer.mlp.router.weight.detach().clone()
                split[f"{i}.expert_bias"] = layer.mlp.router.expert_bias.detach().clone()
    return split


def lr_schedules() -> list[dict]:
    """Megatron's OptimizerParamScheduler of every decay style, stepped past
    warmup, through decay and beyond it: each saved state dict with the
    Megatron-LM args it needs besides, and the learning rate it computes."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=LR)
    cases = []
    for style in ("constant", "linear", "cosine", "inverse-square-root", "WSD"):
        for wsd_style in (("linear", "cosine", "exponential", "minus_sqrt") if style == "WSD" else (None,)):
            for num_steps in (0, 3, 8, 20, 45, 64, 80):
                sched = OptimizerParamScheduler(
                    optimizer, init_lr=0.001, max_lr=LR, min_lr=MIN_LR, lr_warmup_steps=8, lr_decay_steps=64,
                    lr_decay_style=style, start_wd=0.0, end_wd=0.0, wd_incr_steps=64, wd_incr_style="constant",
                    wsd_decay_steps=24 if style == "WSD" else None, lr_wsd_decay_style=wsd_style)
                sched.step(increment=num_steps)
                flags = {"lr": LR, "lr_warmup_init": 0.001, "global_batch_size": GLOBAL_BATCH}
                if style == "WSD":
                    flags.update(lr_wsd_decay_iters=24 // GLOBAL_BATCH, lr_wsd_decay_style=wsd_style)
                cases.append({"state": sched.state_dict(), "args": flags, "lr": optimizer.param_groups[0]["lr"]})
    return cases


def mark_latest(save: Path, iteration: int) -> None:
    if torch.distributed.get_rank() == 0:
        (save / "latest_checkpointed_iteration.txt").write_text(str(iteration))


def train_and_save(out: Path, kind: str, legacy: bool) -> None:
    """The run `kind` (see `config`); `legacy` writes its weights in the torch format too."""
    torch.manual_seed(1234)
    gpt = model(kind)
    optimizer = torch.optim.SGD(gpt.parameters(), lr=LR)
    sched = scheduler(optimizer)
    save = _fresh(out / kind)
    shutil.rmtree(out / SPLITS / save.name, ignore_errors=True)
    legacy_save = _fresh(out / "legacy") if legacy else None
    if kind == "dense":
        (out / SPLITS).mkdir(parents=True, exist_ok=True)
        torch.save(lr_schedules(), out / SPLITS / "lr_schedules.pt")
    done = 0
    for iteration in ITERATIONS:
        while done < iteration:
            done += 1
            train_step(gpt, optimizer, sched, done)
        save_torch_dist([gpt], common_state(kind, iteration, "torch_dist", sched), iteration_dir(save, iteration))
        mark_latest(save, iteration)
        splits = out / SPLITS / save.name
        splits.mkdir(parents=True, exist_ok=True)
        torch.save(megatron_split(gpt, optimizer), splits / f"iter_{iteration:07d}.pt")
        if legacy_save is not None:
            save_legacy([gpt], common_state(kind, iteration, "torch", sched), iteration_dir(legacy_save, iteration))
            mark_latest(legacy_save, iteration)


def _fresh(directory: Path) -> Path:
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    return directory


def reshard(dense: Path, out: Path, name: str) -> None:
    """On each rank of a two-rank world: the dense run's every iteration loaded
    into a (tp, pp)-sharded model and saved again, as Megatron-LM does when a
    run resumes with other parallel sizes: as torch_dist into `name` and in the
    torch format into `legacy_{name}`."""
    from megatron.core import dist_checkpointing, parallel_state

    sizes = RESHARDED[name]
    save, legacy_save = out / name, out / f"legacy_{name}"
    init_model_parallel(sizes)
    gpt = model("dense", sizes)
    for iteration in ITERATIONS:
        source = iteration_dir(dense, iteration)
        loaded = dist_checkpointing.load({"model": gpt.sharded_state_dict()}, str(source))
        gpt.load_state_dict(loaded["model"])
        common = dist_checkpointing.load_common_state_dict(str(source))
        common["args"].tensor_model_parallel_size, common["args"].pipeline_model_parallel_size = sizes.tp, sizes.pp
        state = {k: common[k] for k in ("args", "checkpoint_version", "iteration", "opt_param_scheduler")}
        save_torch_dist([gpt], state, iteration_dir(save, iteration))
        legacy_args = argparse.Namespace(**{**vars(common["args"]), "ckpt_format": "torch"})
        save_legacy([gpt], {**state, "args": legacy_args}, iteration_dir(legacy_save, iteration))
        torch.distributed.barrier()
        mark_latest(save, iteration)
        mark_latest(legacy_save, iteration)
    parallel_state.destroy_model_parallel()


def split_anew(out: Path, name: str) -> None:
    """On each rank of a two-rank world: a model of other pipeline splits than
    the dense run's can hold (FRESH), as initialised, saved at iteration 10
    as torch_dist into `name` and in the torch format into `legacy_{name}`:
    two saves of the same weights, the first the other's reference."""
    from megatron.core import parallel_state

    kind, sizes = FRESH[name]
    init_model_parallel(sizes)
    torch.manual_seed(1234)
    chunks = [model(kind, sizes, vp_stage=v if sizes.vpp else None) for v in range(sizes.vpp or 1)]
    sched = scheduler(torch.optim.SGD([p for chunk in chunks for p in chunk.parameters()], lr=LR))
    iteration = ITERATIONS[0]
    save_torch_dist(chunks, common_state(kind, iteration, "torch_dist", sched, sizes),
                    iteration_dir(out / name, iteration))
    save_legacy(chunks, common_state(kind, iteration, "torch", sched, sizes),
                iteration_dir(out / f"legacy_{name}", iteration))
    torch.distributed.barrier()
    mark_latest(out / name, iteration)
    mark_latest(out / f"legacy_{name}", iteration)
    parallel_state.destroy_model_parallel()


RESHARDED = {"tp2": Sizes(tp=2), "pp2": Sizes(pp=2)}
# Interleaved: rank p's chunk v holds layer 2v + p. Uneven: 2 layers, then 1 (MoE, so the routers are renumbered too).
FRESH = {"vpp": ("dense", Sizes(layers=4, pp=2, vpp=2)), "uneven": ("moe", Sizes(layers=3, pp=2, first_stage=2))}


def run_ranks(out: Path, names: list[str]) -> None:
    """The two-rank runs: this script again on two gloo ranks, started as
    torchrun starts them (its environment, an env:// rendezvous) but without
    its launcher, which imports torch only to start them."""
    for name in names:
        _fresh(out / name)
        _fresh(out / f"legacy_{name}")
    world = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
             "OMP_NUM_THREADS": "1"}
    command = [sys.executable, __file__, str(out), *names, "--ranks"]
    ranks = [subprocess.Popen(command, env={**os.environ, **world, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.DEVNULL) for r in range(2)]
    while all(rank.poll() is None for rank in ranks):
        time.sleep(0.1)
    for rank in ranks:  # one rank failed, or both are done: the other waits on it no longer
        if rank.poll() is None and any(other.returncode for other in ranks if other is not rank):
            rank.kill()
        rank.wait()
    if any(rank.returncode for rank in ranks):
        raise SystemExit(f"a rank failed (exit codes {[rank.returncode for rank in ranks]})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("runs", nargs="*", help=f"any of {', '.join(RUNS)} (default: all)")
    parser.add_argument("--ranks", action="store_true", help=argparse.SUPPRESS)  # one rank, set by run_ranks
    options = parser.parse_args()
    out = options.out.resolve()
    runs = options.runs or list(RUNS)
    if set(runs) - set(RUNS):
        parser.error(f"unknown run(s) {', '.join(sorted(set(runs) - set(RUNS)))}; choose from {', '.join(RUNS)}")
    on_ranks = [name for name in (*RESHARDED, *FRESH) if name in runs]
    if options.ranks:
        import_torch()
        cpu_shims()
        init_process_group()
        for name in on_ranks:
            if name in RESHARDED:
                reshard(out / "dense", out, name)
            else:
                split_anew(out, name)
        torch.distributed.destroy_process_group()
        return
    if set(runs) & {"dense", "legacy", "moe", "gated"} or not (out / "dense").is_dir():
        import_torch()
        cpu_shims()
        init_process_group()
        init_model_parallel()
        if set(runs) & {"dense", "legacy"} or not (out / "dense").is_dir():
            train_and_save(out, "dense", legacy="legacy" in runs)
        for kind in ("moe", "gated"):
            if kind in runs:
                train_and_save(out, kind, legacy=False)
        torch.distributed.destroy_process_group()
    if on_ranks:
        run_ranks(out, on_ranks)


if __name__ == "__main__":
    main()
