"""Live mode: the offline monitors inside the training loop (see monitor.py).

    from ckptscan.live import Monitor            # a plain PyTorch loop
    from ckptscan.live import MonitorOptions     # its options as one value
    from ckptscan.live import TrainerCallback    # Hugging Face Trainer (extra: ckptscan[hf])
    from ckptscan.live import LightningCallback  # PyTorch Lightning (extra: ckptscan[lightning])

Exported lazily: importing `ckptscan.live` pulls in neither transformers
nor lightning; each callback imports its framework when first used.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "Monitor": "ckptscan.live.monitor",
    "Alert": "ckptscan.live.monitor",
    "MonitorOptions": "ckptscan.live.monitor_options",
    "TrainerCallback": "ckptscan.live.hf",
    "LightningCallback": "ckptscan.live.lightning",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ckptscan.live' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
