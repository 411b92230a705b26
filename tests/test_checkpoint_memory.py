"""scripts/checkpoint_memory.py: the figures of docs/checkpoints.md, pinned to the arithmetic written there."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "checkpoint_memory.py"


def test_release_geometries_and_cache_arithmetic():
    spec = importlib.util.spec_from_file_location("checkpoint_memory", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = {r["name"]: r for r in mod.rows(16384)}
    vl12, t12, t9, n3 = (rows[k] for k in ("Nano 12B v2 VL", "Nano 12B v2 (text)", "Nano 9B v2 (text)",
                                           "Nemotron 3 Nano 30B-A3B (text)"))
    assert vl12["kv"] == t12["kv"] == 6 * 2 * 8 * 128 * 2 * 16384 == 402_653_184
    assert vl12["ssm"] == 28 * (128 * 80 * 128 * 4 + 12288 * 3 * 2) == 148_865_024
    assert t9["kv"] == 4 * 2 * 8 * 128 * 2 * 16384 and t9["mamba"] == 27
    assert n3["kv"] == 6 * 2 * 2 * 128 * 2 * 16384 and n3["ssm"] == 23 * (64 * 64 * 128 * 4 + 6144 * 3 * 2)
    assert round(t12["params"] / 1e9, 2) == 12.31 and round(t9["params"] / 1e9, 2) == 8.89
    assert round(n3["params"] / 1e9, 1) == 31.6 and round(n3["active"] / 1e9, 1) == 3.6
    assert vl12["bf16"] == 2 * vl12["params"] and vl12["fp8"] < vl12["bf16"] and vl12["nvfp4"] < vl12["fp8"]
