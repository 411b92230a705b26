"""llama.cpp's decode on the first layers of Nemotron 3 Nano Omni's LLM at its released widths (hidden 2688, 128
routed experts of width 1856, 6 per token, a shared expert of 3712): a random BF16 checkpoint under the hub's names
(routed experts one per name), converted by llama.cpp's `convert_hf_to_gguf.py` to its `nemotron_h_moe` GGUF in
bf16 and q8_0, quantized by `llama-quantize` to q4_0 and q4_K_M, and timed by `llama-bench` (decode N tokens after
a context of D, 1 repetition per round, rounds interleaved), each type with its default placement (the extra
buffers `llama-bench -v` names: AMX, CPU_REPACK) and with `--repack 0`.

Our side of the same geometry is `vl bench --geometry nano-omni-30b-a3b --layers L --format nvfp4|fp8` (random
packed weights of the same shapes). Disk: about 2.6 GB of BF16 per MoE layer, plus 0.7 GB each for the embedding and
the output head, for the checkpoint and again for each GGUF (less for the quantized ones).

    flock /tmp/vl_heavy.lock .venv/bin/python scripts/research/llama_cpp_omni_moe.py --llama-cpp DIR \\
        --pattern M*E --work-dir /tmp/omni-moe --threads 1,2 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import struct
import time
from pathlib import Path

import torch

from vl.bench.llama_cpp import LlamaCpp, peer_label
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--llama-cpp", required=True, help="llama.cpp tree with llama-bench and llama-quantize built")
    p.add_argument("--pattern", default="M*E", help="layer pattern at the released widths (default: M*E; llama.cpp "
                   "aborts on a model without an attention layer: GGML_ASSERT(buffer) for its empty KV cache)")
    p.add_argument("--work-dir", required=True)
    p.add_argument("--kinds", default="bf16,q8_0,q4_0,q4_K_M")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--depth", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--keep", action="store_true", help="keep the checkpoint and the GGUFs")
    a = p.parse_args()
    lc = LlamaCpp(a.llama_cpp)
    work = Path(a.work_dir)
    cfg = nano3_30b_a3b_lm(pattern=a.pattern)
    kinds = a.kinds.split(",")
    t0 = time.time()
    ckpt = write_checkpoint(cfg, work / "hf")
    print(f"checkpoint {a.pattern}: {(ckpt / 'model.safetensors').stat().st_size / 1e9:.2f} GB in "
          f"{time.time() - t0:.0f} s", flush=True)
    gguf = {}
    for kind in kinds:
        t0 = time.time()
        if kind in ("bf16", "q8_0"):
            gguf[kind] = lc.converted(ckpt, kind, work / f"model-{kind}.gguf")
        else:
            gguf[kind] = lc.quantized(gguf["bf16"], kind, work / f"model-{kind}.gguf")
        print(f"{kind}: {gguf[kind].stat().st_size / 1e9:.2f} GB in {time.time() - t0:.0f} s", flush=True)
    if not a.keep:
        (ckpt / "model.safetensors").unlink()
    runs = {}
    for kind in kinds:
        buffers = lc.extra_buffers(gguf[kind])
        runs[peer_label(kind, buffers)] = (kind, True)
        if buffers:
            runs[peer_label(kind, buffers, repack=False)] = (kind, False)
    print(f"decode {a.new_tokens} tokens after {a.depth}, tok/s, median of {a.rounds} rounds (min-max)")
    for threads in (int(t) for t in a.threads.split(",")):
        got: dict[str, list[float]] = {label: [] for label in runs}
        errors = {}
        for _ in range(a.rounds):
            for label, (kind, repack) in runs.items():
                if label in errors:
                    continue
                try:
                    got[label].append(lc.tokens_per_s(gguf[kind], gen=a.new_tokens, depth=a.depth, threads=threads,
                                                      repack=repack))
                except RuntimeError as e:
                    errors[label] = str(e).splitlines()[0][:200]
        for label, ts in got.items():
            size = gguf[runs[label][0]].stat().st_size / 2**30
            text = (f"{statistics.median(ts):8.2f} ({min(ts):.2f}-{max(ts):.2f})" if ts else
                    f"not measured: {errors.get(label)}")
            print(f"  {threads} thread(s)  {label:<34} {text}  GGUF {size:.2f} GiB", flush=True)
    if not a.keep:
        for path in gguf.values():
            path.unlink()


if __name__ == "__main__":
    main()
