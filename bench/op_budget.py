"""Benchmark: what one `diff` costs a GPU, counted on the CPU (issue #50's proxies).

A `TorchDispatchMode` sees every op the scan dispatches. On a GPU each op that
is not a view is a kernel launch, each `_local_scalar_dense` (`.item()`,
`float()`, `bool()` of a tensor) a host synchronisation, and each linalg
solver call (`cholesky_ex`, `eigh`, …) hundreds of launches. Counted over one
`scan_pair` of the 1B Llama shape (hidden 2048, 32 heads / 4 KV heads, vocab
32,000) cut to a few layers, one worker, LM head included, after a warm-up.

    python bench/op_budget.py [--layers 4] [--json] [--sites]

Targets (issue #50): ≤ 100 kernel ops, ≤ 2 scalar reads and ≤ 2 linalg solver
calls a layer. The scan is counted as a GPU runs it: the LM head in the
row blocks a GPU takes (a CPU takes smaller, cache-sized ones: more ops,
each cheap) and the layers' small solves batched as on a GPU (a CPU solves
fewer at once, to bound their host memory on a small machine). `--sites` prints where the scalar reads and the most frequent
ops come from (file:line in ckptscan). `--json` ends with one JSON line:
{"kernel_ops_per_layer", "scalar_reads_per_layer", "solver_calls_per_layer", "layers"}.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from synthetic import ModelSpec, ensure_run  # noqa: E402

# Ops that launch no kernel: allocations, views and metadata, and the scalar read itself (counted apart).
NO_KERNEL = {"empty", "empty_strided", "empty_like", "lift_fresh", "resolve_conj", "resolve_neg", "_unsafe_view",
             "detach", "alias", "set_", "_local_scalar_dense"}
TARGETS = {"kernel_ops_per_layer": 100, "scalar_reads_per_layer": 2, "solver_calls_per_layer": 2}


def is_solver(name: str) -> bool:
    return name.startswith(("_linalg_", "linalg_")) and "norm" not in name and "check" not in name


class OpCount(TorchDispatchMode):
    """Kernel-launching ops by name, scalar reads, and (with `sites`) where each comes from."""

    def __init__(self, sites: bool = False) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.scalars = 0
        self.sites: Counter[str] | None = Counter() if sites else None

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__
        if name == "_local_scalar_dense":
            self.scalars += 1
            self._site("read")
        elif not func.is_view and name not in NO_KERNEL:
            self.ops[name] += 1
            self._site(name)
        return func(*args, **(kwargs or {}))

    def _site(self, what: str) -> None:
        if self.sites is None:
            return
        for frame in reversed(traceback.extract_stack(limit=30)):
            if "/ckptscan/" in frame.filename:
                self.sites[f"{what} {frame.filename.split('/ckptscan/')[-1]}:{frame.lineno}"] += 1
                return


# The shape: Llama-3.2-1B's widths (hidden 2048, 32 query / 4 KV heads, vocab 32,000).
def one_b_shape(layers: int) -> Any:
    return ModelSpec(f"llama-1b-{layers}l", "llama", layers, 2048, 32, 4, 5632, 32000)


def count(layers: int, workdir: Path, sites: bool = False, spec: Any = None) -> tuple[OpCount, int]:
    """The ops of one `scan_pair` of a run of `spec` (default: the 1B shape cut to `layers` layers)."""
    from ckptscan.detection.rules import Thresholds
    from ckptscan.monitors import output
    from ckptscan.pipeline.api import scan_pair
    from ckptscan.scan import ScanOptions, tasks

    spec = spec or one_b_shape(layers)
    a, b = ensure_run(spec, workdir, [100, 200])
    options = ScanOptions(device="cpu", workers=1)
    # The LM head's pass goes in row blocks sized for the device: small, cache-resident ones on a
    # CPU (a ~10x cheaper sweep there, each op a few µs), large ones on a GPU, where each sweep is a
    # launch. What a GPU launches is what is counted, so the head is counted in the GPU's blocks.
    # Likewise the layers whose small solves are batched together: as many as a GPU's batch holds.
    cpu_blocks, cpu_pending = output.CPU_BLOCK_ELEMENTS, tasks.CPU_PENDING_BYTES
    output.CPU_BLOCK_ELEMENTS, tasks.CPU_PENDING_BYTES = output.BLOCK_ELEMENTS, tasks.PENDING_BYTES
    try:
        scan_pair(a, b, options, thresholds=Thresholds())  # warm-up: caches, lazy imports
        with OpCount(sites) as counted:
            scan_pair(a, b, options, thresholds=Thresholds())
    finally:
        output.CPU_BLOCK_ELEMENTS, tasks.CPU_PENDING_BYTES = cpu_blocks, cpu_pending
    return counted, spec.layers


def figures(counted: OpCount, layers: int) -> dict[str, float]:
    total = sum(counted.ops.values())
    solvers = sum(n for name, n in counted.ops.items() if is_solver(name))
    return {"kernel_ops_per_layer": total / layers, "scalar_reads_per_layer": counted.scalars / layers,
            "solver_calls_per_layer": solvers / layers, "layers": layers}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/ckptscan-bench/op-budget"))
    parser.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    parser.add_argument("--sites", action="store_true", help="where the reads and ops come from")
    args = parser.parse_args()
    counted, layers = count(args.layers, args.workdir, args.sites)
    measured = figures(counted, layers)
    print(f"1B Llama shape cut to {layers} layers, one scan_pair, one worker, LM head included")
    print("most dispatched:", ", ".join(f"{name} {n}" for name, n in counted.ops.most_common(12)))
    if counted.sites is not None:
        for site, n in counted.sites.most_common(40):
            print(f"  {n:5d}  {site}")
    for key, target in TARGETS.items():
        value = measured[key]
        print(f"{key.replace('_', ' '):<26}{value:>8.1f}   target ≤ {target}   {'PASS' if value <= target else 'FAIL'}")
    if args.json:
        print(json.dumps(measured))


if __name__ == "__main__":
    main()
