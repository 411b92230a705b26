"""`vl bench --geometry nano-12b-v2-vl --format nvfp4|fp8`: a released-size model on one CPU machine.

Random weights at the released widths and depth (the Nemotron Nano 12B v2 LLM of Nano V2 VL: `nano_12b_lm`)
are written straight into the ModelOpt FP8 / NVFP4 checkpoint layout, tensor by tensor and row block by row
block, so the whole BF16 model is never in memory (a 12B model is ~24 GB in BF16). The checkpoint is then
loaded as a user loads one (`vl.load_pretrained`, auto: weight-only on the CPU) and measured: load time, peak
RSS, prefill tokens/s, decode tokens/s, and decode as a fraction of the memory bandwidth that a copy kernel
reaches in the same process (bytes a decode step must read / time per token, against copy bandwidth counted
as bytes read + bytes written per second, the STREAM convention).

The vision tower is not built: text prefill and decode run on the LLM alone (the RADIO tower adds ~0.7B BF16
parameters, ~1.3 GB, when images are used). Random values: FP8 weights are N(0, 0.02) cast with a fixed per-tensor
scale (5 sigma = 448); NVFP4 weights are uniformly random E2M1 codes with block scales drawn near what
N(0, 0.02) would give (quantizing 11B Gaussian values in pure torch would take over an hour here). Speed does
not depend on the values; no NaN code is written.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import statistics
import struct
import tempfile
import time
from pathlib import Path

import psutil
import torch

import vl
from vl.bench import omni_geometry
from vl.bench.timing import PeakRSS, memory_counters, our_decode_s, our_prefill
from vl.config import lm_config_to_hf, nano_12b_lm
from vl.errors import ConfigError
from vl.modeling.nemotron_h import NemotronHForCausalLM
from vl.quant.export import exclude_patterns, make_hf_quant_config, quantizable_linear_names, write_hf_quant_config
from vl.quant.fp8 import E4M3_MAX, cast_to_fp8
from vl.quant.experts import routed_expert_bytes
from vl.quant.linear import resident_weight_bytes
from vl.quant.nvfp4 import E2M1_MAX
from vl.runtime.cache import HybridCache

GEOMETRIES = {"nano-12b-v2-vl": nano_12b_lm, omni_geometry.NAME: omni_geometry.lm_config}
STD = 0.02
ROW_BLOCK_ELEMS = 32 * 1024 * 1024  # elements generated at a time (128 MiB of float32)
# E4M3 codes 0x70..0x76 = 128..224: with the global scale below, |weights| ~ N(0, STD)'s (mean |E2M1| ~ 2.6)
NV_SCALE_CODES = (0x70, 0x76)
ROUTED_EXPERTS = (".mixer.experts.up_proj", ".mixer.experts.down_proj")  # fused (E, out, in) in the model
FP32_TENSORS = (".mixer.gate.weight", ".e_score_correction_bias")  # the MoE router runs in float32
_ST_DTYPE = {torch.bfloat16: "BF16", torch.float32: "F32", torch.uint8: "U8", torch.float8_e4m3fn: "F8_E4M3"}


def _entries(cfg, fmt: str):
    """[(key, dtype, shape, kind)] of the checkpoint, in model order. kind: 'dense' | 'weight' | 'scale' | ..."""
    with torch.device("meta"):
        model = NemotronHForCausalLM(cfg)
    quant = set(quantizable_linear_names(model, exclude_patterns()))
    out = []
    for name, t in model.state_dict().items():
        mod = name.rsplit(".", 1)[0]
        if name.endswith(ROUTED_EXPERTS):  # fused (E, out, in): packed per expert under the hub's names
            head, proj = name.rsplit(".", 1)
            for e in range(t.shape[0]):
                out += _packed_entries(f"{head}.{e}.{proj}", fmt, tuple(t.shape[1:]))
        elif mod in quant and name.endswith(".weight"):
            out += _packed_entries(mod, fmt, tuple(t.shape))
        else:
            dtype = torch.float32 if name.endswith(FP32_TENSORS) else torch.bfloat16
            out.append((name, dtype, tuple(t.shape), "dense"))
    return out, sorted(quant)


def _packed_entries(mod: str, fmt: str, shape: tuple[int, int]) -> list:
    """The checkpoint entries of one quantized Linear `mod` of weight shape (out, in), ModelOpt's layout."""
    o, i = shape
    if fmt == "fp8":
        return [(f"{mod}.weight", torch.float8_e4m3fn, (o, i), "fp8"), (f"{mod}.weight_scale", torch.float32, (), "s"),
                (f"{mod}.input_scale", torch.float32, (), "s")]
    return [(f"{mod}.weight", torch.uint8, (o, i // 2), "nvfp4"),
            (f"{mod}.weight_scale", torch.float8_e4m3fn, (o, i // 16), "nvfp4_scale"),
            (f"{mod}.weight_scale_2", torch.float32, (), "s2"),
            (f"{mod}.input_scale", torch.float32, (), "s2")]


def _random_bytes(n: int, g: torch.Generator) -> torch.Tensor:
    """n uniformly random bytes, 8 from each random int64 (4x faster than uint8 `randint` here, which bounded the
    writer of the 30B geometry's 15 GB of packed codes)."""
    return torch.randint(-2**63, 2**63 - 1, ((n + 7) // 8,), dtype=torch.int64, generator=g).view(torch.uint8)[:n]


def _nbytes(dtype, shape) -> int:
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


def write_random_checkpoint(cfg, fmt: str, out_dir, seed: int = 0, progress=None) -> Path:
    """Stream a random FP8 / NVFP4 checkpoint of `cfg` to `out_dir` (config.json, hf_quant_config.json,
    model.safetensors). Peak memory: one row block (~128 MiB of float32) plus its packed output."""
    from vl.quantize.ptq import FORMATS

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    entries, quantized = _entries(cfg, fmt)
    header, offset = {}, 0
    for key, dtype, shape, _ in entries:
        n = _nbytes(dtype, shape)
        header[key] = {"dtype": _ST_DTYPE[dtype], "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    header["__metadata__"] = {"format": "pt", "vl_bench_geometry": json.dumps({"format": fmt, "seed": seed})}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    amax = 5 * STD  # values beyond 5 sigma saturate (a handful per tensor)
    fp8_scale = torch.tensor(amax / E4M3_MAX)
    nv_scale2 = torch.tensor(amax / (E2M1_MAX * E4M3_MAX))
    in_scale = torch.tensor(1.0 / E4M3_MAX)
    g = torch.Generator().manual_seed(seed)
    pending_scales: dict[str, torch.Tensor] = {}
    with open(out_dir / "model.safetensors.part", "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for idx, (key, dtype, shape, kind) in enumerate(entries):
            if progress:
                progress(idx, len(entries), key)
            if kind == "dense" and ("norm" in key or key.endswith((".D", "A_log", "dt_bias"))):  # small vectors
                t = torch.empty(shape, dtype=dtype)
                if key.endswith("A_log"):
                    t.copy_(torch.log(torch.linspace(1, 16, shape[0])))
                else:
                    t.fill_(-4.0 if key.endswith("dt_bias") else 1.0)
                f.write(t.contiguous().view(torch.uint8).numpy().tobytes())
            elif kind == "dense":  # N(0, STD) in row blocks: the 12B embedding alone is 2.7 GB of float32
                cols = shape[-1] if shape else 1
                n_rows = math.prod(shape) // cols if cols else 0
                step = max(1, ROW_BLOCK_ELEMS // max(cols, 1))
                for r0 in range(0, n_rows, step):
                    block = (torch.randn(min(step, n_rows - r0), cols, generator=g) * STD).to(dtype)
                    f.write(block.view(torch.uint8).numpy().tobytes())
            elif kind in ("fp8", "nvfp4"):
                o, i = shape[0], shape[1] * (2 if kind == "nvfp4" else 1)
                rows = max(16, ROW_BLOCK_ELEMS // i // 16 * 16)
                scales = []
                for r0 in range(0, o, rows):
                    w = torch.randn(min(rows, o - r0), i, generator=g) * STD if kind == "fp8" else torch.empty(
                        min(rows, o - r0), 0)
                    if kind == "fp8":
                        q = cast_to_fp8(w / fp8_scale)
                        f.write(q.view(torch.uint8).numpy().tobytes())
                    else:  # random codes (every nibble is a valid E2M1 value) and block scales near N(0, STD)'s
                        n = w.shape[0]
                        f.write(_random_bytes(n * (i // 2), g).numpy().tobytes())
                        scales.append(torch.randint(NV_SCALE_CODES[0], NV_SCALE_CODES[1] + 1, (n, i // 16),
                                                    dtype=torch.uint8, generator=g).view(torch.float8_e4m3fn))
                if kind == "nvfp4":
                    pending_scales[key.rsplit(".", 1)[0] + ".weight_scale"] = torch.cat(scales)
            elif kind == "nvfp4_scale":
                f.write(pending_scales.pop(key).view(torch.uint8).numpy().tobytes())
            else:  # scalar scales
                v = fp8_scale if kind == "s" and key.endswith("weight_scale") else (
                    nv_scale2 if key.endswith("weight_scale_2") else in_scale)
                f.write(v.float().reshape(()).numpy().tobytes())
    os.replace(out_dir / "model.safetensors.part", out_dir / "model.safetensors")
    algo = FORMATS[fmt]
    # the MoE router is not a Linear and stays float32; named for the readers of hf_quant_config.json
    hf_cfg = make_hf_quant_config(algo, exclude_patterns(extra=("*mixer.gate",) if "E" in cfg.pattern else ()))
    q = hf_cfg["quantization"]
    cfg_json = lm_config_to_hf(cfg)
    cfg_json.update(model_type="nemotron_h", architectures=["NemotronHForCausalLM"], torch_dtype="bfloat16",
                    quantization_config={"quant_method": "modelopt", "quant_algo": algo,
                                         "kv_cache_quant_algo": q["kv_cache_quant_algo"],
                                         "exclude_modules": q["exclude_modules"],
                                         **({"group_size": q["group_size"]} if "group_size" in q else {})})
    (out_dir / "config.json").write_text(json.dumps(cfg_json, indent=2))
    write_hf_quant_config(out_dir, hf_cfg)
    return out_dir


def copy_bandwidth(nbytes: int = 1 << 30, repeats: int = 5) -> float:
    """Bytes read + written per second by torch's copy of a `nbytes` buffer (best of `repeats`)."""
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    del src, dst
    return 2 * nbytes / best


def decode_bytes(model) -> int:
    """Bytes one decode step reads: every parameter and buffer except the embedding table (one row is read),
    unless the output head shares it (tied embeddings), which reads it whole; of a MoE layer's routed experts only
    the top k of E (the router picks k per token and the MoE forward reads only their rows or modules; every
    expert of a layer has the same size)."""
    cfg = model.config
    emb = model.backbone.embeddings.weight
    head = getattr(getattr(model, "lm_head", None), "weight", None)
    tied = head is not None and head.data_ptr() == emb.data_ptr()
    experts = routed_expert_bytes(model)
    read = experts * cfg.num_experts_per_tok // cfg.n_routed_experts if cfg.n_routed_experts else 0
    return resident_weight_bytes(model) - (0 if tied else emb.numel() * emb.element_size()) - experts + read


def load(path, cfg):
    """The written checkpoint as a user would run it: `vl.load_pretrained` (a MoE's packed routed experts stay
    packed, one quantized Linear per expert: vl/checkpoint/quantized.py)."""
    return vl.load_pretrained(path, dtype=torch.bfloat16)


def geometry_config(geometry: str, layers: int | None = None):
    """The released config of `geometry`, or its first `layers` layers at the same widths (quick runs)."""
    cfg = GEOMETRIES[geometry]()
    if layers is not None:
        if not 0 < layers <= cfg.num_hidden_layers:
            raise ConfigError(f"layers={layers}: expected 1..{cfg.num_hidden_layers} for {geometry}")
        cfg = dataclasses.replace(cfg, pattern=cfg.pattern[:layers])
    return cfg


def run(geometry: str, fmt: str, *, work_dir=None, prefill: int = 2048, decode_ctx: int = 128, new_tokens: int = 8,
        repeats: int = 1, keep: bool = False, layers: int | None = None, cache_len: int | None = None,
        decode_threads: tuple[int, ...] | None = None, log=print) -> dict:
    """Write, load and time a random checkpoint of `geometry` (a name of GEOMETRIES, or an LMConfig).
    `cache_len`: also hold a hybrid cache of that many tokens, written through, for the whole run (the peak RSS of a
    request of that length without prefilling it). `decode_threads`: time the decode, and the copy kernel, at each
    of these torch thread counts (default: the current one)."""
    cfg = geometry_config(geometry, layers) if isinstance(geometry, str) else geometry
    if isinstance(geometry, str) and layers is not None:
        geometry = f"{geometry} (first {layers} of {GEOMETRIES[geometry]().num_hidden_layers} layers)"
    geometry = geometry if isinstance(geometry, str) else "custom"
    tmp = tempfile.mkdtemp(prefix=f"vl-geometry-{fmt}-", dir=work_dir)
    threads = tuple(decode_threads or (torch.get_num_threads(),))
    result = dict(geometry=geometry, format=fmt, threads=torch.get_num_threads())
    try:
        t0 = time.perf_counter()
        last = [0.0]

        def progress(i, n, key):
            if time.perf_counter() - last[0] > 30:
                last[0] = time.perf_counter()
                log(f"[vl bench] writing random {fmt} weights: tensor {i}/{n} ({key})")

        path = write_random_checkpoint(cfg, fmt, Path(tmp) / "model", progress=progress)
        result["write_s"] = time.perf_counter() - t0
        result["checkpoint_bytes"] = sum(p.stat().st_size for p in path.iterdir())
        log(f"[vl bench] wrote {result['checkpoint_bytes'] / 2**30:.2f} GiB in {result['write_s']:.0f} s; loading")

        proc = psutil.Process()
        with PeakRSS("cpu") as peak:
            t0 = time.perf_counter()
            model = load(path, cfg)
            result["load_s"] = time.perf_counter() - t0
            result["quant_mode"] = model.quantization.mode if getattr(model, "quantization", None) else (
                "weight-only, routed experts packed" if "E" in cfg.pattern else None)
            result["resident_weight_bytes"] = resident_weight_bytes(model)
            if "E" in cfg.pattern:
                result["resident_split"] = omni_geometry.resident_split(model)
            result["after_load"] = memory_counters()
            peak.mark("load")
            held = None
            if cache_len:  # written through, so that every page of it is resident
                held = HybridCache(cfg, 1, cache_len, dtype=torch.bfloat16)
                result["held_cache_bytes"] = held.nbytes()
                result["cache_len"] = cache_len
                for layer in held.layers:
                    for t in vars(layer).values() if layer is not None else ():
                        t.zero_()
            log(f"[vl bench] loaded in {result['load_s']:.0f} s; prefill @{prefill}, {repeats} run(s)")
            gen = torch.Generator().manual_seed(0)
            ids = torch.randint(3, cfg.vocab_size, (1, prefill), generator=gen)
            times = []
            for k in range(repeats):
                t0 = time.perf_counter()
                our_prefill(model, ids)
                times.append(time.perf_counter() - t0)
                log(f"[vl bench] prefill run {k + 1}/{repeats}: {prefill / times[-1]:.1f} tok/s")
            result["prefill_tok_s"] = prefill / statistics.median(times)
            peak.mark("prefill")
            log(f"[vl bench] prefill @{prefill}: {result['prefill_tok_s']:.1f} tok/s")
            ctx = ids[:, :decode_ctx]
            by_threads = {}
            before = memory_counters()
            for n in threads:
                torch.set_num_threads(n)
                our_decode_s(model, ctx[:, :1], 1)  # untimed: each layer binds its decode kernel once (FP8: NaN scan)
                log(f"[vl bench] decode on {n} thread(s): {new_tokens} tokens after {decode_ctx}, {repeats} run(s)")
                by_threads[n] = {"decode_s_per_tok": statistics.median(
                    our_decode_s(model, ctx, new_tokens) for _ in range(repeats))}
            result["after_decode"] = after = memory_counters()
            if before and after:  # pages the timed runs (context prefill + decode) read back from storage
                result["decode_major_faults"] = after["majflt"] - before["majflt"]
                result["decode_disk_read_bytes"] = after["read_bytes"] - before["read_bytes"]
            peak.mark("decode")
            del held
        result["peak_rss_bytes"] = peak.peak + peak.base
        result["peak_rss_by_phase"] = peak.phases
        result["decode_read_bytes"] = decode_bytes(model)
        del model
        for n, d in by_threads.items():
            torch.set_num_threads(n)
            d["decode_tok_s"] = 1 / d["decode_s_per_tok"]
            d["decode_GBps"] = result["decode_read_bytes"] / d["decode_s_per_tok"] / 1e9
            d["copy_GBps"] = copy_bandwidth() / 1e9
            d["decode_vs_copy"] = d["decode_GBps"] / d["copy_GBps"]
        torch.set_num_threads(result["threads"])
        result.update(by_threads[threads[0]])  # the first thread count's figures under the single-run keys
        if len(threads) > 1:
            result["decode_by_threads"] = by_threads
        result["rss_now_bytes"] = proc.memory_info().rss
        result.update(prefill=prefill, decode_ctx=decode_ctx, new_tokens=new_tokens, repeats=repeats)
        return result
    finally:
        if keep:
            log(f"[vl bench] kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def format_result(r: dict) -> str:
    gib = 2**30
    return "\n".join([
        f"{r['geometry']} {r['format']} (random weights, LLM only), {r['threads']} CPU threads, weight-only "
        f"({r.get('quant_mode')})",
        f"  checkpoint            {r['checkpoint_bytes'] / gib:8.2f} GiB   written in {r['write_s']:.0f} s (streamed)",
        f"  load time             {r['load_s']:8.1f} s",
        f"  peak RSS              {r['peak_rss_bytes'] / gib:8.2f} GiB   (resident weights "
        f"{r['resident_weight_bytes'] / gib:.2f} GiB)",
        "  peak RSS by phase     " + ", ".join(f"{k} {v / gib:.2f}" for k, v in r.get("peak_rss_by_phase", {}).items())
        + " GiB",
        f"  prefill @{r['prefill']:<5}        {r['prefill_tok_s']:8.2f} tok/s",
        f"  decode after {r['decode_ctx']:<5}    {r['decode_tok_s']:8.3f} tok/s   ({r['new_tokens']} tokens, median of "
        f"{r['repeats']}, after an untimed warm-up step)",
        f"  decode reads          {r['decode_GBps']:8.2f} GB/s   = {r['decode_vs_copy']:.0%} of the copy kernel's "
        f"{r['copy_GBps']:.1f} GB/s (read + write, same process)",
    ] + _thread_lines(r) + _memory_lines(r) + _split_lines(r))


def _thread_lines(r: dict) -> list[str]:
    """One line per decode thread count, when more than one was timed."""
    return [f"  decode, {n} thread(s)    {d['decode_tok_s']:8.3f} tok/s   {d['decode_GBps']:.2f} GB/s = "
            f"{d['decode_vs_copy']:.0%} of copy at {n} thread(s) ({d['copy_GBps']:.1f} GB/s)"
            for n, d in r.get("decode_by_threads", {}).items()]


def _split_lines(r: dict) -> list[str]:
    """What a decode step reads, the held cache, and (MoE models) the resident bytes by part."""
    gb = 1e9
    out = [f"  read per decode step  {r['decode_read_bytes'] / gb:8.3f} GB (weights; routed experts: top-k only)"]
    if "held_cache_bytes" in r:
        out.append(f"  held cache @{r['cache_len']:<6}    {r['held_cache_bytes'] / gb:8.3f} GB, written through (in the "
                   "peak RSS)")
    split = r.get("resident_split")
    if split:
        out.append("  resident by part      " + ", ".join(f"{k} {v / gb:.3f}" for k, v in split.items()) + " GB")
    return out


def _memory_lines(r: dict) -> list[str]:
    """Where the weights lived: anonymous vs file-backed resident bytes, and what the timed decode read from disk."""
    gib, out = 2**30, []
    for label, key in (("after load", "after_load"), ("after decode", "after_decode")):
        c = r.get(key) or {}
        if "RssAnon" in c:
            out.append(f"  resident {label:<13}{c['RssAnon'] / gib:8.2f} GiB anonymous + {c['RssFile'] / gib:.2f} GiB "
                       "file-backed")
    if "decode_major_faults" in r:
        out.append(f"  decode from disk      {r['decode_disk_read_bytes'] / 1e6:8.1f} MB read, {r['decode_major_faults']} "
                   "major page faults (timed runs)")
    return out
