"""Writers of small checkpoints in real on-disk layouts, for tests.

Weights are random (never zeros) and deterministic per seed.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file


def random_weights(shape: tuple[int, ...], seed: int, scale: float = 0.02) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=torch.float64) * scale


def updated(tensors: dict[str, torch.Tensor], scale: float, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Every tensor plus `scale` times standard normal noise: the next checkpoint of a run."""
    return {k: v + scale * torch.randn(v.shape, generator=generator, dtype=v.dtype) for k, v in tensors.items()}


def next_checkpoint(tensors: dict[str, torch.Tensor], seed: int, scale: float = 0.004) -> dict[str, torch.Tensor]:
    """The checkpoint after `tensors` in one run: each weight moved by a fifth
    of its own scale (random_weights' 0.02), as training moves it. Two
    independent draws are not an update: ckptscan flags them as different runs."""
    return updated(tensors, scale, torch.Generator().manual_seed(seed))


def write_hf_checkpoint(
    directory: Path,
    tensors: dict[str, torch.Tensor],
    config: dict | None,
    shards: int = 1,
    dtype: torch.dtype = torch.float32,
) -> Path:
    """A Hugging Face checkpoint directory: config.json plus model.safetensors,
    or `shards` files model-0000i-of-0000n.safetensors with an index."""
    directory.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (directory / "config.json").write_text(json.dumps(config))
    stored = {k: v.to(dtype).contiguous() for k, v in tensors.items()}
    if shards == 1:
        save_file(stored, directory / "model.safetensors", metadata={"format": "pt"})
        return directory
    names = sorted(stored)
    weight_map = {}
    for i in range(shards):
        shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: stored[n] for n in names[i::shards]}
        save_file(part, directory / shard, metadata={"format": "pt"})
        weight_map.update({n: shard for n in part})
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in stored.values())},
             "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return directory


def llama_config(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=None, experts=None, model_type=None) -> dict:
    config = {
        "model_type": model_type or ("mixtral" if experts else "llama"),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "num_hidden_layers": layers,
        "vocab_size": 32,
    }
    if head_dim is not None:
        config["head_dim"] = head_dim
    if experts:
        config["num_local_experts"] = experts
        config["num_experts_per_tok"] = 2
    return config


def llama_tensors(config: dict, seed: int, router_key: str = "block_sparse_moe.gate.weight") -> dict[str, torch.Tensor]:
    """q/k/v/o projections (and a router) for each layer, HF naming."""
    d, h, g = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    r = config.get("head_dim") or d // h
    tensors = {"model.embed_tokens.weight": random_weights((config["vocab_size"], d), seed)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        s = seed * 1000 + i * 10
        tensors[p + "self_attn.q_proj.weight"] = random_weights((h * r, d), s + 1)
        tensors[p + "self_attn.k_proj.weight"] = random_weights((g * r, d), s + 2)
        tensors[p + "self_attn.v_proj.weight"] = random_weights((g * r, d), s + 3)
        tensors[p + "self_attn.o_proj.weight"] = random_weights((d, h * r), s + 4)
        tensors[p + "input_layernorm.weight"] = torch.ones(d, dtype=torch.float64)
        if config.get("num_local_experts") or config.get("num_experts"):
            e = config.get("num_local_experts") or config.get("num_experts")
            tensors[p + router_key] = random_weights((e, d), s + 5)
    return tensors
