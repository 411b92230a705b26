"""`vl bench`: speed and memory of our runtime against transformers, measured in one process.

Every figure is a ratio against a named reference run in the same process on the same weights, with the
runs interleaved (ours, theirs, ours, theirs, ...; each round starts one run later than the last) so that
machine noise hits both; we report the medians, and for llama.cpp and the FP8 / NVFP4 rows also the "paired" ratio:
the median of each round's own ratio, which drifts in the machine's speed between rounds do not enter.
- prefill tokens/s: ours = chunked prefill into the static cache (what the engine does); transformers =
  `model(input_ids, use_cache=True, logits_to_keep=1)` (what its `generate` does for the prompt);
- decode tokens/s after a context of n tokens: k / (time from the first generated token to the (k+1)-th), read
  from timestamps taken as each token arrives (our `generate_steps` events; a streamer on transformers'
  `generate`), greedy: the prefill never enters the figure, so no noisy subtraction of two timings;
- decode bandwidth (CPU): the bytes a decode step reads (every weight once, one embedding row) per second, against
  what torch's copy of a 256 MiB buffer reaches (read + write), timed in the same rotation;
- cache bytes: our hybrid cache at 32k tokens against the KV cache of an equal-size all-attention model;
- `--formats fp8,nvfp4`: the same weights quantized as `vl quantize` writes them and loaded as a user loads them
  (auto: weight-only on the CPU, decode through the fused kernels of docs/quant_cpu_kernels.md), in the same
  rounds, with their resident bytes;
- `--llama-cpp DIR`: llama.cpp's `llama-bench` on the same weights converted to GGUF f32 / bf16 / q8_0 and
  quantized to q4_0 / q4_K_M, one repetition per round in the same rotation (docs/bench_llama_cpp.md);
- `--geometry nano-12b-v2-vl --format nvfp4|fp8`: a released-size model with random weights streamed to disk
  (vl/bench/geometry.py); with `--media`, a page, a video or a long video with its sound through `vl.Engine.chat`
  at the released widths, each stage timed (vl/bench/media.py);
- `--vision-tower bf16|fp32`: the released-size RADIO tower + projector on one tile against transformers'
  `RadioModel` (vl/bench/vision.py).
Each row carries its spread, (max - min) / median of its repeats; the CPU's vector ISA is printed with the table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from vl.bench import geometry as bench_geometry
from vl.bench import quant as quant_bench
from vl.bench import llama_cpp_mtmd
from vl.bench import vision as vision_bench
from vl.bench.llama_cpp import QUANT_KINDS, QUANTIZED, LlamaCpp
from vl.bench.quant import quantized_copy
from vl.bench.timing import PeakRSS, _sync, cpu_isa, our_decode_s, our_prefill  # noqa: F401 - re-exported
from vl.config import LMConfig, bench_180m_lm, lm_config_to_hf
from vl.errors import GenerationOptionError
from vl.kernels import gemv, ssd_scan
from vl.modeling import kernels
from vl.modeling.nemotron_h import NemotronHForCausalLM
from vl.quant.linear import QuantizedLinear, resident_weight_bytes
from vl.runtime.cpu import decode as cpu_decode
from vl.runtime.cpu import matmul as cpu_matmul
from vl.runtime.cache import HybridCache
from vl.runtime.decode_step import DEPRECATED_MODES, decode_mode
from vl.runtime.pretrained import runtime_passes

CONFIGS = {
    "180m": bench_180m_lm,
    "1b": lambda: bench_180m_lm(hidden_size=2048, pattern="M-M-M*-M-M-M-M*-M-M-M-M-M-M*-M-M-", mamba_num_heads=64,
                                intermediate_size=6144, num_attention_heads=16, num_key_value_heads=4, vocab_size=32768),
    "tiny": lambda: LMConfig(vocab_size=4096, hidden_size=128, pattern="M-M*-M-", num_attention_heads=4,
                             num_key_value_heads=2, head_dim=32, intermediate_size=256, mamba_num_heads=8,
                             mamba_head_dim=32, n_groups=2, ssm_state_size=32, chunk_size=128),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def interleaved(fns: dict, repeats: int, failed: dict | None = None) -> dict[str, list[float]]:
    """Seconds per call of each fn, runs interleaved; a fn that returns a float reports its own timing. Each round
    starts one fn later than the one before (a rotation), so that no fn always runs right after the same other.
    `failed`: a dict that collects {key: error} of the fns whose warm-up call raised RuntimeError (an external peer
    that crashed); those are left out of the rounds. Without it any error propagates."""
    out = {k: [] for k in fns}
    for k, f in list(fns.items()):  # warm-up
        try:
            f()
        except RuntimeError as e:
            if failed is None:
                raise
            failed[k] = str(e)
            fns = {j: g for j, g in fns.items() if j != k}
            del out[k]
    items = list(fns.items())
    for r in range(repeats):
        for k, f in items[r % len(items):] + items[:r % len(items)]:
            _sync()
            t0 = time.perf_counter()
            own = f()
            _sync()
            out[k].append(own if isinstance(own, float) else time.perf_counter() - t0)
    return out


def build_pair(cfg: LMConfig, dtype, device="cpu"):
    import transformers

    torch.manual_seed(0)
    ours = NemotronHForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in ours.named_parameters():
            if p.dim() > 1:
                p.normal_(0, 0.02)
    hf = transformers.NemotronHForCausalLM(transformers.NemotronHConfig(**lm_config_to_hf(cfg))).eval()
    hf.load_state_dict({k.replace("backbone.", "model.", 1): v for k, v in ours.state_dict().items()})
    ours = runtime_passes(ours.to(device, dtype))  # as vl.load_pretrained does
    return ours, hf.to(device, dtype)


@torch.no_grad()
def hf_prefill(model, ids):
    model(ids, use_cache=True, logits_to_keep=1)


class _Stamps:
    """A transformers streamer that only records when each generated token arrives (the first put is the prompt)."""

    def __init__(self):
        self.puts = []

    def put(self, value):
        _sync()
        self.puts.append(time.perf_counter())

    def end(self):
        pass


@torch.no_grad()
def hf_decode_s(model, ids, n) -> float:
    s = _Stamps()
    model.generate(ids, max_new_tokens=n + 1, min_new_tokens=n + 1, do_sample=False, eos_token_id=None,
                   pad_token_id=0, streamer=s)
    return (s.puts[-1] - s.puts[1]) / n


def copy_s_per_byte(nbytes: int = 256 << 20):
    """A timing fn for `interleaved`: seconds per byte read + written by torch's copy of an `nbytes` buffer (best
    of 3), the memory-bandwidth reference a decode step's weight read is set against (as in
    vl/bench/geometry.py)."""
    return lambda: 1.0 / bench_geometry.copy_bandwidth(nbytes, repeats=3)


@torch.no_grad()
def ssd_scan_fns(cfg: LMConfig, t: int, device="cpu"):
    """The SSD scan alone, on one Mamba layer's shapes (b=1): ours and transformers' torch path."""
    from transformers.models.nemotron_h.modeling_nemotron_h import mamba2_chunk_scan


    g = torch.Generator().manual_seed(0)
    h, p, n, grp = cfg.mamba_num_heads, cfg.mamba_head_dim, cfg.ssm_state_size, cfg.n_groups
    x = torch.randn(1, t, h, p, generator=g).to(device)
    dt = (torch.rand(1, t, h, generator=g) * 0.1).to(device)
    A = -torch.rand(h, generator=g).to(device)
    B, C = (torch.randn(1, t, grp, n, generator=g).to(device) for _ in range(2))
    return (lambda: kernels.ssd_scan(x, dt, A, B, C, cfg.chunk_size),
            lambda: mamba2_chunk_scan(x, dt, A, B, C, cfg.chunk_size, return_final_states=True))


def cache_bytes(cfg: LMConfig, length: int = 32768) -> dict:
    ours = HybridCache(cfg, 1, length, dtype=torch.bfloat16, device="meta").nbytes()
    attn = cfg.replace(pattern="".join("*" if c in "M*" else c for c in cfg.pattern))
    full = HybridCache(attn, 1, length, dtype=torch.bfloat16, device="meta").nbytes()
    return {"context": length, "hybrid_bytes": ours, "all_attention_bytes": full, "ratio": ours / full}


def bench_lm(name: str, dtype_name: str, prefill=(512, 2048, 8192), decode_ctx=(128, 4096), new_tokens=32,
             repeats=3, device="cpu", decode_modes=("fused",), formats=(), llama=None, gguf=None) -> list[dict]:
    """Rows for one config and dtype. `formats` (fp8, nvfp4): the same weights quantized as `vl quantize` does and
    loaded as a user loads them (auto: weight-only on the CPU), timed in the same interleaved runs. `llama`: a
    `llama_cpp.LlamaCpp` and `gguf` {kind: path} of these weights; its llama-bench runs join the rotation."""
    cfg = CONFIGS[name]()
    dtype = DTYPES[dtype_name]
    ours, hf = build_pair(cfg, dtype, device)
    params = sum(p.numel() for p in ours.parameters())
    rows = []
    gen = torch.Generator().manual_seed(0)
    quant = {}
    if formats:
        calib = torch.randint(3, cfg.vocab_size, (1, 64), generator=torch.Generator().manual_seed(1)).to(device)
        for fmt in formats:
            quant[fmt] = quantized_copy(ours, fmt, calib)
    # label -> (gguf kind, repack): llama.cpp at this dtype, and in the bf16 pass its quantized GGUFs next to our
    # FP8 / NVFP4, each named for the kernels it ran (AMX, CPU_REPACK) with a --repack 0 row beside (llama_cpp.py)
    peers = llama.peers(dtype_name, gguf) if llama is not None and gguf else {}
    threads = torch.get_num_threads()
    for t in prefill:
        ids = torch.randint(3, cfg.vocab_size, (1, t), generator=gen).to(device)
        with PeakRSS(device) as m_ours:
            our_prefill(ours, ids)
        with PeakRSS(device) as m_hf:
            hf_prefill(hf, ids)
        fns = {"ours": lambda: our_prefill(ours, ids), "hf": lambda: hf_prefill(hf, ids)}
        if t == 2048:  # the SSD scan's share of prefill: the scan alone x the number of Mamba layers
            fns["ssd_ours"], fns["ssd_hf"] = ssd_scan_fns(cfg, t, device)
        for fmt, qm in quant.items():
            fns[fmt] = lambda qm=qm: our_prefill(qm, ids)
        for label, (kind, repack) in peers.items():
            fns[label] = lambda kind=kind, repack=repack: t / llama.tokens_per_s(gguf[kind], prompt=t, threads=threads,
                                                                                 repack=repack)
        failed = {}
        times = interleaved(fns, repeats, failed)
        o, h = statistics.median(times["ours"]), statistics.median(times["hf"])
        row = dict(config=name, params=params, dtype=dtype_name, metric=f"prefill tok/s @{t}",
                   ours=t / o, transformers=t / h, ratio=h / o,
                   ours_peak_rss=m_ours.peak, transformers_peak_rss=m_hf.peak, spread=_spread(times["ours"]))
        if "ssd_ours" in times:
            layers = len(cfg.mamba_layers)
            row["ours_ssd_share"] = min(1.0, layers * statistics.median(times["ssd_ours"]) / o)
            row["transformers_ssd_share"] = min(1.0, layers * statistics.median(times["ssd_hf"]) / h)
        rows.append(row)
        for fmt in quant:
            q = statistics.median(times[fmt])
            rows.append(dict(config=name, params=params, dtype=dtype_name, metric=f"prefill tok/s @{t} ({fmt})",
                             format=fmt, ours=t / q, transformers=t / h, ratio=h / q, vs_ours=o / q,
                             spread=_spread(times[fmt])))
        for label in peers:
            if label in failed:
                rows.append(dict(config=name, params=params, dtype=dtype_name, metric=f"prefill tok/s @{t}",
                                 peer=label, ours=t / o, peer_error=failed[label]))
                continue
            p_ = statistics.median(times[label])
            rows.append(dict(config=name, params=params, dtype=dtype_name, metric=f"prefill tok/s @{t}", peer=label,
                             ours=t / o, peer_tok_s=t / p_, ratio=p_ / o, paired=paired(times[label], times["ours"]),
                             spread=_spread(times[label]), peer_gguf_bytes=gguf[peers[label][0]].stat().st_size))
    on_cpu = torch.device(device).type == "cpu"
    read_bytes = {m: bench_geometry.decode_bytes(m) for m in (ours, *quant.values())}  # per token, once
    for ctx in decode_ctx:
        ids = torch.randint(3, cfg.vocab_size, (1, ctx), generator=gen).to(device)
        fns = {"hf": lambda: hf_decode_s(hf, ids, new_tokens)}
        if on_cpu:
            fns["copy"] = copy_s_per_byte()
        for mode in decode_modes:
            fns[mode] = lambda m=mode: our_decode_s(ours, ids, new_tokens, m)  # "modules": what "fused" replaces
        for fmt, qm in quant.items():
            fns[fmt] = lambda qm=qm: our_decode_s(qm, ids, new_tokens, "fused")
        for label, (kind, repack) in peers.items():
            fns[label] = lambda kind=kind, repack=repack: 1 / llama.tokens_per_s(gguf[kind], gen=new_tokens, depth=ctx,
                                                                                 threads=threads, repack=repack)
        failed = {}
        times = interleaved(fns, repeats, failed)
        h = statistics.median(times["hf"])
        copy_GBps = 1e-9 / statistics.median(times["copy"]) if on_cpu else None
        for mode in decode_modes:
            o = statistics.median(times[mode])
            label = f"decode tok/s after {ctx}" + ("" if mode == "fused" else f" ({mode})")
            rows.append(dict(config=name, params=params, dtype=dtype_name, metric=label, decode=mode,
                             ours=1 / o, transformers=1 / h, ratio=h / o, spread=_spread(times[mode]),
                             ours_weight_GBps=read_bytes[ours] / o / 1e9, copy_GBps=copy_GBps))
        base = statistics.median(times[decode_modes[0]])
        for fmt, qm in quant.items():
            q = statistics.median(times[fmt])
            packed = sum(resident_weight_bytes(m) for m in qm.modules() if isinstance(m, QuantizedLinear))
            as_bf16 = sum(2 * m.in_features * m.out_features for m in qm.modules() if isinstance(m, QuantizedLinear))
            rows.append(dict(config=name, params=params, dtype=dtype_name, metric=f"decode tok/s after {ctx} ({fmt})",
                             format=fmt, ours=1 / q, transformers=1 / h, ratio=h / q, vs_ours=base / q,
                             vs_ours_paired=paired(times[decode_modes[0]], times[fmt]), ours_mode=decode_modes[0],
                             resident_bytes=resident_weight_bytes(qm),
                             dense_resident_bytes=resident_weight_bytes(ours), packed_bytes=packed,
                             packed_as_bf16_bytes=as_bf16, spread=_spread(times[fmt]),
                             ours_weight_GBps=read_bytes[qm] / q / 1e9, copy_GBps=copy_GBps))
        for label in peers:
            if label in failed:
                rows.append(dict(config=name, params=params, dtype=dtype_name, metric=f"decode tok/s after {ctx}",
                                 peer=label, ours=1 / statistics.median(times[decode_modes[0]]),
                                 peer_error=failed[label]))
                continue
            p_ = statistics.median(times[label])
            for mode in decode_modes:
                ref = statistics.median(times[mode])
                rows.append(dict(config=name, params=params, dtype=dtype_name, peer=label, ours_mode=mode,
                                 metric=f"decode tok/s after {ctx}" + ("" if mode == "fused" else f" ({mode})"),
                                 ours=1 / ref, peer_tok_s=1 / p_, ratio=p_ / ref,
                                 paired=paired(times[label], times[mode]), spread=_spread(times[label]),
                                 peer_gguf_bytes=gguf[peers[label][0]].stat().st_size))
            for fmt in quant:
                q = statistics.median(times[fmt])
                rows.append(dict(config=name, params=params, dtype=dtype_name, peer=label,
                                 metric=f"decode tok/s after {ctx} ({fmt})", ours=1 / q, peer_tok_s=1 / p_,
                                 ratio=p_ / q, paired=paired(times[label], times[fmt]), spread=_spread(times[fmt])))
    return rows


def paired(slow: list[float], fast: list[float]) -> tuple[float, float, float]:
    """Round by round ratios slow[i] / fast[i] of two fns timed in the same `interleaved` rounds -> (median, min,
    max). Where the machine's speed drifts between rounds (shared cloud cores: up to 1.5x within minutes), each
    round's ratio compares two timings taken seconds apart; the ratio of the two medians may pair a fast moment of
    one with a slow moment of the other."""
    ratios = [s / f for s, f in zip(slow, fast, strict=True)]
    return statistics.median(ratios), min(ratios), max(ratios)


def _spread(seconds: list[float]) -> float:
    """(max - min) / median of one measurement's repeats: how noisy the machine was."""
    return (max(seconds) - min(seconds)) / statistics.median(seconds) if seconds else float("nan")


