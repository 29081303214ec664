"""WeightWatcher's default `analyze()` on the W_q/W_k matrices of some layers.

Run by bench/scale.py with a Python that has `weightwatcher` installed (a
separate venv, so its pandas/matplotlib/scikit-learn never touch ckptscan's).
Prints one JSON line: seconds spent in analyze(), and what was analysed.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from safetensors import safe_open


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--layers", default="0,1")
    args = parser.parse_args()
    import weightwatcher

    index = json.loads((args.checkpoint / "model.safetensors.index.json").read_text())["weight_map"]
    linears = []
    for layer in (int(x) for x in args.layers.split(",")):
        for proj in ("q_proj", "k_proj"):
            name = f"model.layers.{layer}.self_attn.{proj}.weight"
            with safe_open(args.checkpoint / index[name], "pt") as f:
                weight = f.get_tensor(name).float()
            linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
            linear.weight.data = weight
            linears.append(linear)
    model = torch.nn.Sequential(*linears)
    watcher = weightwatcher.WeightWatcher(model=model)
    start = time.perf_counter()
    details = watcher.analyze()
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "matrices": len(linears), "rows": len(details),
                      "weightwatcher": weightwatcher.__version__}))


if __name__ == "__main__":
    main()
