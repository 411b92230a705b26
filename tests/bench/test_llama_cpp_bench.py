"""`vl bench --llama-cpp` with a stand-in llama.cpp tree: the GGUFs it makes (convert, then llama-quantize for q4_0 /
q4_K_M), the rows it names for the kernels llama-bench reports (AMX, CPU_REPACK, --repack 0), and a peer that
crashes among peers that run. The real llama.cpp is measured by `vl bench` itself (docs/bench_llama_cpp.md)."""

import json
import sys

import pytest

from vl.bench.llama_cpp import LlamaCpp, peer_label
from vl.bench.run import main

# llama-bench: JSON for the run asked; with -v, the "model buffer size" lines of the weights' placement (on stderr,
# where llama.cpp logs): q8_0 and q4_0 in AMX, q4_K_M split between AMX and CPU_REPACK, bf16 in the plain buffer.
# It records its arguments, and the q4_K_M file with --repack 0 dies by SIGSEGV (as an AMX build did on some VMs).
_BENCH = '''#!{python}
import json, os, pathlib, signal, sys
a = sys.argv[1:]
with open(pathlib.Path(sys.argv[0]).parent / "calls", "a") as f:
    f.write(" ".join(a) + "\\n")
arg = lambda k, d="0": a[a.index(k) + 1] if k in a else d
model = pathlib.Path(arg("-m")).name
if "-v" in a:
    where = {{"q8_0": ["AMX"], "q4_0": ["AMX"], "q4_K_M": ["AMX", "CPU_REPACK"]}}.get(model[6:-5].split("-")[0], [])
    for name in ["CPU_Mapped"] + where:
        print(f"load_tensors: {{name:>12}} model buffer size =     1.00 MiB", file=sys.stderr)
if "q4_K_M" in model and arg("--repack", "1") == "0":
    os.kill(os.getpid(), signal.SIGSEGV)
print(json.dumps([{{"n_prompt": int(arg("-p")), "n_gen": int(arg("-n")), "avg_ts": 50.0}}]))
'''
# convert_hf_to_gguf.py, with the three classes the converter shim patches: writes a file of the asked type, and
# the token list and types the model's vocabulary step gave its writer (next to the file, as JSON)
_CONVERT = '''import json, sys
from conversion.nemotron import NemotronHModel
a = sys.argv
out = a[a.index("--outfile") + 1]
open(out, "wb").write(b"G" * {"f32": 4000, "bf16": 2000, "q8_0": 1100}[a[a.index("--outtype") + 1]])
class Writer:
    def add_token_list(self, toks): self.toks = [t.decode() for t in toks]
    def add_token_types(self, types): self.types = list(types)
m = NemotronHModel.__new__(NemotronHModel)
m.gguf_writer = w = Writer()
m.vocab_size = json.load(open(a[1] + "/config.json")).get("vocab_size", 4)
m.set_vocab()
json.dump({"tokens": w.toks, "types": w.types}, open(out + ".vocab.json", "w"))
'''
# the converter's builtin vocabulary (5 tokens here, 50,277 in llama.cpp), cut to the model's size
_NEMOTRON = '''class NemotronHModel:
    def _set_vocab_builtin(self, name, vocab_size):
        assert name == "gpt-neox", name
        toks = [f"t{i}".encode() for i in range(5)][:vocab_size]
        self.gguf_writer.add_token_list(toks)
        self.gguf_writer.add_token_types([1] * len(toks))
'''
# llama-quantize: the output head's type may come first (--output-tensor-type bf16: 100 bytes more)
_QUANTIZE = '''#!{python}
import pathlib, sys
a = sys.argv[1:]
head = a[1] if a[0] == "--output-tensor-type" else None
src, dst, kind = a[2:5] if head else a[:3]
assert pathlib.Path(src).name == "model-bf16.gguf", src  # quantized from the bf16 GGUF
pathlib.Path(dst).write_bytes(b"Q" * ({{"Q4_0": 600, "Q4_K_M": 650, "Q8_0": 1050}}[kind] + 100 * (head == "bf16")))
'''


# --quick without its prefill: decode 4 tokens after 64, one round
QUICK_DECODE = ["--configs", "tiny", "--dtypes", "bf16", "--prefill", "", "--decode-ctx", "64", "--new-tokens", "4",
                "--repeats", "1", "--decode", "fused"]


def fake_tree(root, quantize=True):
    (root / "build" / "bin").mkdir(parents=True)
    tools = [("llama-bench", _BENCH)] + ([("llama-quantize", _QUANTIZE)] if quantize else [])
    for name, text in tools:
        exe = root / "build" / "bin" / name
        exe.write_text(text.format(python=sys.executable))
        exe.chmod(0o755)
    (root / "convert_hf_to_gguf.py").write_text(_CONVERT)
    (root / "conversion").mkdir()
    (root / "conversion" / "base.py").write_text("class ModelBase:\n    pass\n")
    (root / "conversion" / "granite.py").write_text("class GraniteHybridModel:\n    def set_vocab(self):\n"
                                                    "        self._set_vocab_builtin('gpt-neox', self.vocab_size)\n")
    (root / "conversion" / "nemotron.py").write_text(_NEMOTRON)
    return root


