"""Matrix row S11 in CI: a 35-second version of scripts/soak.py against `vl app` on the tiny checkpoint.

The same harness and criteria as the 10-minute soak (mixed valid and bad requests at about 1 per second, a
fifth of them bad; errors only for the bad ones; RSS growth under 10 %; fd, process and temp counts flat),
just shorter: about 80 s with the app's start-up. The full run's figures are in docs/reliability.md.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "soak.py"


def _soak_module():
    spec = importlib.util.spec_from_file_location("vl_soak_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_s11_short_soak_errors_only_for_bad_inputs_and_resources_flat(rel_tiny_dir, tmp_path):
    soak = _soak_module()
    out = tmp_path / "soak.json"
    args = soak.parse_args(["--model", str(rel_tiny_dir), "--duration", "35", "--rate", "1", "--settle", "2",
                            "--sample-every", "5", "--out", str(out)])
    summary = soak.run(args)
    print({k: summary.get(k) for k in ("requests_sent", "memory_growth", "fd_growth_server", "process_growth",
                                       "crashes_contained", "checks")})
    assert summary["server_alive_at_end"], summary.get("app_log_tail")
    assert summary["valid"]["errors"] == [], summary["valid"]["errors"]
    assert summary["bad"]["internal_errors"] == [] and summary["bad"]["answered_anyway"] == []
    assert summary["bad"]["sent"] >= 5 and summary["valid"]["sent"] >= 25
    assert len({k for k, v in summary["by_class"].items() if v["refused"]}) >= 5, summary["by_class"]
    failed = [k for k, ok in summary["checks"].items() if not ok]
    assert summary["passed"], f"failed checks: {failed}; memory growth {summary.get('memory_growth')}"
