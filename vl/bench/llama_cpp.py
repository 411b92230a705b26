"""llama.cpp as a peer in `vl bench`: the same weights converted to GGUF, timed by its own `llama-bench`.

CPU users mostly run llama.cpp, which supports Nemotron-H (`nemotron_h` in its `convert_hf_to_gguf.py`). When
`vl bench --llama-cpp DIR` points at a llama.cpp tree with a build (`DIR/build/bin/llama-bench`, or
`llama-bench` directly in DIR), the bench model is saved in the transformers layout, converted with DIR's
`convert_hf_to_gguf.py` to f32 / bf16 / q8_0, and each `llama-bench` run (one repetition, in a child process)
is interleaved with our own runs, so machine noise hits both. Nothing of llama.cpp ships with this project.

The converter is run through a small shim (written next to the model at run time) because the bench model
has no tokenizer and transformers 5 rewrites its layer pattern (docs/bench_llama_cpp.md):
- vocabulary: llama.cpp's own builtin GPT-NeoX vocabulary, cut to the model's size (what its Mamba-2
  converter does for tokenizer-less checkpoints); `llama-bench` feeds random token ids, so only the size counts;
- the layer pattern is read from `hybrid_override_pattern` in config.json (transformers 5 turns it into
  `layers_block_type`, whose "mlp" entries the converter does not count as MLP layers);
- without "E" in the pattern, the MoE defaults transformers writes into every NemotronH config are dropped,
  so the converter picks the dense `nemotron_h` architecture.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

GGUF_TYPES = {"fp32": "f32", "bf16": "bf16", "q8_0": "q8_0"}

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
sys.argv[0] = root + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
'''


class LlamaCpp:
    """A llama.cpp tree: `llama-bench` and `convert_hf_to_gguf.py` found under `root`."""

    def __init__(self, root, python: str | None = None):
        root = Path(root).expanduser().resolve()
        bench = next((p for p in (root / "build" / "bin" / "llama-bench", root / "bin" / "llama-bench",
                                  root / "llama-bench") if p.is_file() and os.access(p, os.X_OK)), None)
        conv = root / "convert_hf_to_gguf.py"
        problems = []
        if bench is None:
            problems.append(f"no executable llama-bench in {root}/build/bin, {root}/bin or {root}")
        if not conv.is_file():
            problems.append(f"no convert_hf_to_gguf.py in {root}")
        if problems:
            raise FileNotFoundError("; ".join(problems) + " (expected a llama.cpp source tree built with cmake)")
        self.root, self.bench, self.convert, self.python = root, bench, conv, python or sys.executable

    def version(self) -> str:
        r = subprocess.run([str(self.bench), "--version"], capture_output=True, text=True, timeout=60)
        return (r.stdout + r.stderr).strip().splitlines()[0] if (r.stdout + r.stderr).strip() else "unknown"

    def export(self, hf_model, pattern: str, work: Path, kinds=("fp32", "bf16", "q8_0")) -> dict[str, Path]:
        """Save `hf_model` (transformers NemotronHForCausalLM) in fp32 and convert it: -> {kind: gguf path}."""
        import torch

        work = Path(work)
        hf_dir = work / "hf"
        hf_model.to(torch.float32).save_pretrained(hf_dir)
        cfg_path = hf_dir / "config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["hybrid_override_pattern"] = pattern
        cfg_path.write_text(json.dumps(cfg, indent=1))
        shim = work / "convert_shim.py"
        shim.write_text(_SHIM)
        out = {}
        for kind in kinds:
            dst = work / f"model-{GGUF_TYPES[kind]}.gguf"
            r = subprocess.run([self.python, str(shim), str(self.root), str(hf_dir), "--outtype", GGUF_TYPES[kind],
                                "--outfile", str(dst)], capture_output=True, text=True, timeout=1800,
                               env=dict(os.environ, PYTHONPATH=str(self.root / "gguf-py")))
            if r.returncode != 0 or not dst.is_file():
                raise RuntimeError(f"convert_hf_to_gguf.py --outtype {GGUF_TYPES[kind]} failed (exit {r.returncode}): "
                                   f"{(r.stderr or r.stdout).strip()[-800:]}")
            out[kind] = dst
        shutil.rmtree(hf_dir, ignore_errors=True)
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
            how = (f"killed by {signal.Signals(-r.returncode).name}" if r.returncode < 0 else f"exit {r.returncode}")
            what = f"llama-bench {Path(gguf).name} {' '.join(cmd[3:])}"
            raise RuntimeError(f"{what} failed ({how}) {r.stderr.strip()[-800:]}".rstrip())
        runs = json.loads(r.stdout)
        want = [x for x in runs if int(x.get("n_prompt", 0)) == prompt and int(x.get("n_gen", 0)) == gen]
        if not want:
            raise RuntimeError(f"llama-bench printed no run with n_prompt={prompt}, n_gen={gen}: {r.stdout[:400]}")
        return float(want[0]["avg_ts"])
