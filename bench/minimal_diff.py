"""The hand-written floor for `ckptscan diff` on a Llama-shaped safetensors
pair: read each layer's q_proj/k_proj of both checkpoints and solve the
same per-head cores (float32 Grams, as `diff`'s default precision) with
ckptscan's monitor function, layers shared out over two threads with one
torch thread each (as a competent user would on 2 cores). No layout
resolution, no checks, no report.

    python bench/minimal_diff.py OLDER NEWER
"""

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from safetensors import safe_open

from ckptscan.monitors.attention import qk_spectra
from ckptscan.monitors.spectral import spectral_stats


def layer_weights(files: dict[str, str], folder: Path, layer: int, heads: int, kv_heads: int, head_dim: int):
    out = []
    for name, count in (("q_proj", heads), ("k_proj", kv_heads)):
        key = f"model.layers.{layer}.self_attn.{name}.weight"
        with safe_open(folder / files[key], "pt") as f:
            out.append(f.get_tensor(key).float().reshape(count, head_dim, -1))
    return out


def main() -> None:
    older, newer = Path(sys.argv[1]), Path(sys.argv[2])
    config = json.loads((older / "config.json").read_text())
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config["hidden_size"] // heads
    files_a = json.loads((older / "model.safetensors.index.json").read_text())["weight_map"]
    files_b = json.loads((newer / "model.safetensors.index.json").read_text())["weight_map"]
    torch.set_num_threads(1)

    def layer_entropy(layer: int) -> float:
        qa, ka = layer_weights(files_a, older, layer, heads, kv_heads, head_dim)
        qb, kb = layer_weights(files_b, newer, layer, heads, kv_heads, head_dim)
        stats = spectral_stats(qk_spectra(qa, ka, qb, kb, compute_dtype=torch.float32).delta2)
        return float(stats.normalized_entropy.min())

    with ThreadPoolExecutor(2) as pool:
        worst = min(pool.map(layer_entropy, range(config["num_hidden_layers"])))
    print(f"lowest normalised Δ2 entropy: {worst:.4f}")


if __name__ == "__main__":
    main()