def _bandwidth(r: dict) -> str:
    """A decode row's weight read rate, and its share of the copy kernel's rate where one was measured."""
    out = f"{r['ours_weight_GBps']:.1f} GB/s"
    if r.get("copy_GBps"):  # None where no copy was timed (CUDA)
        out += f" = {r['ours_weight_GBps'] / r['copy_GBps']:.0%} of copy ({r['copy_GBps']:.1f} GB/s r+w)"
    return out


def _paired_text(p) -> str:
    return f"{p[0]:.2f}x ({p[1]:.2f}-{p[2]:.2f})"


def format_table(rows: list[dict]) -> str:
    head = f"{'config':<6} {'dtype':<5} {'metric':<36} {'ours':>10} {'transformers':>13} {'ratio':>7}  notes"
    lines = [head, "-" * len(head)]
    peer_rows = [r for r in rows if "peer" in r]
    for r in rows:
        if "peer" in r:
            continue
        note = ""
        if "format" in r:
            note = f"{r['vs_ours']:.2f}x our {r['dtype']} ({r.get('ours_mode', 'fused')})"
            if "vs_ours_paired" in r:
                note += " [paired " + _paired_text(r["vs_ours_paired"]) + "]"
            if "resident_bytes" in r:
                note += (f"; weights {r['resident_bytes'] / 2**20:.0f} MiB vs {r['dense_resident_bytes'] / 2**20:.0f} "
                         f"MiB, packed Linears {r['packed_bytes'] / 2**20:.0f} MiB = "
                         f"{r['packed_bytes'] / r['packed_as_bf16_bytes']:.3f} of their BF16")
            if "ours_weight_GBps" in r:
                note += "; reads " + _bandwidth(r)
        elif "ours_weight_GBps" in r:
            note = "ours reads weights at " + _bandwidth(r)
        elif "ours_peak_rss" in r:
            note = f"peak RSS +{r['ours_peak_rss'] / 2**20:.0f} MiB vs +{r['transformers_peak_rss'] / 2**20:.0f} MiB"
            if "ours_ssd_share" in r:
                note += (f"; SSD scan share {r['ours_ssd_share']:.0%} vs {r['transformers_ssd_share']:.0%}")
        elif "hybrid_bytes" in r:
            lines.append(f"{r['config']:<6} {'bf16':<5} {'cache bytes @32k':<36} {r['hybrid_bytes'] / 2**20:>9.1f}M "
                         f"{r['all_attention_bytes'] / 2**20:>12.1f}M {r['ratio']:>7.3f}  all-attention model of "
                         f"the same size = the reference")
            continue
        if "spread" in r:
            note = f"spread {r['spread']:.0%}; " + note
        lines.append(f"{r['config']:<6} {r['dtype']:<5} {r['metric']:<36} {r['ours']:>10.1f} {r['transformers']:>13.1f} "
                     f"{r['ratio']:>6.2f}x  {note}")
    if peer_rows:
        w = max(23, *(len(r["peer"]) for r in peer_rows))  # "llama.cpp q4_K_M AMX+CPU_REPACK" and the like
        head = f"{'config':<6} {'dtype':<5} {'metric':<36} {'ours':>10} {'peer':<{w}} {'peer tok/s':>10} {'ratio':>7}"
        lines += ["", "against llama.cpp (its llama-bench, 1 repetition per round, interleaved with ours; ratio: of "
                  "the medians; paired: the median of the rounds' own ratios, with their range):", head,
                  "-" * len(head)]
        for r in peer_rows:
            if "peer_error" in r:
                lines.append(f"{r['config']:<6} {r['dtype']:<5} {r['metric']:<36} {r['ours']:>10.1f} {r['peer']:<{w}} "
                             f"{'-':>10} {'-':>7}  not measured: {r['peer_error'].splitlines()[0][:160]}")
                continue
            pair = f"; paired {_paired_text(r['paired'])}" if "paired" in r else ""
            size = f"; GGUF {r['peer_gguf_bytes'] / 2**20:.0f} MiB" if "peer_gguf_bytes" in r else ""
            lines.append(f"{r['config']:<6} {r['dtype']:<5} {r['metric']:<36} {r['ours']:>10.1f} {r['peer']:<{w}} "
                         f"{r['peer_tok_s']:>10.1f} {r['ratio']:>6.2f}x  spread {r['spread']:.0%}{pair}{size}")
    return "\n".join(lines)