@pytest.mark.parametrize("vocab", [3, 9])
def test_the_builtin_vocabulary_is_cut_or_padded_to_the_model_rows(tmp_path, vocab):
    """llama.cpp refuses a GGUF whose token list is shorter than token_embd (Omni: 131,072 rows against the builtin
    50,277): the shim pads it with unused tokens, as the converter pads a short tokenizer, and a longer list is cut."""
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"vocab_size": vocab}))
    gguf = LlamaCpp(fake_tree(tmp_path / "lc")).converted(hf, "bf16", tmp_path / "model-bf16.gguf")
    got = json.loads((tmp_path / "model-bf16.gguf.vocab.json").read_text())
    assert gguf.stat().st_size == 2000 and len(got["tokens"]) == len(got["types"]) == vocab
    assert got["tokens"][:3] == ["t0", "t1", "t2"]
    assert got["tokens"][5:] == [f"[PAD{i}]" for i in range(5, vocab)] and got["types"][5:] == [5] * (vocab - 5)


def calls(root):
    return (root / "build" / "bin" / "calls").read_text().splitlines()


def test_labels_name_the_buffers_llama_bench_used():
    assert peer_label("q8_0", ("AMX",)) == "llama.cpp q8_0 AMX"
    assert peer_label("q4_K_M", ("AMX", "CPU_REPACK")) == "llama.cpp q4_K_M AMX+CPU_REPACK"
    assert peer_label("q4_0", ("CPU_REPACK",), repack=False) == "llama.cpp q4_0 -repack0"
    assert peer_label("q8_0", ()) == "llama.cpp q8_0"  # the plain buffer: a stock build's kernels, one row


def test_peers_of_each_pass_and_the_buffer_probe_runs_once_per_file(tmp_path):
    lc = LlamaCpp(fake_tree(tmp_path / "lc"))
    gguf = {k: tmp_path / f"model-{k}.gguf" for k in ("fp32", "bf16", "q8_0", "q4_0", "q4_K_M")}
    assert lc.peers("fp32", gguf) == {"llama.cpp f32": ("fp32", True)}
    want = {"llama.cpp bf16": ("bf16", True),
            "llama.cpp q8_0 AMX": ("q8_0", True), "llama.cpp q8_0 -repack0": ("q8_0", False),
            "llama.cpp q4_0 AMX": ("q4_0", True), "llama.cpp q4_0 -repack0": ("q4_0", False),
            "llama.cpp q4_K_M AMX+CPU_REPACK": ("q4_K_M", True), "llama.cpp q4_K_M -repack0": ("q4_K_M", False)}
    assert lc.peers("bf16", gguf) == want
    assert lc.peers("bf16", gguf) == want  # asked again: the same rows, from the first probe
    probes = [c for c in calls(tmp_path / "lc") if " -v" in c]
    assert len(probes) == 3 and all("-p 0 -n 1" in c for c in probes)
    # a quantized GGUF whose buffers stay plain (a CPU without AMX, a type without a repacked layout): one row
    (tmp_path / "lc" / "build" / "bin" / "llama-bench").write_text(_BENCH.format(python=sys.executable)
                                                                   .replace('"q4_0": ["AMX"], ', ""))
    lc = LlamaCpp(tmp_path / "lc")
    assert [k for k in lc.peers("bf16", {"q4_0": gguf["q4_0"]})] == ["llama.cpp q4_0"]


def test_a_failing_buffer_probe_still_times_both_rows(tmp_path):
    root = fake_tree(tmp_path / "lc")
    (root / "build" / "bin" / "llama-bench").write_text("#!/bin/sh\nkill -ILL $$\n")
    peers = LlamaCpp(root).peers("bf16", {"q8_0": tmp_path / "model-q8_0.gguf"})
    assert peers == {"llama.cpp q8_0 default": ("q8_0", True), "llama.cpp q8_0 -repack0": ("q8_0", False)}


def test_quantize_command_and_a_missing_llama_quantize(tmp_path):
    lc = LlamaCpp(fake_tree(tmp_path / "lc"))
    cmd = lc.quantize_cmd(tmp_path / "model-bf16.gguf", tmp_path / "model-q4_K_M.gguf", "q4_K_M")
    assert cmd[0].endswith("llama-quantize") and cmd[1:4] == [str(tmp_path / "model-bf16.gguf"),
                                                              str(tmp_path / "model-q4_K_M.gguf"), "Q4_K_M"]
    src = tmp_path / "model-bf16.gguf"
    src.write_bytes(b"x")
    assert lc.quantized(src, "q4_0", tmp_path / "q.gguf").stat().st_size == 600
    with pytest.raises(RuntimeError, match="llama-quantize Q4_0 failed"):  # the stand-in wants a bf16 source
        lc.quantized(tmp_path / "q.gguf", "q4_0", tmp_path / "q2.gguf")
    # the -bf16head kinds keep the output head in bf16, as the released FP8 / NVFP4 checkpoints keep lm_head
    cmd = lc.quantize_cmd(src, tmp_path / "h.gguf", "q4_0-bf16head")
    assert cmd[1:] == ["--output-tensor-type", "bf16", str(src), str(tmp_path / "h.gguf"), "Q4_0", cmd[-1]]
    assert lc.quantized(src, "q8_0-bf16head", tmp_path / "h.gguf").stat().st_size == 1150
    with pytest.raises(RuntimeError, match="llama-quantize --output-tensor-type bf16 Q8_0 failed"):
        lc.quantized(tmp_path / "q.gguf", "q8_0-bf16head", tmp_path / "q2.gguf")
    lc = LlamaCpp(fake_tree(tmp_path / "bare", quantize=False))
    assert lc.quantize is None
    with pytest.raises(FileNotFoundError, match="build the llama-quantize target"):
        lc.quantize_cmd(src, tmp_path / "q.gguf", "q4_0")


