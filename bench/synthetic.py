"""Synthetic full-size checkpoints for the benchmarks, generated once and cached.

Every tensor a real Hugging Face checkpoint of the shape has is present, in
bf16, in sharded safetensors files with an index, so the files are as large
as the real ones (a Llama-7B checkpoint is ~13.5 GB). Nothing is zero:

* monitored tensors (q_proj, k_proj, routers) are fresh Gaussian draws per
  tensor; each later checkpoint adds a small fresh random update (std
  `UPDATE_STD`, about an Adam step at lr 3e-4 on weights of std 0.02), so
  every pair has a genuine full-rank difference;
* the unmonitored bulk (v/o projections, MLPs, embeddings, norms) is one
  random block reused with a random offset and a per-tensor random scale:
  ckptscan never reads it, and generating 13 GB of fresh Gaussians per
  checkpoint would dominate the benchmark's set-up time.

A checkpoint directory is reused when its `bench-spec.json` matches the spec
that would be written; a half-written one (no spec file) is rewritten.
Writing is streamed tensor by tensor, so memory stays at about one tensor.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import torch

UPDATE_STD = 3e-4
WEIGHT_STD = 0.02
SHARD_BYTES = 5 * 1024**3
_BULK_BLOCK = 1 << 26  # 64 Mi bf16 values (128 MB) of random bulk data


@dataclass(frozen=True)
class ModelSpec:
    name: str
    model_type: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int  # 0: no MLP tensors (an attention + router slice)
    vocab: int
    experts: int = 0
    top_k: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def config(self) -> dict:
        config = {
            "model_type": self.model_type,
            "architectures": ["MixtralForCausalLM" if self.experts else "LlamaForCausalLM"],
            "hidden_size": self.hidden,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "num_hidden_layers": self.layers,
            "intermediate_size": self.intermediate,
            "vocab_size": self.vocab,
            "torch_dtype": "bfloat16",
            "rms_norm_eps": 1e-5,
        }
        if self.experts:
            config.update(num_local_experts=self.experts, num_experts_per_tok=self.top_k)
        return config

    def tensors(self) -> Iterator[tuple[str, tuple[int, ...], bool]]:
        """(name, shape, monitored) in the order HF writes them."""
        d, r = self.hidden, self.head_dim
        yield "model.embed_tokens.weight", (self.vocab, d), False
        for i in range(self.layers):
            p = f"model.layers.{i}."
            yield p + "self_attn.q_proj.weight", (self.heads * r, d), True
            yield p + "self_attn.k_proj.weight", (self.kv_heads * r, d), True
            yield p + "self_attn.v_proj.weight", (self.kv_heads * r, d), False
            yield p + "self_attn.o_proj.weight", (d, self.heads * r), False
            if self.experts:
                yield p + "block_sparse_moe.gate.weight", (self.experts, d), True
            if self.intermediate:
                yield p + "mlp.gate_proj.weight", (self.intermediate, d), False
                yield p + "mlp.up_proj.weight", (self.intermediate, d), False
                yield p + "mlp.down_proj.weight", (d, self.intermediate), False
            yield p + "input_layernorm.weight", (d,), False
            yield p + "post_attention_layernorm.weight", (d,), False
        yield "model.norm.weight", (d,), False
        yield "lm_head.weight", (self.vocab, d), False

    def total_bytes(self) -> int:
        return sum(2 * _numel(shape) for _, shape, _ in self.tensors())

    def monitored_bytes(self) -> int:
        return sum(2 * _numel(shape) for _, shape, monitored in self.tensors() if monitored)


LLAMA_7B = ModelSpec("llama-7b", "llama", 32, 4096, 32, 32, 11008, 32000)
# Mixtral-8x7B's attention and routers (GQA 32/8, 8 experts); the expert MLPs
# (~90 GB, never read) are left out: an "attention + router slice".
MIXTRAL_SLICE = ModelSpec("mixtral-8x7b-slice", "mixtral", 32, 4096, 32, 8, 0, 32000, experts=8, top_k=2)
# TinyLlama-1.1B's shape: 22 layers, hidden 2048, 32 heads / 4 KV heads.
LLAMA_1B = ModelSpec("llama-1.1b", "llama", 22, 2048, 32, 4, 5632, 32000)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def ensure_run(spec: ModelSpec, root: Path, steps: list[int], seed: int = 0) -> list[Path]:
    """Checkpoints `root/checkpoint-{step}` of one training run, oldest first.

    Monitored tensors follow a random walk (each step adds a fresh update),
    so checkpoint k depends on k−1: a missing one means regenerating the
    tail of the run from the last complete one.
    """
    root.mkdir(parents=True, exist_ok=True)
    paths = [root / f"checkpoint-{step}" for step in steps]
    specs = [{"spec": asdict(spec), "seed": seed, "step": step, "update_std": UPDATE_STD} for step in steps]
    complete = 0
    while complete < len(paths) and _spec_matches(paths[complete], specs[complete]):
        complete += 1
    if complete == len(paths):
        return paths
    _check_space(root, spec.total_bytes() * (len(paths) - complete))
    bulk = _bulk_block(seed)
    state = None if complete == 0 else _read_monitored(spec, paths[complete - 1])
    gen = torch.Generator().manual_seed(seed * 1_000_003 + complete)
    for path, meta in zip(paths[complete:], specs[complete:]):
        state = _next_monitored(spec, state, gen)
        _write_checkpoint(spec, path, state, bulk, gen, meta)
    return paths


def _spec_matches(path: Path, spec: dict) -> bool:
    marker = path / "bench-spec.json"
    return marker.is_file() and json.loads(marker.read_text()) == spec


def _check_space(root: Path, needed: int) -> None:
    free = shutil.disk_usage(root).free
    margin = 8 * 1024**3
    if free < needed + margin:
        raise SystemExit(f"not enough disk under {root}: need {needed / 1e9:.1f} GB + {margin / 1e9:.0f} GB margin, "
                         f"{free / 1e9:.1f} GB free")


def _bulk_block(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed + 17)
    return (torch.randn(_BULK_BLOCK, generator=gen) * WEIGHT_STD).to(torch.bfloat16)


def _next_monitored(spec: ModelSpec, state: dict[str, torch.Tensor] | None,
                    gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Fresh Gaussians the first time; afterwards the previous values plus a
    fresh random update. Kept in bf16, as stored."""
    out = {}
    for name, shape, monitored in spec.tensors():
        if not monitored:
            continue
        if state is None:
            out[name] = (torch.randn(shape, generator=gen) * WEIGHT_STD).to(torch.bfloat16)
        else:
            step = torch.randn(shape, generator=gen) * UPDATE_STD
            out[name] = (state[name].float() + step).to(torch.bfloat16)
    return out


