import sys
from pathlib import Path

import pytest
import torch

# tests/tiny_models.py and friends; the repository root too, so that a test folder named like a package
# (tests/token_reduction) never shadows the package as a namespace portion
sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent.parent)]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def cuda_only():
    return pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; this machine has none")