def decode_modes(p: argparse.ArgumentParser, text: str) -> tuple[str, ...]:
    """`--decode`'s comma list as decode modes: "eager", the old name of "fused", is taken with a note on stderr
    (and the runtime's DeprecationWarning); an unknown mode is a usage error."""
    modes = []
    for mode in text.split(","):
        if mode in DEPRECATED_MODES:
            print(f"[vl bench] --decode {mode} is now {DEPRECATED_MODES[mode]} (the old name goes in the next "
                  "release)", file=sys.stderr)
        try:
            modes.append(decode_mode(mode))
        except GenerationOptionError as e:
            p.error(f"--decode: {e}")
    return tuple(dict.fromkeys(modes))


def _media(p: argparse.ArgumentParser, a) -> int:
    """`--geometry G --media [ITEMS]`: the end-to-end request table of vl/bench/media.py."""
    from vl.bench import media as media_bench  # the engine and the processors: transformers, only for this table

    items = media_bench.ITEMS[a.geometry] if a.media == "all" else tuple(i for i in a.media.split(",") if i)
    bad = [i for i in items if i not in media_bench.ITEMS[a.geometry]]
    if bad or not items:
        p.error(f"--media: {', '.join(bad) or 'no item'} for {a.geometry}; expected some of "
                f"{', '.join(media_bench.ITEMS[a.geometry])}")
    r = media_bench.run(a.geometry, a.format, items, work_dir=a.work_dir, layers=a.layers, keep=a.keep,
                        decode_tokens=a.new_tokens, log=lambda m: print(m, file=sys.stderr, flush=True))
    print(f"torch {torch.__version__}; CPU: {cpu_isa()}")
    print(media_bench.format_result(r))
    if a.json:
        text = json.dumps(r, indent=2)
        print(text) if a.json == "-" else Path(a.json).write_text(text)
    return 0