def _read_monitored(spec: ModelSpec, path: Path) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    index = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
    out = {}
    for name, _, monitored in spec.tensors():
        if monitored:
            with safe_open(path / index[name], "pt") as f:
                out[name] = f.get_tensor(name)
    return out


def _bulk_tensor(shape: tuple[int, ...], bulk: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """`shape` values from the bulk block at a random offset, times a random scale."""
    n = _numel(shape)
    offset = int(torch.randint(0, bulk.numel(), (1,), generator=gen))
    reps = (offset + n + bulk.numel() - 1) // bulk.numel()
    flat = bulk.repeat(reps)[offset: offset + n] if reps > 1 else bulk[offset: offset + n]
    scale = float(torch.empty(1).uniform_(0.5, 2.0, generator=gen))
    if len(shape) == 1:  # norm gains sit around 1
        return (1.0 + flat.float() * scale).to(torch.bfloat16)
    return (flat * scale).reshape(shape)


def _write_checkpoint(spec: ModelSpec, path: Path, monitored: dict[str, torch.Tensor], bulk: torch.Tensor,
                      gen: torch.Generator, meta: dict) -> None:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(spec.config(), indent=2))
    # Split into shards of about SHARD_BYTES, in tensor order, as HF does.
    shards: list[list[tuple[str, tuple[int, ...], bool]]] = [[]]
    size = 0
    for entry in spec.tensors():
        nbytes = 2 * _numel(entry[1])
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(entry)
        size += nbytes
    weight_map = {}
    for i, entries in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        _write_shard(path / file, entries, monitored, bulk, gen)
        weight_map.update({name: file for name, _, _ in entries})
    index = {"metadata": {"total_size": spec.total_bytes()}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (path / "bench-spec.json").write_text(json.dumps(meta))  # last: marks the checkpoint complete


def _write_shard(file: Path, entries, monitored: dict[str, torch.Tensor], bulk: torch.Tensor,
                 gen: torch.Generator) -> None:
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, _ in entries:
        nbytes = 2 * _numel(shape)
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with open(file, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name, shape, is_monitored in entries:
            tensor = monitored[name] if is_monitored else _bulk_tensor(shape, bulk, gen)
            f.write(tensor.contiguous().view(torch.int16).numpy().tobytes())
        f.flush()
        os.fsync(f.fileno())