def test_bench_times_every_gguf_and_names_the_crashed_peer(tmp_path, capsys):
    """Through `vl bench`, twice: the q4_K_M --repack 0 peer dies by SIGSEGV in each run and its row says so; every
    other peer is timed, with its GGUF's size; the second run makes its own files and rows the same way."""
    root = fake_tree(tmp_path / "lc")
    for run in ("a", "b"):
        out = tmp_path / f"{run}.json"
        assert main([*QUICK_DECODE, "--llama-cpp", str(root),
                     "--work-dir", str(tmp_path / run), "--json", str(out)]) == 0
        rows = [r for r in json.loads(out.read_text()) if "peer" in r]
        assert {r["peer"] for r in rows} == {"llama.cpp bf16", "llama.cpp q8_0 AMX", "llama.cpp q8_0 -repack0",
                                             "llama.cpp q4_0 AMX", "llama.cpp q4_0 -repack0",
                                             "llama.cpp q4_K_M AMX+CPU_REPACK", "llama.cpp q4_K_M -repack0",
                                             "llama.cpp q8_0-bf16head AMX", "llama.cpp q8_0-bf16head -repack0",
                                             "llama.cpp q4_0-bf16head AMX", "llama.cpp q4_0-bf16head -repack0"}
        assert all(r["metric"].startswith("decode tok/s after 64") for r in rows)  # --prefill '': no prefill rows
        crashed = [r for r in rows if "peer_error" in r]
        assert [r["peer"] for r in crashed] == ["llama.cpp q4_K_M -repack0"]
        assert "killed by SIGSEGV" in crashed[0]["peer_error"]
        sizes = {r["peer"]: r["peer_gguf_bytes"] for r in rows if "peer_error" not in r}
        assert sizes["llama.cpp bf16"] == 2000 and sizes["llama.cpp q8_0 AMX"] == 1100
        assert sizes["llama.cpp q4_0 -repack0"] == 600 and sizes["llama.cpp q4_K_M AMX+CPU_REPACK"] == 650
        assert sizes["llama.cpp q4_0-bf16head AMX"] == 700 and sizes["llama.cpp q8_0-bf16head AMX"] == 1150
        assert all(r["peer_tok_s"] == 50.0 for r in rows if "peer_error" not in r)
        printed = capsys.readouterr().out
        assert "llama.cpp q4_K_M AMX+CPU_REPACK" in printed and "GGUF 0 MiB" in printed
        assert "not measured: llama-bench model-q4_K_M.gguf" in printed
        assert sorted(p.name for p in (tmp_path / run / "tiny").glob("*.gguf")) == [
            "model-bf16.gguf", "model-q4_0-bf16head.gguf", "model-q4_0.gguf", "model-q4_K_M.gguf",
            "model-q8_0-bf16head.gguf", "model-q8_0.gguf"]
    timed = [c for c in calls(root) if " -v" not in c and "-n 4 " in c]
    assert any("model-q4_0.gguf" in c and "--repack 0" in c for c in timed)
    assert any("model-q4_0.gguf" in c and "--repack" not in c for c in timed)


def test_bench_without_llama_quantize_times_the_rest_and_says_so(tmp_path, capsys):
    root = fake_tree(tmp_path / "lc", quantize=False)
    out = tmp_path / "a.json"
    assert main([*QUICK_DECODE, "--llama-cpp", str(root),
                 "--json", str(out)]) == 0
    assert {r["peer"] for r in json.loads(out.read_text()) if "peer" in r} == {
        "llama.cpp bf16", "llama.cpp q8_0 AMX", "llama.cpp q8_0 -repack0"}
    printed = capsys.readouterr().out
    assert "q4_0, q4_K_M, q8_0-bf16head, q4_0-bf16head not measured: no llama-quantize next to llama-bench" in printed
    with pytest.raises(SystemExit) as e:
        main(["--quick", "--configs", "tiny", "--llama-cpp", str(root), "--llama-cpp-quants", "q8_0,q5_1"])
    assert e.value.code == 2 and "--llama-cpp-quants" in capsys.readouterr().err
