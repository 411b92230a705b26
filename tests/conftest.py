import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests/tiny_models.py and friends


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def cuda_only():
    return pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; this machine has none")
