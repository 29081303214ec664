"""Regenerate every run under sample_checkpoints/ (one command, deterministic).

    python -m experiments.make_samples                 # the shipped sample runs
    python -m experiments.make_samples --out-dir /tmp/big --hidden-size 128 --layers 4 \\
        --steps 10000 --save-every 250 --save-dtype float32   # a larger variant

Any extra flag is passed to every run after the run's own flags, so it
overrides them (see `python -m experiments.train --help`). The fault strengths
below were tuned for the default tiny model; a larger model or a different
schedule may need them re-tuned (check the divergence steps printed at the end).
Runs are trained one after another on one thread: same Python, same torch,
same bytes.
"""

import argparse
import os
import shutil
import subprocess
import time

from experiments.train import main as train_main

# Each run is the healthy recipe plus the flags that inject its fault.
RUNS: dict[str, list[str]] = {
    "healthy": [],
    # bf16-style flash-attention fault in every layer from step 0: D = rowsum(dO * O)
    # from an O truncated toward zero to 2 mantissa bits. (bf16 keeps 7; at this
    # size and step count 7 bits does not diverge, see sample_checkpoints/README.md.)
    "attention_fault": ["--fault", "attention", "--fault-mantissa-bits", "2", "--fault-rounding", "zero"],
    # Identical to healthy up to step 1000, then router LR x100, batch 2, no
    # load-balancing loss.
    "router_fault": ["--fault", "router", "--router-fault-start", "1000", "--fault-router-lr-mult", "100",
                     "--fault-batch-size", "2"],
    # Both mechanisms. The router fault keeps batch 16 here: at batch 2 the
    # minibatch noise swamps the coherent rounding bias and the attention fault
    # never develops (measured; see the README).
    "both_faults": ["--fault", "both", "--fault-mantissa-bits", "2", "--fault-rounding", "zero",
                    "--router-fault-start", "1000", "--fault-router-lr-mult", "100", "--fault-batch-size", "16"],
    # The attention fault confined to layer 0: that layer's update spectra
    # collapse, the loss never diverges.
    "silent_fault": ["--fault", "attention", "--fault-mantissa-bits", "1", "--fault-rounding", "zero",
                     "--fault-layers", "0"],
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", default="sample_checkpoints")
    p.add_argument("--only", nargs="*", choices=list(RUNS), help="regenerate only these runs")
    args, extra = p.parse_known_args()
    summary = {}
    t0 = time.time()
    for name in args.only or RUNS:
        out = os.path.join(args.out_dir, name)
        shutil.rmtree(out, ignore_errors=True)  # no stale checkpoints from an older recipe
        run = train_main(["--out", out, *RUNS[name], *extra])
        summary[name] = run["divergence"]["step"]
    print(f"all runs in {time.time() - t0:.0f}s")
    for name, step in summary.items():
        print(f"  {name:16s} divergence step: {step if step is not None else 'none'}")
    du = subprocess.run(["du", "-cb", args.out_dir], capture_output=True, text=True).stdout.splitlines()[-1]
    print(f"size: {du}")


if __name__ == "__main__":
    main()
