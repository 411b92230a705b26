"""scripts/research/probe_token_position.py (the README's EVS diagnosis) on the shipped demo model, a few short clips."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not (REPO / "vl/demo/model.safetensors").exists(), reason="needs the shipped demo model")
def test_the_probe_counts_evs_budget_tokens_and_reports_both_figures():
    out = subprocess.run([sys.executable, str(REPO / "scripts/research/probe_token_position.py"), "--clips", "8",
                          "--frames", "8", "--threads", "1"], capture_output=True, text=True, timeout=300, check=True,
                         cwd=REPO).stdout
    # q=0.75 on 8 frames of 9 tokens keeps int(8 * 9 * 0.25) = 18 a clip; the first frame's 9 are not probed
    probe = re.search(r"(\d+) EVS-kept tokens .* at ([\d.]+)% on held-out clips \(train ([\d.]+)%, majority class "
                      r"([\d.]+)%, chance 11\.1%\)", out)
    assert probe, out
    assert int(probe[1]) == 8 * 9
    assert all(0 <= float(v) <= 100 for v in probe.groups()[1:])
    mover = re.search(r"moving shape's centre cell in ([\d.]+)% of frames 1\.\. \((\d+) of the (\d+) kept tokens, "
                      r"([\d.]+) kept a frame\)", out)
    assert mover, out
    assert int(mover[3]) == 72 and mover[4] == f"{72 / (8 * 7):.2f}"
    assert float(mover[1]) == pytest.approx(100 * int(mover[2]) / (8 * 7), abs=0.05)
