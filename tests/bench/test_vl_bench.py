"""`vl bench` runs end to end (a smoke run: the figures themselves are not asserted, they are measured)."""

import json

import pytest

from vl.bench.run import cache_bytes, CONFIGS, main


def test_bench_quick_writes_a_table_and_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["--quick", "--configs", "tiny", "--dtypes", "fp32", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    metrics = {r.get("metric") for r in rows}
    assert "prefill tok/s @256" in metrics and "decode tok/s after 64" in metrics
    assert all(r["ours"] > 0 and r["transformers"] > 0 for r in rows if "ours" in r)
    decode = next(r for r in rows if r.get("metric") == "decode tok/s after 64")
    assert decode["ours_weight_GBps"] > 0 and decode["copy_GBps"] > 0  # bandwidth, against a copy in the same rounds
    out = capsys.readouterr().out
    assert "ratio" in out and "of copy" in out


def test_bench_times_the_fused_step_next_to_the_modules(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["--quick", "--configs", "tiny", "--dtypes", "fp32", "--decode", "fused,modules", "--json",
                 str(out)]) == 0
    rows = [r for r in json.loads(out.read_text()) if "decode" in r]
    assert {(r["metric"], r["decode"]) for r in rows} == {("decode tok/s after 64", "fused"),
                                                          ("decode tok/s after 64 (modules)", "modules")}
    printed = capsys.readouterr().out
    assert "fused decode (the default): " in printed
    from vl.runtime.cpu.matmul import sparse_down_status
    assert f"ReLU^2 down_proj: {sparse_down_status()}" in printed  # the layout the decode rows ran with
    assert "prefill SSD scan: " in printed  # which scan the prefill rows ran (C++ or the reference)


def test_the_old_decode_mode_name_eager_is_fused_with_a_warning(tmp_path, capsys):
    """`--decode eager,modules` (eager: the old name of fused) times the same rows as `fused,modules`, saying so;
    an unknown mode is a usage error before anything is built."""
    out = tmp_path / "bench.json"
    with pytest.warns(DeprecationWarning, match="decode mode 'eager' is now 'fused'"):
        assert main(["--quick", "--configs", "tiny", "--dtypes", "fp32", "--decode", "eager,modules", "--json",
                     str(out)]) == 0
    assert {r["decode"] for r in json.loads(out.read_text()) if "decode" in r} == {"fused", "modules"}
    assert "--decode eager is now fused" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["--quick", "--configs", "tiny", "--decode", "fused,fast"])
    assert e.value.code == 2 and "decode mode 'fast'" in capsys.readouterr().err


def test_a_missing_work_dir_is_made(tmp_path):
    work = tmp_path / "new" / "work"
    assert main(["--quick", "--configs", "tiny", "--dtypes", "fp32", "--work-dir", str(work)]) == 0
    assert work.is_dir()


def test_hybrid_cache_is_a_fraction_of_an_all_attention_cache():
    r = cache_bytes(CONFIGS["180m"](), 32768)
    assert r["ratio"] <= 0.2  # the hybrid cache at 32k is at most 1/5 of an all-attention model's


