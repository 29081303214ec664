import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pytest

# The experiments package lives at the repository root, beside ckptscan.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


@pytest.fixture
def corpus_run():
    """Writes a corpus run as experiments.corpus leaves it: `report` as its
    metrics.json, its faults in run.json and a flat, noisy loss log."""
    def write(corpus: Path, name: str, report, faults: dict) -> Path:
        run = corpus / name
        run.mkdir(parents=True)
        (run / "metrics.json").write_text(json.dumps(dataclasses.asdict(report)))
        (run / "run.json").write_text(json.dumps({"faults": faults}))
        rng = np.random.default_rng(len(name))
        lines = [json.dumps({"step": s, "loss": 2.0 + 0.01 * rng.standard_normal(),
                             "grad_norm": 1.0 + 0.01 * rng.standard_normal()}) for s in range(2001)]
        (run / "train_log.jsonl").write_text("\n".join(lines) + "\n")
        return run
    return write
