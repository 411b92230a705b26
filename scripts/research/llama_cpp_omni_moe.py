"""llama.cpp's decode on the first layers of Nemotron 3 Nano Omni's LLM at its released widths (hidden 2688, 128
routed experts of width 1856, 6 per token, a shared expert of 3712): a random BF16 checkpoint under the hub's names
(routed experts one per name), converted by llama.cpp's `convert_hf_to_gguf.py` to its `nemotron_h_moe` GGUF in
bf16 and q8_0, quantized by `llama-quantize` to q4_0 and q4_K_M and to q8_0 / q4_0 with the output head left in
bf16 (as the released checkpoints keep `lm_head`), and timed by `llama-bench` (decode N tokens after
a context of D, 1 repetition per round, rounds interleaved), each type with its default placement (the extra
buffers `llama-bench -v` names: AMX, CPU_REPACK) and with `--repack 0`.

`--ours nvfp4,fp8` times ours on the SAME weights in the same rounds: the BF16 checkpoint quantized by `vl
quantize` (no tokenizer in it: calibrated on random token ids; `lm_head` kept in BF16 as ModelOpt does, or packed
too for a format named with `+head`, e.g. `nvfp4+head`), loaded with `vl.load_pretrained` and timed as
vl/bench/geometry.py does (decode "fused", N tokens after the same D-token context). Every row then also gives
the bytes one decode step reads (ours: vl.bench.geometry.decode_bytes; llama.cpp: the GGUF's tensors, the routed
experts' top k of E, one row of the embedding) and that as GB/s, next to the copy kernel measured in the same run.
`vl bench --geometry nano-omni-30b-a3b --layers L --format nvfp4|fp8` times random packed weights of the same
shapes. Disk: about 2.6 GB of BF16 per MoE layer, plus 0.7 GB each for the embedding and
the output head, for the checkpoint and again for each GGUF (less for the quantized ones).

    flock /tmp/vl_heavy.lock .venv/bin/python scripts/research/llama_cpp_omni_moe.py --llama-cpp DIR \\
        --pattern M*E --work-dir /tmp/omni-moe --threads 1,2 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

import torch

import vl
from vl.bench.geometry import copy_bandwidth, decode_bytes
from vl.bench import llama_cpp
from vl.bench.llama_cpp import LlamaCpp, peer_label
from vl.bench.timing import our_decode_s
from vl.config import lm_config_to_hf, nano3_30b_a3b_lm
from vl.modeling.nemotron_h import NemotronHForCausalLM

STD = 0.02
BLOCK = 32 * 1024 * 1024  # float32 elements generated at a time
ROUTED = (".mixer.experts.up_proj", ".mixer.experts.down_proj")  # fused (E, out, in) in our model


def entries(cfg) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
    """(hub name, dtype, shape) of every tensor: routed experts one per name, the router in float32, the rest BF16."""
    with torch.device("meta"):
        model = NemotronHForCausalLM(cfg)
    out = []
    for name, t in model.state_dict().items():
        if name.endswith(ROUTED):
            head, proj = name.rsplit(".", 1)
            out += [(f"{head}.{e}.{proj}.weight", torch.bfloat16, tuple(t.shape[1:])) for e in range(t.shape[0])]
        else:
            fp32 = name.endswith((".mixer.gate.weight", ".e_score_correction_bias"))
            out.append((name, torch.float32 if fp32 else torch.bfloat16, tuple(t.shape)))
    return out


def write_checkpoint(cfg, out: Path, seed: int = 0) -> Path:
    """Stream a random BF16 checkpoint of `cfg` (model.safetensors, config.json with the pattern string)."""
    from transformers import NemotronHConfig

    out.mkdir(parents=True, exist_ok=True)
    items = entries(cfg)
    header, offset = {}, 0
    for key, dtype, shape in items:
        n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        header[key] = {"dtype": "BF16" if dtype == torch.bfloat16 else "F32", "shape": list(shape),
                       "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    g = torch.Generator().manual_seed(seed)
    with open(out / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for key, dtype, shape in items:
            if "norm" in key or key.endswith((".D", "A_log", "dt_bias", "e_score_correction_bias")):
                t = torch.full(shape, -4.0 if key.endswith("dt_bias") else 0.0 if "e_score" in key else 1.0)
                if key.endswith("A_log"):
                    t = torch.log(torch.linspace(1, 16, shape[0]))
                f.write(t.to(dtype).contiguous().view(torch.uint8).numpy().tobytes())
                continue
            cols = shape[-1]
            rows = math.prod(shape) // cols
            step = max(1, BLOCK // cols)
            for r0 in range(0, rows, step):
                f.write((torch.randn(min(step, rows - r0), cols, generator=g) * STD).to(dtype)
                        .view(torch.uint8).numpy().tobytes())
    hf = NemotronHConfig(**lm_config_to_hf(cfg)).to_dict()
    hf.update(hybrid_override_pattern=cfg.pattern, architectures=["NemotronHForCausalLM"], torch_dtype="bfloat16")
    (out / "config.json").write_text(json.dumps(hf, indent=1, default=str))
    return out




def gguf_decode_bytes(root: Path, gguf: Path, top_k: int, experts: int) -> int:
    """Bytes one llama.cpp decode step reads from `gguf`: every tensor, but one row of the token embedding (unless
    it is also the output head) and top_k / experts of the routed expert tensors (`*_exps`)."""
    sys.path.insert(0, str(root / "gguf-py"))
    from gguf import GGUFReader

    tensors = {t.name: t for t in GGUFReader(str(gguf)).tensors}
    total = 0
    for name, t in tensors.items():
        n = int(t.n_bytes)
        if name == "token_embd.weight" and "output.weight" in tensors:
            n //= int(t.shape[-1])  # one row of n_vocab (GGUF shapes are innermost first)
        elif "_exps." in name:
            n = n * top_k // experts
        total += n
    return total


def ours_quantized(ckpt: Path, spec: str, work: Path, reuse: bool = False) -> Path:
    """`vl quantize --format FMT` of the BF16 checkpoint (`FMT+head`: lm_head packed too) -> its directory."""
    fmt, _, head = spec.partition("+")
    out = work / f"ours-{spec.replace('+', '-')}"
    if reuse and (out / "hf_quant_config.json").exists():
        return out
    cmd = [sys.executable, "-m", "vl.cli", "quantize", "--format", fmt, "--model", str(ckpt), "--out", str(out),
           "--dtype", "bfloat16", "--no-progress", "--overwrite"]
    if head:
        cmd.append("--no-exclude-lm-head")
    r = subprocess.run(cmd, capture_output=True, text=True)
    print(f"$ vl quantize {' '.join(cmd[4:])}\n{(r.stdout + r.stderr).strip()[-1500:]}", flush=True)
    if r.returncode:
        raise RuntimeError(f"vl quantize {spec} failed (exit {r.returncode})")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--llama-cpp", required=True, help="llama.cpp tree with llama-bench and llama-quantize built")
    p.add_argument("--pattern", default="M*E", help="layer pattern at the released widths (default: M*E; llama.cpp "
                   "aborts on a model without an attention layer: GGML_ASSERT(buffer) for its empty KV cache)")
    p.add_argument("--work-dir", required=True)
    p.add_argument("--kinds", default="bf16,q8_0,q4_0,q4_K_M,q8_0-bf16head,q4_0-bf16head", help="GGUF kinds: bf16, "
                   "q8_0 (converted), and llama-quantize's (vl.bench.llama_cpp.QUANTIZED)")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--depth", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ours", default="", help="also time ours on the same weights: comma-separated vl quantize "
                   "formats (nvfp4, fp8; FMT+head packs lm_head too)")
    p.add_argument("--keep", action="store_true", help="keep the checkpoint and the GGUFs")
    p.add_argument("--reuse", action="store_true", help="reuse the checkpoint and GGUFs a --keep run left in --work-dir")
    a = p.parse_args()
    lc = LlamaCpp(a.llama_cpp)
    work = Path(a.work_dir)
    cfg = nano3_30b_a3b_lm(pattern=a.pattern)
    kinds = a.kinds.split(",")
    t0 = time.time()
    ckpt = work / "hf"
    if not (a.reuse and (ckpt / "model.safetensors").exists()):
        write_checkpoint(cfg, ckpt)
    print(f"checkpoint {a.pattern}: {(ckpt / 'model.safetensors').stat().st_size / 1e9:.2f} GB in "
          f"{time.time() - t0:.0f} s", flush=True)
    gguf = {}
    for kind in kinds:
        t0 = time.time()
        if a.reuse and (work / f"model-{kind}.gguf").exists():
            gguf[kind] = work / f"model-{kind}.gguf"
        elif kind in ("bf16", "q8_0"):
            gguf[kind] = lc.converted(ckpt, kind, work / f"model-{kind}.gguf")
        else:
            gguf[kind] = lc.quantized(gguf["bf16"], kind, work / f"model-{kind}.gguf")
        print(f"{kind}: {gguf[kind].stat().st_size / 1e9:.2f} GB in {time.time() - t0:.0f} s", flush=True)
    ours = {}
    for spec in filter(None, a.ours.split(",")):
        t0 = time.time()
        ours[f"ours {spec}"] = vl.load_pretrained(ours_quantized(ckpt, spec, work, a.reuse), dtype=torch.bfloat16)
        print(f"ours {spec}: quantized and loaded in {time.time() - t0:.0f} s", flush=True)
    if not a.keep:
        (ckpt / "model.safetensors").unlink()
    read = {label: decode_bytes(m) for label, m in ours.items()}
    ids = torch.randint(3, cfg.vocab_size, (1, a.depth), generator=torch.Generator().manual_seed(0))
    runs = {}
    for kind in kinds:
        buffers = lc.extra_buffers(gguf[kind])
        runs[peer_label(kind, buffers)] = (kind, True)
        if buffers:
            runs[peer_label(kind, buffers, repack=False)] = (kind, False)
    print(f"decode {a.new_tokens} tokens after {a.depth}, tok/s, median of {a.rounds} rounds (min-max), rounds "
          f"interleaved (ours first in each round)")
    for threads in (int(t) for t in a.threads.split(",")):
        got: dict[str, list[float]] = {label: [] for label in runs}
        errors = {}
        torch.set_num_threads(threads)
        for label, model in ours.items():
            got[label] = []
            our_decode_s(model, ids[:, :1], 1)  # untimed: each layer binds its decode kernel once
        for _ in range(a.rounds):
            for label, model in ours.items():
                got[label].append(1 / our_decode_s(model, ids, a.new_tokens))
            for label, (kind, repack) in runs.items():
                if label in errors:
                    continue
                try:
                    got[label].append(lc.tokens_per_s(gguf[kind], gen=a.new_tokens, depth=a.depth, threads=threads,
                                                      repack=repack))
                except RuntimeError as e:
                    errors[label] = str(e).splitlines()[0][:200]
        copy = copy_bandwidth() / 1e9
        print(f"  {threads} thread(s)  copy kernel {copy:.1f} GB/s (read + write)", flush=True)
        for label, ts in got.items():
            if label in ours:
                size = "ours"
            else:
                size = f"GGUF {gguf[runs[label][0]].stat().st_size / 2**30:.2f} GiB"
                read.setdefault(label, gguf_decode_bytes(lc.root, gguf[runs[label][0]], cfg.num_experts_per_tok,
                                                         cfg.n_routed_experts))
            text = (f"{statistics.median(ts):8.2f} ({min(ts):.2f}-{max(ts):.2f})" if ts else
                    f"not measured: {errors.get(label)}")
            gbs = statistics.median(ts) * read[label] / 1e9 if ts else float("nan")
            print(f"  {threads} thread(s)  {label:<34} {text}  reads {read[label] / 1e6:.1f} MB/tok = {gbs:.2f} GB/s "
                  f"= {gbs / copy:.0%} of copy  {size}", flush=True)
    if not a.keep:
        for path in gguf.values():
            path.unlink()
        for spec in filter(None, a.ours.split(",")):
            shutil.rmtree(work / f"ours-{spec.replace('+', '-')}", ignore_errors=True)


if __name__ == "__main__":
    main()
