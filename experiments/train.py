"""Train a tiny Mixtral on stdlib bytes, optionally with an injected fault.

    python -m experiments.train --out runs/healthy
    python -m experiments.train --out runs/attn --fault attention --fault-mantissa-bits 2

Natural instabilities (nothing injected; the training destabilises on its own):
  --lr high from step 0, --lr-jump-step/--lr-jump-mult (a resume with the wrong LR),
  --warmup short, --weight-decay 0; controls: --z-loss, --arch qwen3/qwen3_moe (QK-norm).
  train_log.jsonl logs the largest attention logit and the mean log Z of each batch.

Faults, each through its real mechanism:
  attention  flash-attention backward forms D = rowsum(dO * O) from a copy of O
             rounded to --fault-mantissa-bits with biased --fault-rounding
             (Qiu & Yao, arXiv 2510.04212), in --fault-layers only.
  router     from --router-fault-start on: router LR x --fault-router-lr-mult, batch
             --fault-batch-size, no load-balancing loss: the large-LR /
             small-batch routing collapse.
  both       the two at once.
A "silent" fault is the attention fault confined to one early layer (--fault-layers 0).

Writes RUN/checkpoint-{step}/{model.safetensors,config.json}, RUN/train_log.jsonl,
RUN/probe.safetensors and RUN/run.json.
"""

import argparse
import json
import math
import os
import platform
import shlex
import sys
import time

import torch
from safetensors.torch import save_file

