"""The hand-written floor for `ckptscan diff` on a Llama-shaped safetensors
pair: read each layer's q_proj/k_proj (and its input norm) of both
checkpoints and solve the same per-head cores (float32 Grams, as `diff`'s
default precision) and logit scales with ckptscan's monitor functions,
layers shared out over two threads with one torch thread each (as a
competent user would on 2 cores); and read the LM head and final norm of
both once, for the output family's one pass (ckptscan's `head_pair`, in the
row blocks ckptscan uses). No layout resolution, no checks, no report.

    python bench/minimal_diff.py OLDER NEWER
"""

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from safetensors import safe_open

from ckptscan.monitors.attention import logit_scale, qk_spectra
from ckptscan.monitors.output import head_pair
from ckptscan.monitors.spectral import spectral_stats


def read(files: dict[str, str], folder: Path, key: str) -> torch.Tensor:
    with safe_open(folder / files[key], "pt") as f:
        return f.get_tensor(key)


def layer_weights(files: dict[str, str], folder: Path, layer: int, heads: int, kv_heads: int, head_dim: int):
    prefix = f"model.layers.{layer}."
    q = read(files, folder, prefix + "self_attn.q_proj.weight").float().reshape(heads, head_dim, -1)
    k = read(files, folder, prefix + "self_attn.k_proj.weight").float().reshape(kv_heads, head_dim, -1)
    return q, k, read(files, folder, prefix + "input_layernorm.weight").double()


def main() -> None:
    older, newer = Path(sys.argv[1]), Path(sys.argv[2])
    config = json.loads((older / "config.json").read_text())
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config["hidden_size"] // heads
    files_a = json.loads((older / "model.safetensors.index.json").read_text())["weight_map"]
    files_b = json.loads((newer / "model.safetensors.index.json").read_text())["weight_map"]
    torch.set_num_threads(1)

    def layer_entropy(layer: int) -> float:
        qa, ka, _ = layer_weights(files_a, older, layer, heads, kv_heads, head_dim)
        qb, kb, gain = layer_weights(files_b, newer, layer, heads, kv_heads, head_dim)
        stats = spectral_stats(qk_spectra(qa, ka, qb, kb, compute_dtype=torch.float32).delta2)
        logit_scale(qb, kb, input_gain=gain, compute_dtype=torch.float32)
        return float(stats.normalized_entropy.min())

    def output_scale() -> float:
        head = "lm_head.weight" if "lm_head.weight" in files_b else "model.embed_tokens.weight"
        pair = head_pair(read(files_a, older, head), read(files_b, newer, head),
                         read(files_b, newer, "model.norm.weight"))
        return pair.stats.max_row

    with ThreadPoolExecutor(2) as pool:
        head = pool.submit(output_scale)
        worst = min(pool.map(layer_entropy, range(config["num_hidden_layers"])))
    print(f"lowest normalised Δ2 entropy: {worst:.4f}; largest output logit scale {head.result():.4f}")


if __name__ == "__main__":
    main()
