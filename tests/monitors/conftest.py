import sys
from pathlib import Path

import pytest
import torch

# The monitor tests import their brute-force references as `dense_reference`.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def one_blas_thread():
    """The matrices here are tiny (≤ 256²): one BLAS/LAPACK thread is fastest,
    and on a busy 2-core machine two threads can be 10–30× slower."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
