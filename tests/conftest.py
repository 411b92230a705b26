import sys
from pathlib import Path

import pytest
import torch

# tests/tiny_models.py and friends; the repository root too, so that a test folder named like a package
# (tests/token_reduction) never shadows the package as a namespace portion; scripts/ last, so that the tools
# above the library (scripts/demo_eval.py) import by name
_ROOT = Path(__file__).parent.parent
sys.path[:0] = [str(Path(__file__).parent), str(_ROOT), str(_ROOT / "scripts")]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def cuda_only():
    return pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; this machine has none")
