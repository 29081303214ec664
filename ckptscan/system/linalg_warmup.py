"""Load torch's CUDA solvers on one thread before worker threads call them.

torch loads its CUDA linear algebra (the cuSOLVER and MAGMA kernels of
`torch.linalg`) lazily, at the first such call of the process, and that
first load is not safe from two threads at once: the second raises
`RuntimeError: lazy wrapper should be called at most once`. Measured on an
H200 (torch 2.11): `ckptscan diff --device cuda` crashed so, in
`torch.linalg.cholesky_ex` called from two `ckptscan-layer` worker threads,
twice in two fresh processes; a process whose main thread had already made
one CUDA linalg call ran.

So before a pool of workers starts on a CUDA device (`resolve_device`,
`LocalExecutor.map`), `warm_linalg` makes each solver call the monitors make
(`cholesky_ex`, `eigh`, `eigvalsh`), in both compute precisions, on a 2 × 2
matrix and a batch of them, on the calling thread, and waits for them: a millisecond once the
library is loaded, the load itself (which the first layer would pay anyway)
otherwise. Once per device and process; thread-safe.
"""

from __future__ import annotations

import threading

import torch

_lock = threading.Lock()
# device -> the thread that warmed it (read by the tests: warmed before the pool, on the caller's thread)
warmed: dict[str, int] = {}


def warm_linalg(device: str) -> bool:
    """Make the monitors' solver calls once on `device` from this thread;
    True when they ran now, False when the device was warm already. Works on
    any device (the CPU needs no warming; the tests run it there)."""
    if device in warmed:
        return False
    with _lock:
        if device in warmed:
            return False
        for dtype in (torch.float32, torch.float64):
            spd = torch.eye(2, dtype=dtype, device=device) * 2  # symmetric positive definite: every call succeeds
            for matrices in (spd, spd.expand(3, 2, 2)):  # one matrix, and a batch as the per-head solves are
                torch.linalg.cholesky_ex(matrices)
                torch.linalg.eigh(matrices)
                torch.linalg.eigvalsh(matrices)
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)
        warmed[device] = threading.get_ident()
    return True
