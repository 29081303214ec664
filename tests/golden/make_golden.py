"""Regenerate the golden checkpoints under tests/golden/ with the real frameworks.

Each framework trains a tiny model (hidden 32, 2 layers, 4 query heads over 2
KV heads, head_dim 8, vocabulary 64) for a few steps on random tokens and
saves it its own default way; ckptscan's tests then read these files, never
the frameworks (which CI does not install). SGD without momentum keeps the
optimizer state, and so the files, small.

Run it in a separate environment, never ckptscan's own:

    python3 -m venv /tmp/fwvenv
    /tmp/fwvenv/bin/pip install torch==2.13.0            # the CPU wheel
    /tmp/fwvenv/bin/pip install lightning==2.6.6 accelerate==1.15.0 transformers==5.23.0 deepspeed==0.19.8
    /tmp/fwvenv/bin/pip install --no-deps litgpt==0.5.13  # its pins conflict with transformers 5; GPT/Config need none
    /tmp/fwvenv/bin/pip install --no-deps torchtitan==0.3.0
    /tmp/fwvenv/bin/pip install tyro torchdata spmd_types==0.2.3 torch_checkpointing triton  # torchtitan's imports
    /tmp/fwvenv/bin/pip install "jax[cpu]==0.10.2" orbax-checkpoint==0.12.8 tensorstore==0.1.86
    /tmp/fwvenv/bin/python tests/golden/make_golden.py [framework ...]

Versions the committed files were written with: torch 2.13.0+cpu,
lightning 2.6.6, accelerate 1.15.0, transformers 5.23.0, litgpt 0.5.13,
deepspeed 0.19.8, torchtitan 0.3.0, jax 0.10.2 with orbax-checkpoint 0.12.8
and tensorstore 0.1.86 (Python 3.11). Every file is rewritten from scratch; seeds are
fixed, but the frameworks' own metadata (paths, versions) may differ.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB, SEQ = 32, 2, 4, 2, 8, 64, 16


def _tokens(step: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(step))


def hf_config(kind: str):
    import transformers

    common = dict(hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                  num_key_value_heads=KV_HEADS, vocab_size=VOCAB, max_position_embeddings=64,
                  tie_word_embeddings=True)
    if kind == "qwen3":
        return transformers.Qwen3Config(head_dim=HEAD_DIM, **common)
    return transformers.LlamaConfig(**common)


def _fresh(name: str) -> Path:
    out = HERE / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    return out


def lightning() -> None:
    """ModelCheckpoint every 2 steps, all kept, plus last.ckpt; the model's
    config dict is the module's hyper-parameter, as save_hyperparameters() stores it.
    A second run keeps a transformers config object as the hyper-parameter."""
    import lightning as L
    import transformers

    class Module(L.LightningModule):
        def __init__(self, model_config: dict, lr: float = 0.1):
            super().__init__()
            self.save_hyperparameters()
            self.model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**model_config))

        def training_step(self, batch, _):
            return self.model(input_ids=batch, labels=batch).loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    out = _fresh("lightning")
    config = {k: v for k, v in hf_config("llama").to_dict().items()
              if k in ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                       "num_key_value_heads", "vocab_size", "max_position_embeddings", "tie_word_embeddings")}
    data = torch.utils.data.DataLoader([_tokens(i)[0] for i in range(8)], batch_size=2)
    checkpoint = L.pytorch.callbacks.ModelCheckpoint(every_n_train_steps=2, save_top_k=-1, save_last=True)
    trainer = L.Trainer(max_steps=6, default_root_dir=out, callbacks=[checkpoint], accelerator="cpu",
                        logger=L.pytorch.loggers.CSVLogger(out, name="lightning_logs"), enable_progress_bar=False,
                        enable_model_summary=False)
    L.seed_everything(0)
    trainer.fit(Module(config), data)
    for log in out.rglob("metrics.csv"):
        log.unlink()

    # Second run: the module's hyper-parameter is a transformers config
    # *object* (a tiny Mixtral), no logger, so checkpoints land in
    # default_root_dir/checkpoints/.
    class ConfigObjectModule(L.LightningModule):
        def __init__(self, config):
            super().__init__()
            self.save_hyperparameters()
            self.model = transformers.MixtralForCausalLM(config)

        def training_step(self, batch, _):
            return self.model(input_ids=batch, labels=batch).loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    mixtral = transformers.MixtralConfig(hidden_size=HIDDEN, intermediate_size=32, num_hidden_layers=LAYERS,
                                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=VOCAB,
                                         max_position_embeddings=64, num_local_experts=4, num_experts_per_tok=2,
                                         tie_word_embeddings=True)
    checkpoint = L.pytorch.callbacks.ModelCheckpoint(every_n_train_steps=2, save_top_k=-1)
    trainer = L.Trainer(max_steps=4, default_root_dir=out / "config_object", callbacks=[checkpoint],
                        accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    L.seed_everything(0)
    trainer.fit(ConfigObjectModule(mixtral), data)


def accelerate() -> None:
    """Two runs: `save_state("step_N")` as accelerate's examples do (a Qwen3
    model: QK-norm, no config.json), and ProjectConfiguration's automatic
    `checkpoints/checkpoint_K` with a registered object recording the step."""
    import transformers
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration, set_seed

    class StepCounter:
        def __init__(self):
            self.step = 0

        def state_dict(self):
            return {"step": self.step}

        def load_state_dict(self, state):
            self.step = state["step"]

    out = _fresh("accelerate")
    for run, kind, automatic in (("step_dirs", "qwen3", False), ("automatic", "llama", True)):
        set_seed(0)
        project = ProjectConfiguration(project_dir=str(out / run), automatic_checkpoint_naming=automatic)
        accelerator = Accelerator(cpu=True, project_config=project)
        model = transformers.AutoModelForCausalLM.from_config(hf_config(kind))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = accelerator.prepare(model, optimizer)
        counter = StepCounter()
        if automatic:
            accelerator.register_for_checkpointing(counter)
        for step in range(1, 7):
            loss = model(input_ids=_tokens(step), labels=_tokens(step)).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            counter.step = step
            if step % 3 == 0:
                accelerator.save_state(None if automatic else str(out / run / f"step_{step}"))


def litgpt() -> None:
    """litgpt's pretrain save: fabric.save(step-NNNNNNNN/lit_model.pth, state) and
    save_config(model_config.yaml); QK-norm on, 2 micro-batches per step so
    iter_num (micro-batches) and step_count (optimizer steps) differ."""
    import lightning as L
    from litgpt import GPT, Config
    from litgpt.utils import save_config

    out = _fresh("litgpt")
    config = Config(name="tiny-llama-qknorm", block_size=SEQ, vocab_size=VOCAB, padded_vocab_size=VOCAB,
                    n_layer=LAYERS, n_head=HEADS, n_query_groups=KV_HEADS, n_embd=HIDDEN, head_size=HEAD_DIM,
                    intermediate_size=64, mlp_class_name="LLaMAMLP", norm_class_name="RMSNorm", bias=False,
                    rotary_percentage=1.0, parallel_residual=False, norm_qk=True)
    fabric = L.Fabric(accelerator="cpu", devices=1)
    fabric.seed_everything(0)
    model = fabric.setup(GPT(config))
    optimizer = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=0.1))
    state = {"model": model, "optimizer": optimizer, "iter_num": 0, "step_count": 0}
    for _ in range(8):
        state["iter_num"] += 1
        tokens = _tokens(state["iter_num"])
        logits = model(tokens[:, :-1])
        fabric.backward(torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)))
        if state["iter_num"] % 2 == 0:
            optimizer.step()
            optimizer.zero_grad()
            state["step_count"] += 1
            if state["step_count"] % 2 == 0:
                file = out / f"step-{state['step_count']:08d}" / "lit_model.pth"
                file.parent.mkdir(parents=True)
                fabric.save(file, state)
                save_config(config, file.parent)
    file = out / "final" / "lit_model.pth"  # pretrain.py's last save
    file.parent.mkdir()
    fabric.save(file, state)
    save_config(config, file.parent)


def deepspeed() -> None:
    """engine.save_checkpoint(OUT) under ZeRO stage 1 on one CPU process:
    OUT/global_stepN/ and OUT/latest."""
    os.environ.update(DS_ACCELERATOR="cpu", MASTER_ADDR="127.0.0.1", MASTER_PORT="29531", RANK="0",
                      WORLD_SIZE="1", LOCAL_RANK="0")
    import deepspeed as ds
    import transformers

    out = _fresh("deepspeed")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(hf_config("llama"))
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "zero_optimization": {"stage": 1},
              "zero_allow_untested_optimizer": True}
    engine, *_ = ds.initialize(model=model, model_parameters=model.parameters(), config=config)
    # Megatron-DeepSpeed style scripts pass their args as client state.
    args = argparse.Namespace(num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, hidden_size=HIDDEN)
    for step in range(1, 5):
        loss = engine(input_ids=_tokens(step), labels=_tokens(step)).loss
        engine.backward(loss)
        engine.step()
        if step % 2 == 0:
            engine.save_checkpoint(str(out / "plain"))
            engine.save_checkpoint(str(out / "with_args"), client_state={"args": args})
    for script in out.rglob("zero_to_*.py"):
        script.unlink()  # DeepSpeed's consolidation script, not checkpoint data


def torchtitan() -> None:
    """torchtitan's CheckpointManager (DCP) as its Trainer builds it, on one
    CPU process (gloo): DUMP/checkpoint/step-N/, the train state being an
    object with state_dict() {"step", "ntokens_seen"} like the Trainer's.
    The model is torchtitan's Llama3Model at the tiny sizes above (its fused
    wqkv saved split as qkv_linear.wq/wk/wv). torchtitan's attention has no
    CPU backward, so the steps follow a surrogate loss (see below)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29532", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    import torch.distributed as dist
    from torchtitan.components.checkpointer.dcp import CheckpointManager
    from torchtitan.components.optimizer.lr_scheduler import LRSchedulersContainer
    from torchtitan.components.optimizer.optimizer import OptimizersContainer, ParamGroupConfig
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.llama3 import Llama3Model, _build_llama3_layers

    class TrainState:
        def __init__(self):
            self.step, self.ntokens_seen = 0, 0

        def state_dict(self):
            return {"step": self.step, "ntokens_seen": self.ntokens_seen}

        def load_state_dict(self, state):
            self.step, self.ntokens_seen = state["step"], state["ntokens_seen"]

    out = _fresh("torchtitan")
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    config = Llama3Model.Config(
        dim=HIDDEN, vocab_size=VOCAB,
        tok_embeddings=Embedding.Config(num_embeddings=VOCAB, embedding_dim=HIDDEN),
        norm=RMSNorm.Config(normalized_shape=HIDDEN),
        lm_head=Linear.Config(in_features=HIDDEN, out_features=VOCAB),
        layers=_build_llama3_layers(n_layers=LAYERS, dim=HIDDEN, n_heads=HEADS, n_kv_heads=KV_HEADS, hidden_dim=64,
                                    rope=ComplexRoPE.Config(dim=HEAD_DIM, max_seq_len=64, theta=500000),
                                    attn_backend="flex"),
    )
    model = config.build()
    model.init_weights() if hasattr(model, "init_weights") else None
    optimizers = OptimizersContainer.Config(
        implementation="for-loop",
        param_groups=[ParamGroupConfig(pattern=".*", optimizer_name="Adam", optimizer_kwargs={"lr": 0.01})],
    ).build(model_parts=[model])
    lr_schedulers = LRSchedulersContainer.Config(warmup_steps=1).build(optimizers=optimizers, training_steps=4)
    state = TrainState()
    checkpointer = CheckpointManager.Config(enable=True, interval=2).build(  # last save: model only (default)
        dataloader=None, model_parts=[model], optimizers=optimizers, lr_schedulers=lr_schedulers,
        states={"train_state": state}, sd_adapter=None, base_folder=str(out))
    for step in range(1, 5):
        state.step = step
        # FlexAttention has no backward on CPU and varlen is CUDA-only, so the
        # real optimizer moves the weights along a surrogate loss (a random
        # linear function of the parameters), not the LM loss.
        generator = torch.Generator().manual_seed(step)
        loss = sum((p * torch.randn(p.shape, generator=generator)).sum() for p in model.parameters())
        loss.backward()
        optimizers.step()
        lr_schedulers.step()
        optimizers.zero_grad()
        checkpointer.save(step, last_step=step == 4)
    checkpointer.close()
    dist.destroy_process_group()


