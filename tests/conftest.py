import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def cuda_only():
    return pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; CPU-only machine")