from experiments.attention import DRounding
from experiments.data import load_stdlib_corpus, sample_batch
from experiments.divergence import divergence_step
from experiments.lowprec import MODES
from experiments.model import MixtralConfig, MixtralForCausalLM, hf_state_dict, load_balancing_loss, num_params

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="run directory (created)")
    p.add_argument("--arch", choices=["mixtral", "qwen3_moe", "llama", "qwen3"], default="mixtral",
                   help="HF architecture and names: Mixtral MoE, Qwen3-MoE (QK-norm), dense Llama, dense Qwen3 (QK-norm)")
    # model size
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=16)
    p.add_argument("--experts", type=int, default=4)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--expert-ffn", type=int, default=16, help="intermediate_size of each expert (of the MLP if dense)")
    # optimisation
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--schedule", choices=["cosine", "constant", "wsd"], default="cosine",
                   help="after warm-up: cosine decay, constant, or warmup-stable-decay (linear decay at the end)")
    p.add_argument("--min-lr-ratio", type=float, default=0.1, help="cosine and wsd decay to lr * this")
    p.add_argument("--decay-fraction", type=float, default=0.2, help="wsd: fraction of the steps spent decaying")
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--grad-clip", type=float, default=1.0, help="0 disables clipping")
    p.add_argument("--aux-loss-coef", type=float, default=0.02, help="load-balancing loss weight; 0 disables")
    p.add_argument("--z-loss", type=float, default=0.0,
                   help="z-loss weight: + coef * mean(log Z)^2 of the output logits (PaLM; 1e-4 is the usual)")
    p.add_argument("--lr-jump-step", type=int, default=None,
                   help="from this step on, every group's LR is the schedule's x --lr-jump-mult (a resume with the wrong LR)")
    p.add_argument("--lr-jump-mult", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-bytes", type=int, default=2_000_000)
    # faults
    p.add_argument("--fault", choices=["none", "attention", "router", "both"], default="none")
    p.add_argument("--fault-mantissa-bits", type=int, default=7, help="mantissa bits of O kept for D (7 ~ bf16)")
    p.add_argument("--fault-rounding", choices=MODES, default="zero")
    p.add_argument("--fault-layers", type=str, default="all", help="comma list of layer indices, or 'all'")
    p.add_argument("--fault-router-lr-mult", type=float, default=100.0, help="router LR = lr * this under the router fault")
    p.add_argument("--fault-batch-size", type=int, default=2, help="batch size under the router fault")
    p.add_argument("--attention-fault-start", type=int, default=0, help="first step with the attention fault")
    p.add_argument("--router-fault-start", type=int, default=0,
                   help="first step with the router fault; before it the run is the healthy run, bit for bit")
    # output
    p.add_argument("--save-every", type=int, default=100)
    p.add_argument("--save-dtype", choices=list(DTYPES), default="float16")
    p.add_argument("--log-every", type=int, default=1)
    p.add_argument("--probe-tokens", type=int, default=256)
    p.add_argument("--probe-step", type=int, default=0, help="checkpoint step whose router inputs form the probe")
    p.add_argument("--threads", type=int, default=1, help="torch threads; 1 keeps runs bit-reproducible")
    p.add_argument("--stop-at", type=int, default=None,
                   help="end after checkpoint N, keeping the schedule of --steps (a prefix of the full run)")
    p.add_argument("--live-every", type=int, default=0,
                   help="also run ckptscan.live.Monitor every N steps (0: off); its report is RUN/live/report.json")
    return p.parse_args(argv)


def lr_at(step: int, args: argparse.Namespace) -> float:
    """Linear warm-up to args.lr, then the schedule: cosine decay to
    args.lr * min_lr_ratio, constant, or warmup-stable-decay (constant, then a
    linear decay to the floor over the last `decay_fraction` of the steps)."""
    jump = args.lr_jump_mult if getattr(args, "lr_jump_step", None) is not None and step >= args.lr_jump_step else 1.0
    return jump * _scheduled_lr(step, args)


def _scheduled_lr(step: int, args: argparse.Namespace) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    floor = args.lr * args.min_lr_ratio
    schedule = getattr(args, "schedule", "cosine")
    if schedule == "constant":
        return args.lr
    if schedule == "wsd":
        decay_start = args.steps - int(args.decay_fraction * args.steps)
        if step < decay_start:
            return args.lr
        return args.lr - (args.lr - floor) * (step - decay_start) / max(1, args.steps - decay_start)
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return floor + 0.5 * (args.lr - floor) * (1 + math.cos(math.pi * min(1.0, progress)))


def build_optimizer(model: MixtralForCausalLM, args: argparse.Namespace) -> torch.optim.AdamW:
    """AdamW; matrices decay, norms do not; the routers get their own group so
    that the router fault can raise their learning rate alone."""
    groups = {"decay": [], "no_decay": [], "router": []}
    for name, p in model.named_parameters():
        if name.endswith(("block_sparse_moe.gate.weight", "mlp.gate.weight")):
            groups["router"].append(p)
        elif p.dim() >= 2:
            groups["decay"].append(p)
        else:
            groups["no_decay"].append(p)
    return torch.optim.AdamW(
        [
            {"params": groups["decay"], "weight_decay": args.weight_decay, "is_router": False},
            {"params": groups["no_decay"], "weight_decay": 0.0, "is_router": False},
            {"params": groups["router"], "weight_decay": args.weight_decay, "is_router": True},
        ],
        lr=args.lr, betas=(0.9, args.beta2),
    )


def fault_layers(args: argparse.Namespace) -> list[int]:
    if args.fault_layers == "all":
        return list(range(args.layers))
    return [int(i) for i in args.fault_layers.split(",")]


def set_attention_fault(model: MixtralForCausalLM, args: argparse.Namespace, on: bool) -> None:
    rounding = DRounding(args.fault_mantissa_bits, args.fault_rounding) if on else None
    for i in fault_layers(args):
        model.model.layers[i].self_attn.d_rounding = rounding


def fault_summary(args: argparse.Namespace) -> dict:
    """What was injected where and when, so a consumer need not decode the flags."""
    out = {}
    if args.fault in ("attention", "both"):
        out["attention"] = {"layers": fault_layers(args), "mantissa_bits": args.fault_mantissa_bits,
                            "rounding": args.fault_rounding, "from_step": args.attention_fault_start}
    if args.fault in ("router", "both"):
        out["router"] = {"router_lr_mult": args.fault_router_lr_mult, "batch_size": args.fault_batch_size,
                         "load_balancing_loss": False, "from_step": args.router_fault_start}
    return out


def save_checkpoint(model: MixtralForCausalLM, args: argparse.Namespace, step: int) -> None:
    ckpt = os.path.join(args.out, f"checkpoint-{step}")
    os.makedirs(ckpt, exist_ok=True)
    save_file(hf_state_dict(model, DTYPES[args.save_dtype]), os.path.join(ckpt, "model.safetensors"),
              metadata={"format": "pt"})
    with open(os.path.join(ckpt, "config.json"), "w") as fh:
        json.dump(model.cfg.to_hf(args.save_dtype), fh, indent=2, sort_keys=True)
        fh.write("\n")


@torch.no_grad()
def save_probe(model: MixtralForCausalLM, tokens: torch.Tensor, path: str) -> None:
    """Router inputs (post_attention_layernorm output) for a fixed token window."""
    _, _, router_inputs = model(tokens[None])
    tensors = {f"layers.{i}.router_input": x[0].float().contiguous() for i, x in enumerate(router_inputs)}
    tensors["tokens"] = tokens.to(torch.int64).contiguous()
    save_file(tensors, path, metadata={"format": "pt"})


def finite_or_none(x: float) -> float | None:
    """6 significant digits, and null for NaN/inf: JSON has no NaN literal."""
    return float(f"{x:.6g}") if math.isfinite(x) else None


def train(args: argparse.Namespace, argv: list[str]) -> dict:
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)
    cfg = MixtralConfig(
        hidden_size=args.hidden_size, intermediate_size=args.expert_ffn, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, head_dim=args.head_dim,
        num_local_experts=args.experts, num_experts_per_tok=args.top_k, max_position_embeddings=args.seq_len,
        router_aux_loss_coef=args.aux_loss_coef, arch=args.arch,
    )
    if cfg.dense and args.fault in ("router", "both"):
        raise SystemExit("a dense model has no router to fault")
    model = MixtralForCausalLM(cfg)
    opt = build_optimizer(model, args)
    corpus = load_stdlib_corpus(args.data_bytes)
    probe_tokens = corpus.probe_source[: args.probe_tokens].long()
    gen = torch.Generator().manual_seed(args.seed)
    attention_fault = args.fault in ("attention", "both")
    router_fault = args.fault in ("router", "both")

    monitor = None
    if args.live_every:
        from ckptscan.live import Monitor

        # The probe tokens' router inputs, captured at the first monitored step (step 0, as the probe file).
        monitor = Monitor(model, every=args.live_every, probe=probe_tokens[None], out=os.path.join(args.out, "live"),
                          config=cfg.to_hf("float32"))
    log_path = os.path.join(args.out, "train_log.jsonl")
    steps_logged, losses_logged = [], []
    t0 = time.time()
    with open(log_path, "w") as log:
        for step in range(args.steps + 1):
            if step % args.save_every == 0:
                save_checkpoint(model, args, step)
            if step == args.probe_step and not cfg.dense:
                save_probe(model, probe_tokens, os.path.join(args.out, "probe.safetensors"))
            if monitor is not None:
                monitor.step(step)  # the model after `step` updates, as checkpoint-{step}
            if step == args.steps or step == args.stop_at:
                break  # the last checkpoint is the model after `steps` updates
            set_attention_fault(model, args, attention_fault and step >= args.attention_fault_start)
            router_fault_on = router_fault and step >= args.router_fault_start
            lr = lr_at(step, args)
            for group in opt.param_groups:
                boost = group["is_router"] and router_fault_on
                group["lr"] = lr * (args.fault_router_lr_mult if boost else 1.0)
            batch_size = args.fault_batch_size if router_fault_on else args.batch_size
            aux_coef = 0.0 if router_fault_on else args.aux_loss_coef
            x, y = sample_batch(corpus.train, batch_size, args.seq_len, gen)
            logits, router_logits, _ = model(x)
            lm_loss = torch.nn.functional.cross_entropy(logits.view(-1, cfg.vocab_size), y.reshape(-1))
            loss = lm_loss
            log_z = torch.logsumexp(logits.float(), dim=-1)
            if args.z_loss > 0:
                loss = loss + args.z_loss * (log_z ** 2).mean()
            if aux_coef > 0 and router_logits:
                aux = load_balancing_loss(router_logits, cfg.num_local_experts, cfg.num_experts_per_tok)
                loss = loss + aux_coef * aux
            opt.zero_grad(set_to_none=True)
            loss.backward()
            max_norm = args.grad_clip if args.grad_clip > 0 else math.inf
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm).item()
            opt.step()
            # Step s in the log is the update that turns checkpoint-s into checkpoint-(s+1).
            if step % args.log_every == 0:
                rec = {"step": step, "loss": finite_or_none(lm_loss.item()),
                       "grad_norm": finite_or_none(grad_norm), "lr": float(f"{lr:.6g}"),
                       # The inside view: when softmax saturated, how far log Z drifted.
                       "max_attn_logit": finite_or_none(max(layer.self_attn.max_logit for layer in model.model.layers)),
                       "mean_log_z": finite_or_none(log_z.mean().item())}
                log.write(json.dumps(rec) + "\n")
                if monitor is not None:  # the same loss log as train_log.jsonl
                    monitor.record(step, rec["loss"], rec["lr"])
                steps_logged.append(step)
                losses_logged.append(rec["loss"])
    wall = time.time() - t0

    div = divergence_step(steps_logged, losses_logged)
    run = {
        "command": shlex.join(["python", "-m", "experiments.train", *argv]),
        "args": vars(args),
        "config": cfg.to_hf(args.save_dtype),
        "num_parameters": num_params(model),
        "data": corpus.info,
        "faults": fault_summary(args),
        "probe": {"tokens": args.probe_tokens, "from_checkpoint": args.probe_step, "source": corpus.info["probe_file"],
                  "keys": "layers.{i}.router_input [T, hidden_size] float32; tokens [T] int64 (the probe bytes)"},
        "divergence": {"step": div, "definition": "experiments/divergence.py (window 50, margin 0.5 nats)"},
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
    }
    with open(os.path.join(args.out, "run.json"), "w") as fh:
        json.dump(run, fh, indent=2)
        fh.write("\n")
    print(f"{args.out}: {step} steps in {wall:.0f}s, final loss {losses_logged[-1]}, divergence step {div}")
    return run


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    return train(parse_args(argv), argv)


if __name__ == "__main__":
    main()