def main(argv: list[str] | None = None, calib_source=None) -> int:
    """`vl bench`; `calib_source` feeds the FP8/NVFP4 table (`--quant`): vl/cli.py supplies the synthetic one."""
    p = argparse.ArgumentParser(prog="vl bench", description=__doc__.split("\n")[0])
    p.add_argument("--configs", default="180m,tiny", help="comma list of: " + ", ".join(CONFIGS))
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--prefill", default="512,2048,8192", help="prompt lengths for prefill throughput ('' for none)")
    p.add_argument("--decode-ctx", default="128,4096", help="context lengths before decode")
    p.add_argument("--new-tokens", type=int, default=32, help="tokens decoded per measurement; with --media, after "
                   "each item's first token (decode speed at the item's context)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--decode", default=None, help="our decode step modes to time, comma list of fused (the fused "
                   "C++ step where it applies, else the modules), modules (the step through the modules, without the "
                   "fused CPU step), static, compiled, cuda-graphs; eager is the old name of fused (default: "
                   "fused,modules,compiled on cpu, modules,cuda-graphs on cuda)")
    p.add_argument("--quick", action="store_true", help="small sizes, one repeat: a smoke run")
    p.add_argument("--quant", action="store_true", help="also the FP8 / NVFP4 table (vl/bench/quant.py): resident "
                   "weight bytes, decode tok/s per mode, logit error and greedy agreement against BF16")
    p.add_argument("--quant-only", action="store_true", help="only the FP8 / NVFP4 table")
    p.add_argument("--formats", default="", help="also time our FP8 / NVFP4 weight-only decode and prefill on "
                   "the same weights: comma list of fp8, nvfp4 (e.g. --formats fp8,nvfp4)")
    p.add_argument("--llama-cpp", default=None, metavar="DIR", help="a llama.cpp source tree with a cmake build "
                   "(DIR/build/bin/llama-bench, llama-quantize): convert the same weights to GGUF f32/bf16/q8_0 with "
                   "its convert_hf_to_gguf.py, quantize the bf16 one to q4_0/q4_K_M and to q8_0/q4_0 with the output "
                   "head left in bf16 (the -bf16head kinds) with its llama-quantize, and time its llama-bench in the "
                   "same rounds")
    p.add_argument("--llama-cpp-quants", default=",".join(QUANT_KINDS), help="--llama-cpp: the quantized GGUFs "
                   "timed in the bf16 pass, comma list of " + ", ".join(QUANT_KINDS) + " ('' for none)")
    p.add_argument("--llama-cpp-python", default=None, help="Python that runs the converter (default: this one; "
                   "it needs torch, numpy, safetensors and transformers)")
    p.add_argument("--work-dir", default=None, help="where GGUF files (--llama-cpp) and the --geometry checkpoint "
                   "are written, made if missing (default: a temporary folder, removed at the end)")
    p.add_argument("--geometry", default=None, help="instead of the tables: a released-size model with random "
                   "weights streamed to disk in --format (" + ", ".join(bench_geometry.GEOMETRIES) + "): load time, "
                   "peak RSS, prefill at the first --prefill length, decode after the first --decode-ctx, decode vs a "
                   "copy kernel's bandwidth")
    p.add_argument("--cache-len", type=int, default=None, help="--geometry: also hold a cache of this many tokens, "
                   "written through, for the whole run (the peak RSS of a request that long, without prefilling it)")
    p.add_argument("--decode-threads", default=None, help="--geometry: comma list of thread counts to time the "
                   "decode (and the copy kernel) at, e.g. 1,2 (default: --threads)")
    p.add_argument("--format", default="nvfp4", choices=("nvfp4", "fp8"), help="checkpoint format for --geometry")
    p.add_argument("--keep", action="store_true", help="--geometry: keep the written checkpoint in --work-dir")
    p.add_argument("--layers", type=int, default=None, help="--geometry: only the first N layers of the released "
                   "pattern, at the released widths (a quick run; not the released model's figures)")
    p.add_argument("--media", nargs="?", const="all", default=None, metavar="ITEMS", help="--geometry: instead of the "
                   "LLM alone, requests end to end through vl.Engine.chat with the towers at their released widths, "
                   "each stage timed (vl/bench/media.py); a comma list of: nano-12b-v2-vl: page, page-pruned, video; "
                   "nano-omni-30b-a3b: video-speech, video-speech-16k (default: all of the geometry's)")
    p.add_argument("--vision-tower", default=None, choices=("bf16", "fp32"), help="instead of the tables: the "
                   "released-size RADIO tower + projector on one tile (vl/bench/vision.py), ours (the default fused "
                   "block path, packed weights, timm's modules) against transformers' RadioModel, --repeats rounds; "
                   "with --llama-cpp DIR also llama.cpp's encoder (libmtmd) on the same weights")
    p.add_argument("--llama-cpp-mmproj", default="f16", help="--vision-tower --llama-cpp: the mmproj GGUF types "
                   "timed, comma list of " + ", ".join(llama_cpp_mtmd.OUTTYPES) + " (its converter's default: f16)")
    p.add_argument("--json", default=None, help="also write the rows as JSON to this file ('-' = stdout)")
    a = p.parse_args(argv)
    if a.work_dir is not None:  # a folder the user named: made, as for any output path
        Path(a.work_dir).mkdir(parents=True, exist_ok=True)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.quick:
        a.prefill, a.decode_ctx, a.new_tokens, a.repeats = "256", "64", 4, 1
        a.decode = a.decode or "fused"
    modes = decode_modes(p, a.decode or ("modules,cuda-graphs" if a.device.startswith("cuda")
                                          else "fused,modules,compiled"))
    for flag, value in (("--layers", a.layers), ("--cache-len", a.cache_len), ("--decode-threads", a.decode_threads),
                        ("--media", a.media)):
        if value is not None and not a.geometry:
            p.error(f"{flag} applies to --geometry runs")
    try:
        decode_threads = tuple(int(n) for n in a.decode_threads.split(",")) if a.decode_threads else None
    except ValueError:
        p.error(f"--decode-threads: expected a comma list of thread counts, found {a.decode_threads!r}")
    if decode_threads is not None and min(decode_threads) < 1:
        p.error(f"--decode-threads: thread counts must be at least 1, found {a.decode_threads!r}")
    if a.vision_tower:
        types = tuple(t for t in a.llama_cpp_mmproj.split(",") if t)
        if any(t not in llama_cpp_mtmd.OUTTYPES for t in types) or not types:
            p.error(f"--llama-cpp-mmproj: expected a comma list of {', '.join(llama_cpp_mtmd.OUTTYPES)}, found "
                    f"{a.llama_cpp_mmproj!r}")
        try:
            mtmd = llama_cpp_mtmd.Mtmd(a.llama_cpp, a.llama_cpp_python) if a.llama_cpp else None
        except FileNotFoundError as e:
            p.error(f"--llama-cpp: {e}")
        r = vision_bench.run(torch.bfloat16 if a.vision_tower == "bf16" else torch.float32, threads=a.threads,
                             rounds=a.repeats, llama_cpp=mtmd, llama_cpp_types=types, work_dir=a.work_dir,
                             log=lambda m: print(m, file=sys.stderr, flush=True))
        print(vision_bench.format_result(r))
        if a.json:
            text = json.dumps(r, indent=2)
            print(text) if a.json == "-" else Path(a.json).write_text(text)
        return 0
    if a.geometry:
        if a.geometry not in bench_geometry.GEOMETRIES:
            p.error(f"--geometry: expected one of {', '.join(bench_geometry.GEOMETRIES)}, found {a.geometry!r}")
        if a.media is not None:
            return _media(p, a)
        first = {}
        for flag, value in (("--prefill", a.prefill), ("--decode-ctx", a.decode_ctx)):
            try:
                first[flag] = int(value.split(",")[0])
            except ValueError:
                p.error(f"{flag}: --geometry takes one length (the first of a comma list), found {value!r}")
        r = bench_geometry.run(a.geometry, a.format, work_dir=a.work_dir, prefill=first["--prefill"],
                               decode_ctx=first["--decode-ctx"], new_tokens=a.new_tokens,
                               repeats=a.repeats, keep=a.keep, layers=a.layers, cache_len=a.cache_len,
                               decode_threads=decode_threads, log=lambda m: print(m, file=sys.stderr, flush=True))
        print(f"torch {torch.__version__}; CPU: {cpu_isa()}")
        print(bench_geometry.format_result(r))
        if a.json:
            text = json.dumps(r, indent=2)
            print(text) if a.json == "-" else Path(a.json).write_text(text)
        return 0
    rows = []
    formats = tuple(f for f in a.formats.split(",") if f)
    quants = tuple(k for k in a.llama_cpp_quants.split(",") if k)
    if set(quants) - set(QUANT_KINDS):
        p.error(f"--llama-cpp-quants: expected some of {', '.join(QUANT_KINDS)}, found {a.llama_cpp_quants!r}")
    llama, llama_note = None, ""
    if a.llama_cpp:
        try:
            llama = LlamaCpp(a.llama_cpp, a.llama_cpp_python)
            llama_note = f"llama.cpp: {llama.bench} ({llama.version()})"
        except (FileNotFoundError, OSError, subprocess.SubprocessError) as e:
            llama_note = f"llama.cpp skipped: {e}"
        dropped = [k for k in quants if k in QUANTIZED]
        if llama is not None and llama.quantize is None and dropped:
            quants = tuple(k for k in quants if k not in QUANTIZED)
            llama_note += f"; {', '.join(dropped)} not measured: no llama-quantize next to llama-bench"
    else:
        llama_note = "llama.cpp not measured (point --llama-cpp DIR at a llama.cpp build to add it)"
    print(f"[vl bench] {llama_note}", file=sys.stderr, flush=True)
    work = tempfile.TemporaryDirectory(prefix="vl-bench-") if a.work_dir is None else None
    try:
        for name in ([] if a.quant_only else a.configs.split(",")):
            gguf = None
            if llama is not None:
                print(f"[vl bench] converting {name} to GGUF with {llama.convert}", file=sys.stderr, flush=True)
                _, hf32 = build_pair(CONFIGS[name](), torch.float32)
                dest = Path(work.name if work else a.work_dir) / name
                dest.mkdir(parents=True, exist_ok=True)
                kinds = tuple(k for k in ("fp32", "bf16") if k in a.dtypes.split(","))
                kinds += quants if "bf16" in kinds else ()  # the quantized rows join the bf16 pass only
                gguf = llama.export(hf32, CONFIGS[name]().pattern, dest, kinds)
                del hf32
            for dt in a.dtypes.split(","):
                print(f"[vl bench] measuring {name} {dt} (the table prints when every run is done)", file=sys.stderr,
                      flush=True)
                rows += bench_lm(name, dt, [int(x) for x in a.prefill.split(",") if x],
                                 [int(x) for x in a.decode_ctx.split(",")], a.new_tokens, a.repeats, a.device,
                                 modes,
                                 formats=formats, llama=llama, gguf=gguf)
            rows.append(dict(config=name, **cache_bytes(CONFIGS[name]())))
    finally:
        if work is not None:
            work.cleanup()
    where = torch.cuda.get_device_name() if a.device.startswith("cuda") else f"{torch.get_num_threads()} CPU threads"
    print(f"torch {torch.__version__}, {where}; medians of {a.repeats} interleaved runs; CPU: {cpu_isa()}")
    if not a.device.startswith("cuda"):
        print(f"fused decode (the default): {cpu_decode.status()}; ReLU^2 down_proj: {cpu_matmul.sparse_down_status()}")
        print(f"prefill SSD scan: {ssd_scan.status()}")
    if formats:
        print(f"FP8/NVFP4 decode: {gemv.status()}")
    print(llama_note)
    if rows:
        print(format_table(rows))
    if a.quant or a.quant_only:
        qrows = quant_bench.quant_table(threads=a.threads or 1, progress=False, calib_source=calib_source)
        compute = next((r["dtype"] for r in qrows if r.get("kind") == "speed" and "dtype" in r), "float32")
        print(f"\nFP8 / NVFP4 of one random Nano-V2-VL model (vl/bench/quant.py; every row computes in {compute}, the "
              f"bf16 row is the BF16 checkpoint run in {compute}):")
        print(quant_bench.format_table(qrows))
        rows += [dict(section="quant", **r) for r in qrows]
    if a.json:
        text = json.dumps(rows, indent=2)
        if a.json == "-":
            print(text)
        else:
            with open(a.json, "w") as f:
                f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