def test_bench_formats_and_a_missing_llama_cpp(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["--quick", "--configs", "tiny", "--dtypes", "bf16", "--formats", "fp8,nvfp4", "--llama-cpp",
                 str(tmp_path / "no-llama"), "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    fmt_rows = [r for r in rows if r.get("format")]
    assert {r["format"] for r in fmt_rows} == {"fp8", "nvfp4"}
    dec = {r["format"]: r for r in fmt_rows if r["metric"].startswith("decode")}
    # resident weights: the packed Linears hold 1 byte (FP8) / 0.5 byte + a scale per 16 (NVFP4) per weight
    assert dec["fp8"]["packed_bytes"] / dec["fp8"]["packed_as_bf16_bytes"] < 0.51
    assert dec["nvfp4"]["packed_bytes"] / dec["nvfp4"]["packed_as_bf16_bytes"] < 0.29
    assert dec["nvfp4"]["resident_bytes"] < dec["fp8"]["resident_bytes"] < dec["fp8"]["dense_resident_bytes"]
    text = capsys.readouterr()
    assert "llama.cpp skipped: no executable llama-bench" in text.out + text.err


def test_llama_cpp_runner_reads_llama_bench_json(tmp_path):
    """The llama-bench call and its JSON, with a stand-in executable (the real one is measured by `vl bench`)."""
    from vl.bench.llama_cpp import LlamaCpp

    (tmp_path / "build" / "bin").mkdir(parents=True)
    fake = tmp_path / "build" / "bin" / "llama-bench"
    fake.write_text("#!/bin/sh\necho \"$@\" > \"$(dirname \"$0\")/args\"\n"
                    "echo '[{\"n_prompt\": 0, \"n_gen\": 16, \"n_depth\": 128, \"avg_ts\": 42.5}]'\n")
    fake.chmod(0o755)
    (tmp_path / "convert_hf_to_gguf.py").write_text("")
    lc = LlamaCpp(tmp_path)
    assert lc.tokens_per_s(tmp_path / "m.gguf", gen=16, depth=128, threads=2) == 42.5
    args = (tmp_path / "build" / "bin" / "args").read_text().split()
    assert args[args.index("-d") + 1] == "128" and args[args.index("-t") + 1] == "2"
    assert args[args.index("-p") + 1] == "0" and args[args.index("-n") + 1] == "16"
    assert "--repack" not in args  # llama-bench's default: its extra buffers (AMX int8 where the CPU has it)
    with pytest.raises(RuntimeError, match="no run with n_prompt=64"):  # the stand-in answers only the gen run
        lc.tokens_per_s(tmp_path / "m.gguf", prompt=64, threads=1, repack=False)
    args = (tmp_path / "build" / "bin" / "args").read_text().split()
    assert args[args.index("--repack") + 1] == "0"


def test_interleaved_rounds_rotate_and_paired_ratios_are_per_round():
    from vl.bench.run import format_table, interleaved, paired

    calls = []
    fns = {k: (lambda k=k: calls.append(k) or 1.0) for k in "abc"}
    interleaved(fns, 3)
    assert calls[3:] == list("abc" "bca" "cab")  # after the warm-up, each round starts one fn later
    # a machine twice as slow in round 2: per-round ratios stay 2, the ratio of medians does not see the pairing
    slow, fast = [2.0, 4.0, 2.0], [1.0, 2.0, 1.0]
    assert paired(slow, fast) == (2.0, 2.0, 2.0)
    assert paired([3.0, 1.0], [1.0, 1.0]) == (2.0, 1.0, 3.0)
    with pytest.raises(ValueError):
        paired([1.0], [1.0, 2.0])
    row = dict(config="180m", dtype="bf16", metric="decode tok/s after 128", ours=100.0, peer="llama.cpp bf16",
               peer_tok_s=90.0, ratio=1.11, paired=(1.12, 0.98, 1.3), spread=0.05)
    assert "paired 1.12x (0.98-1.30)" in format_table([row])


def test_a_peer_that_crashes_is_left_out_and_named(tmp_path):
    """llama.cpp's AMX prompt kernels die with SIGILL on some VMs: that peer's row says so, the rest is measured."""
    from vl.bench.run import format_table, interleaved
    from vl.bench.llama_cpp import LlamaCpp

    (tmp_path / "build" / "bin").mkdir(parents=True)
    fake = tmp_path / "build" / "bin" / "llama-bench"
    fake.write_text("#!/bin/sh\nkill -ILL $$\n")
    fake.chmod(0o755)
    (tmp_path / "convert_hf_to_gguf.py").write_text("")
    lc = LlamaCpp(tmp_path)
    failed = {}
    times = interleaved({"ours": lambda: 0.5, "llama.cpp q8_0 AMX": lambda: lc.tokens_per_s(tmp_path / "m.gguf",
                                                                                             prompt=64)}, 2, failed)
    assert times == {"ours": [0.5, 0.5]}
    assert "killed by SIGILL" in failed["llama.cpp q8_0 AMX"] and "m.gguf -p 64" in failed["llama.cpp q8_0 AMX"]
    with pytest.raises(RuntimeError):  # without `failed` the error is the caller's
        interleaved({"x": lambda: lc.tokens_per_s(tmp_path / "m.gguf", prompt=64)}, 1)
    row = dict(config="180m", dtype="bf16", metric="prefill tok/s @2048", peer="llama.cpp q8_0 AMX", ours=900.0,
               peer_error=failed["llama.cpp q8_0 AMX"])
    assert "not measured: llama-bench m.gguf -p 64" in format_table([row])


def test_the_old_module_names_of_vl_bench_answer_with_a_warning():
    """`vl.bench` was one module before it became the package of every benchmark: its names answer for one release
    from vl/bench/run.py, each use warning at the caller's line; the submodules import without a warning."""
    import warnings

    from vl.bench import run

    with pytest.warns(DeprecationWarning, match=r"vl\.bench\.(main|CONFIGS) moved to vl\.bench\.run\.") as caught:
        from vl.bench import main as old_main, CONFIGS as old_configs  # noqa: F401
    assert (old_main, old_configs) == (run.main, run.CONFIGS)
    assert {w.filename for w in caught} == {__file__}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from vl.bench import geometry, llama_cpp, quant, timing  # noqa: F401