def orbax() -> None:
    """Orbax's CheckpointManager as MaxText uses it (`checkpoints/<step>/items/`,
    a train state {params, step}), with a MaxText-shaped parameter tree:
    scanned layers stacked on axis 1, Flax DenseGeneral kernels [D, heads, d]
    (names from MaxText's source; MaxText itself is not run). A tiny GQA
    decoder in plain JAX takes real SGD steps on next-token loss."""
    import jax
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    out = _fresh("orbax")
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 8))

    def init(shape):
        return 0.05 * jax.random.normal(next(keys), shape, jnp.float32)

    attention = {"query": {"kernel": init((HIDDEN, LAYERS, HEADS, HEAD_DIM))},
                 "key": {"kernel": init((HIDDEN, LAYERS, KV_HEADS, HEAD_DIM))},
                 "value": {"kernel": init((HIDDEN, LAYERS, KV_HEADS, HEAD_DIM))},
                 "out": {"kernel": init((HEADS, LAYERS, HEAD_DIM, HIDDEN))}}
    params = {"params": {"token_embedder": {"embedding": init((VOCAB, HIDDEN))},
                         "decoder": {"layers": {"self_attention": attention}}}}

    def loss_fn(params, tokens):
        p = params["params"]
        x = p["token_embedder"]["embedding"][tokens[:, :-1]]
        a = p["decoder"]["layers"]["self_attention"]
        mask = jnp.tril(jnp.ones((SEQ - 1, SEQ - 1), bool))
        for layer in range(LAYERS):
            q = jnp.einsum("btd,dhk->bthk", x, a["query"]["kernel"][:, layer])
            k = jnp.einsum("btd,dgk->btgk", x, a["key"]["kernel"][:, layer])
            v = jnp.einsum("btd,dgk->btgk", x, a["value"]["kernel"][:, layer])
            k, v = (jnp.repeat(t, HEADS // KV_HEADS, axis=2) for t in (k, v))
            scores = jnp.where(mask, jnp.einsum("bqhk,bshk->bhqs", q, k) / HEAD_DIM**0.5, -1e9)
            mixed = jnp.einsum("bhqs,bshk->bqhk", jax.nn.softmax(scores), v)
            x = x + jnp.einsum("bqhk,hkd->bqd", mixed, a["out"]["kernel"][:, layer])
        logits = x @ p["token_embedder"]["embedding"].T
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, 1:, None], -1))

    grad = jax.jit(jax.grad(loss_fn))
    manager = ocp.CheckpointManager(out / "checkpoints", item_names=("items",))
    for step in range(1, 5):
        tokens = jnp.asarray(_tokens(step).numpy())
        params = jax.tree.map(lambda w, g: w - 0.5 * g, params, grad(params, tokens))
        if step % 2 == 0:
            state = {"params": params, "step": jnp.asarray(step, jnp.int32)}
            manager.save(step, args=ocp.args.Composite(items=ocp.args.PyTreeSave(state)))
    manager.wait_until_finished()


FRAMEWORKS = {"lightning": lightning, "accelerate": accelerate, "litgpt": litgpt, "deepspeed": deepspeed,
              "torchtitan": torchtitan, "orbax": orbax}

if __name__ == "__main__":
    torch.set_num_threads(1)
    for name in sys.argv[1:] or list(FRAMEWORKS):
        FRAMEWORKS[name]()
        print(f"wrote {HERE / name}")
