"""llama.cpp as a peer in `vl bench`: the same weights converted to GGUF, timed by its own `llama-bench`.

CPU users mostly run llama.cpp, which supports Nemotron-H (`nemotron_h` in its `convert_hf_to_gguf.py`). When
`vl bench --llama-cpp DIR` points at a llama.cpp tree with a build (`DIR/build/bin/llama-bench`, or
`llama-bench` directly in DIR), the bench model is saved in the transformers layout, converted with DIR's
`convert_hf_to_gguf.py` to f32 / bf16 / q8_0, the bf16 GGUF quantized by its `llama-quantize` to q4_0 and
q4_K_M (the types its converter does not write) and to q8_0 / q4_0 with the output head left in bf16, and each
`llama-bench` run (one repetition, in a child process) is interleaved with our own runs, so machine noise hits
both. Nothing of llama.cpp ships with this project.

Which kernels a quantized GGUF runs depends on the CPU and the build: by default (`--repack 1`) llama.cpp
places a weight in the first "extra" buffer that takes it: AMX (int8 tiles; q4_0, q4_1, q8_0, q4_K, q5_K, q6_K,
iq4_xs, in a build with AMX-INT8 on a CPU that has it), then CPU_REPACK (interleaved layouts such as q4_0 8x8 and
q4_K 8x8 on AVX2), else the plain CPU buffer. `extra_buffers` asks `llama-bench -v` where the weights went, so
each row is named for what ran (`peers`), and a row with `--repack 0` (the plain kernels of the same build)
joins every type whose default used an extra buffer.

The converter is run through a small shim (written next to the model at run time) because the bench model
has no tokenizer and transformers 5 rewrites its layer pattern (docs/bench_llama_cpp.md):
- vocabulary: llama.cpp's own builtin GPT-NeoX vocabulary, cut to the model's size (what its Mamba-2
  converter does for tokenizer-less checkpoints) or, when the model has more rows than its 50,277 tokens (Omni's
  131,072), padded with unused `[PAD{i}]` tokens as the converter pads a short tokenizer (llama.cpp refuses a GGUF
  whose token list is shorter than `token_embd`); `llama-bench` feeds random token ids, so only the size counts;
- the layer pattern is read from `hybrid_override_pattern` in config.json (transformers 5 turns it into
  `layers_block_type`, whose "mlp" entries the converter does not count as MLP layers);
- without "E" in the pattern, the MoE defaults transformers writes into every NemotronH config are dropped,
  so the converter picks the dense `nemotron_h` architecture.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

GGUF_TYPES = {"fp32": "f32", "bf16": "bf16", "q8_0": "q8_0"}  # convert_hf_to_gguf.py --outtype
# llama-quantize's type and options, from the bf16 GGUF. Its default writes the output head at another type (q6_K, or
# q8_0 where the K-quants' 256-wide blocks do not divide the width); the "-bf16head" kinds keep the head in bf16,
# as the released FP8 / NVFP4 checkpoints (ModelOpt) keep `lm_head`: the same head weights and bytes as ours.
QUANTIZED = {"q4_0": ("Q4_0", ()), "q4_K_M": ("Q4_K_M", ()),
             "q8_0-bf16head": ("Q8_0", ("--output-tensor-type", "bf16")),
             "q4_0-bf16head": ("Q4_0", ("--output-tensor-type", "bf16"))}
QUANT_KINDS = ("q8_0", *QUANTIZED)  # the quantized GGUFs timed next to our FP8 / NVFP4 (bf16 pass)
GGUF_NAMES = {"fp32": "f32", "bf16": "bf16"}  # our dtype -> its GGUF type, for the row at the same dtype
_PLAIN_BUFFERS = {"CPU", "CPU_Mapped"}  # llama.cpp's ordinary host buffers (not an "extra" weight layout)

_SHIM = '''import json, pathlib, runpy, sys
root = sys.argv.pop(1)
sys.path[0:0] = [root, root + "/gguf-py"]
from conversion.base import ModelBase
from conversion.granite import GraniteHybridModel
from conversion.nemotron import NemotronHModel
NemotronHModel.set_vocab = GraniteHybridModel.set_vocab  # builtin vocabulary: the bench model has no tokenizer
_init = NemotronHModel.__init__
def _init_dense(self, *args, **kwargs):
    hp = kwargs.pop("hparams", None) or ModelBase.load_hparams(args[0], self.is_mistral_format)
    raw = json.loads((pathlib.Path(args[0]) / "config.json").read_text())
    if "hybrid_override_pattern" in raw:
        hp["hybrid_override_pattern"] = raw["hybrid_override_pattern"]
    pat = hp.get("hybrid_override_pattern") or hp.get("layers_block_type") or "E"
    if not ("E" in pat if isinstance(pat, str) else "moe" in pat):
        for key in ("num_experts_per_tok", "n_routed_experts", "num_local_experts", "num_experts", "n_shared_experts",
                    "n_group", "topk_group"):
            hp.pop(key, None)
    _init(self, *args, hparams=hp, **kwargs)
NemotronHModel.__init__ = _init_dense
_builtin = NemotronHModel._set_vocab_builtin
def _padded(self, name, vocab_size):  # the builtin list is 50,277 tokens: pad it to the model's rows
    w = self.gguf_writer
    add_list, add_types = w.add_token_list, w.add_token_types
    w.add_token_list = lambda toks: add_list(list(toks) + [f"[PAD{i}]".encode() for i in range(len(toks), vocab_size)])
    w.add_token_types = lambda ts: add_types(list(ts) + [5] * (vocab_size - len(ts)))  # gguf.TokenType.UNUSED
    try:
        _builtin(self, name, vocab_size)
    finally:
        del w.add_token_list, w.add_token_types
NemotronHModel._set_vocab_builtin = _padded
sys.argv[0] = root + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
'''


def _tool(root: Path, name: str) -> Path | None:
    return next((p for p in (root / "build" / "bin" / name, root / "bin" / name, root / name)
                 if p.is_file() and os.access(p, os.X_OK)), None)


def peer_label(kind: str, buffers: tuple[str, ...], repack: bool = True) -> str:
    """A llama.cpp row's name: the GGUF type, then where its weights ran: the extra buffers `llama-bench -v` named
    (AMX, CPU_REPACK), "-repack0" for `--repack 0`, nothing for the plain buffer."""
    if not repack:
        return f"llama.cpp {kind} -repack0"
    return " ".join(["llama.cpp", kind, "+".join(buffers)]).rstrip()


class LlamaCpp:
    """A llama.cpp tree: `llama-bench` and `convert_hf_to_gguf.py` found under `root`, `llama-quantize` where built
    (without it the q4_0 / q4_K_M GGUFs are not made: `quantize` is None)."""

    def __init__(self, root, python: str | None = None):
        root = Path(root).expanduser().resolve()
        bench = _tool(root, "llama-bench")
        conv = root / "convert_hf_to_gguf.py"
        problems = []
        if bench is None:
            problems.append(f"no executable llama-bench in {root}/build/bin, {root}/bin or {root}")
        if not conv.is_file():
            problems.append(f"no convert_hf_to_gguf.py in {root}")
        if problems:
            raise FileNotFoundError("; ".join(problems) + " (expected a llama.cpp source tree built with cmake)")
        self.root, self.bench, self.convert, self.python = root, bench, conv, python or sys.executable
        self.quantize = _tool(root, "llama-quantize")
        self._buffers: dict[Path, tuple[str, ...]] = {}

    def version(self) -> str:
        r = subprocess.run([str(self.bench), "--version"], capture_output=True, text=True, timeout=60)
        return (r.stdout + r.stderr).strip().splitlines()[0] if (r.stdout + r.stderr).strip() else "unknown"

    def export(self, hf_model, pattern: str, work: Path, kinds=("fp32", "bf16", "q8_0")) -> dict[str, Path]:
        """Save `hf_model` (transformers NemotronHForCausalLM) in fp32 and convert it: -> {kind: gguf path}. The
        QUANTIZED kinds are quantized from the bf16 GGUF (converted for them when "bf16" is not in `kinds`)."""
        import torch

        work = Path(work)
        hf_dir = work / "hf"
        hf_model.to(torch.float32).save_pretrained(hf_dir)
        cfg_path = hf_dir / "config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["hybrid_override_pattern"] = pattern
        cfg_path.write_text(json.dumps(cfg, indent=1))
        out = {}
        converted = [k for k in kinds if k in GGUF_TYPES]
        if any(k in QUANTIZED for k in kinds) and "bf16" not in converted:
            converted.append("bf16")
        for kind in converted:
            out[kind] = self.converted(hf_dir, kind, work / f"model-{GGUF_TYPES[kind]}.gguf")
        shutil.rmtree(hf_dir, ignore_errors=True)
        for kind in (k for k in kinds if k in QUANTIZED):
            out[kind] = self.quantized(out["bf16"], kind, work / f"model-{kind}.gguf")
        return {k: out[k] for k in kinds}

    def converted(self, hf_dir: Path, kind: str, dst: Path) -> Path:
        """`convert_hf_to_gguf.py hf_dir --outtype TYPE` through the shim: the GGUF of `kind` (fp32, bf16, q8_0) of a
        tokenizer-less NemotronH checkpoint whose config.json holds `hybrid_override_pattern`."""
        shim = Path(dst).parent / "convert_shim.py"
        shim.write_text(_SHIM)
        r = subprocess.run([self.python, str(shim), str(self.root), str(hf_dir), "--outtype", GGUF_TYPES[kind],
                            "--outfile", str(dst)], capture_output=True, text=True, timeout=1800,
                           env=dict(os.environ, PYTHONPATH=str(self.root / "gguf-py")))
        if r.returncode != 0 or not Path(dst).is_file():
            raise RuntimeError(f"convert_hf_to_gguf.py --outtype {GGUF_TYPES[kind]} failed (exit {r.returncode}): "
                               f"{(r.stderr or r.stdout).strip()[-800:]}")
        return Path(dst)

    def quantize_cmd(self, src: Path, dst: Path, kind: str) -> list[str]:
        if self.quantize is None:
            raise FileNotFoundError(f"no executable llama-quantize in {self.root}/build/bin, {self.root}/bin or "
                                    f"{self.root} (build the llama-quantize target) for {kind}")
        qtype, options = QUANTIZED[kind]
        return [str(self.quantize), *options, str(src), str(dst), qtype, str(os.cpu_count() or 1)]

    def quantized(self, src: Path, kind: str, dst: Path) -> Path:
        """`llama-quantize [OPTIONS] src dst TYPE`: the GGUF of `kind` (a QUANTIZED key) made from `src` (the bf16
        GGUF)."""
        cmd = self.quantize_cmd(src, dst, kind)
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if r.returncode != 0 or not dst.is_file():
            raise RuntimeError(f"llama-quantize {' '.join(cmd[1:-4] + cmd[-2:-1])} failed (exit {r.returncode}): "
                               f"{(r.stderr or r.stdout).strip()[-800:]}")
        return dst

    def extra_buffers(self, gguf: Path) -> tuple[str, ...]:
        """The extra weight buffers (AMX, CPU_REPACK) that llama-bench's default puts `gguf`'s weights in, read from
        the "X model buffer size" lines of one `llama-bench -v` generation (from an empty context); () where every
        weight stays in the plain buffer. Asked once per file."""
        gguf = Path(gguf)
        if gguf not in self._buffers:
            cmd = [str(self.bench), "-m", str(gguf), "-p", "0", "-n", "1", "-r", "1", "-v", "-o", "json"]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            if r.returncode != 0:
                raise RuntimeError(f"llama-bench {gguf.name} -v failed ({_how(r.returncode)}) "
                                   f"{r.stderr.strip()[-400:]}".rstrip())
            names = re.findall(r"(\S+) model buffer size", r.stderr + r.stdout)
            self._buffers[gguf] = tuple(dict.fromkeys(n for n in names if n not in _PLAIN_BUFFERS))
        return self._buffers[gguf]

    def peers(self, dtype_name: str, gguf: dict[str, Path]) -> dict[str, tuple[str, bool]]:
        """label -> (gguf kind, repack) of the llama.cpp rows next to our `dtype_name` run: its GGUF at that dtype
        (default placement), and in the bf16 pass every quantized GGUF, named for the extra buffers it ran in,
        plus its `--repack 0` row where that differs from the default."""
        out = {}
        if dtype_name in gguf:
            out[f"llama.cpp {GGUF_NAMES[dtype_name]}"] = (dtype_name, True)
        if dtype_name != "bf16":
            return out
        for kind in (k for k in QUANT_KINDS if k in gguf):
            try:
                buffers = self.extra_buffers(gguf[kind])
            except (RuntimeError, OSError, subprocess.SubprocessError):
                buffers = ("default",)  # placement unknown: its rows are timed (or say why not) all the same
            out[peer_label(kind, buffers)] = (kind, True)
            if buffers:
                out[peer_label(kind, buffers, repack=False)] = (kind, False)
        return out

    def tokens_per_s(self, gguf: Path, *, prompt: int = 0, gen: int = 0, depth: int = 0, threads: int = 1,
                     repack: bool = True) -> float:
        """One `llama-bench` repetition: prompt tokens/s (gen=0) or generated tokens/s after `depth` tokens.
        `repack=False` passes `--repack 0`: no extra weight buffers (its AMX int8 kernels, repacked layouts), so
        the weights run through its plain CPU kernels, as a build without AMX runs them."""
        cmd = [str(self.bench), "-m", str(gguf), "-p", str(prompt), "-n", str(gen), "-t", str(threads), "-r", "1",
               "-o", "json"]
        if depth:
            cmd += ["-d", str(depth)]
        if not repack:
            cmd += ["--repack", "0"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if r.returncode != 0:
            what = f"llama-bench {Path(gguf).name} {' '.join(cmd[3:])}"
            raise RuntimeError(f"{what} failed ({_how(r.returncode)}) {r.stderr.strip()[-800:]}".rstrip())
        runs = json.loads(r.stdout)
        want = [x for x in runs if int(x.get("n_prompt", 0)) == prompt and int(x.get("n_gen", 0)) == gen]
        if not want:
            raise RuntimeError(f"llama-bench printed no run with n_prompt={prompt}, n_gen={gen}: {r.stdout[:400]}")
        return float(want[0]["avg_ts"])


def _how(returncode: int) -> str:
    return f"killed by {signal.Signals(-returncode).name}" if returncode < 0 else f"exit {returncode}"
