"""The benchmarks' tests share the tiny quantized checkpoints of tests/quant (tiny_quant.py: built once per session)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "quant"))
