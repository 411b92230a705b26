"""Fixtures for the reliability rows: one tiny random Nano-V2-VL checkpoint shared by every file here.

The app-level rows start their own `vl app` (see serving_helpers.py); nothing here touches GRADIO_TEMP_DIR or
other process-wide settings, so these tests can run in one session with tests/ui.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# media_fixtures.py (hand-made PNG headers, encrypted PDFs, encoded videos) is shared with tests/processing
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "processing"))


@pytest.fixture(scope="session")
def rel_tiny_dir(tmp_path_factory) -> Path:
    from tiny_models import make_tiny_vl_dir

    return Path(make_tiny_vl_dir(tmp_path_factory.mktemp("rel_tiny_vl")))
