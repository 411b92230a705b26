import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import torch

# tests/tiny_models.py and friends; the repository root too, so that a test folder named like a package
# (tests/token_reduction) never shadows the package as a namespace portion; scripts/ last, so that the tools
# above the library (scripts/demo_eval.py) import by name
_ROOT = Path(__file__).parent.parent
sys.path[:0] = [str(Path(__file__).parent), str(_ROOT), str(_ROOT / "scripts")]


# A full run writes about 4 GB of tiny checkpoints under the temporary folder at its peak (pyproject.toml keeps only
# failed tests' folders afterwards); say so at the start when the disk cannot hold that, instead of leaving a run of
# "No space left on device" errors to explain it.
NEEDED_FREE_BYTES = 6 << 30


def pytest_sessionstart(session):
    free = shutil.disk_usage(tempfile.gettempdir()).free
    if free < NEEDED_FREE_BYTES:  # written even under -q (`make test`), where the report header is not
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        text = (f"WARNING: {free / 2**30:.1f} GiB free under {tempfile.gettempdir()}; a full run needs about "
                f"{NEEDED_FREE_BYTES >> 30} GiB for its tiny checkpoints: expect 'No space left on device' errors")
        if reporter is not None:
            reporter.write_line(text, yellow=True)
        else:
            print(text, file=sys.stderr)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def cuda_only():
    return pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; this machine has none")
