"""`vl bench` runs end to end (a smoke run: the figures themselves are not asserted, they are measured)."""

import json

from vl.bench import cache_bytes, CONFIGS, main


def test_bench_quick_writes_a_table_and_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["--quick", "--configs", "tiny", "--dtypes", "fp32", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    metrics = {r.get("metric") for r in rows}
    assert "prefill tok/s @256" in metrics and "decode tok/s after 64" in metrics
    assert all(r["ours"] > 0 and r["transformers"] > 0 for r in rows if "ours" in r)
    assert "ratio" in capsys.readouterr().out


def test_hybrid_cache_is_a_fraction_of_an_all_attention_cache():
    r = cache_bytes(CONFIGS["180m"](), 32768)
    assert r["ratio"] <= 0.2  # issue 5: the hybrid cache at 32k is at most 1/5 of an all-attention model's
