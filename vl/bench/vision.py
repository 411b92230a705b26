"""`vl bench --vision-tower`: the released-size RADIO tower + projector on the CPU, ours against transformers.

Random weights at the released widths (RADIO ViT-H/16: 1280 wide, 32 blocks, 16 heads, MLP 5120; CPE table 128 x 128;
K prefix rows; the Nano V2 VL projector: pixel shuffle 2x2, RMSNorm, 5120 -> 20480 -> 5120), one dtype and one thread
count per process. Timed in one rotation of interleaved rounds (each round starts one entry later):
- `ours`: `RadioEncoder.forward_features` as it runs by default (the fused CPU block path where it applies,
  `fused_cpu_off`, with the attention on AMX tiles where the CPU has them: `attention`) + projector;
- `ours_packed`: the same with `pack_weights = True` (the weights kept packed for oneDNN: a second copy);
- `ours_plain`: the same module with `fused_cpu = False` (timm's modules), + projector;
- `transformers`: transformers' `RadioModel` (sdpa attention) carrying the same weights, + the same projector;
- `gemm_<k>x<n>`: a bf16 / fp32 product of one of the tower's shapes (M = the tower's rows, weights packed for
  oneDNN as the fused path packs them): the best of these is the machine's matmul peak of this run.
- with `llama_cpp` (`vl bench --vision-tower DTYPE --llama-cpp DIR`): llama.cpp's encoder (libmtmd) on the same
  weights, written as a checkpoint and converted by its own converter to each mmproj GGUF type asked for, timed in a
  process of its own per type after the rotation (vl/bench/llama_cpp_mtmd.py), its embeddings of the check image
  compared with ours, transformers' and the fp32 tower's.
Reported per entry: median and best seconds per tile (wall clock; CPU seconds beside them), the ratio of
transformers' median to ours, the tower's achieved TFLOP/s (its products and attention, counted from the shapes)
and that as a fraction of the GEMM peak. Then one page (`page_tiles` tiles, default 13) encoded as one batch and in
micro-batches: seconds per tile and peak RSS growth (the activation memory the batch needs). Accuracy rows compare
with the fp32 tower on one tile (bf16 runs) and check that tiles batched together equal tiles encoded alone.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from vl.bench import llama_cpp_mtmd
from vl.bench.timing import PeakRSS, cpu_isa
from vl.config import RADIO_DEFAULT_NORM as NORM
from vl.modeling.projector import VisionProjector
from vl.kernels import attention
from vl.modeling.radio import RadioEncoder, cropped_pos_embed, fused_cpu_off, packed_weight, vit_dims

TOWER = "vit_huge_patch16_224"
PATCH, CPE_MAX, PREFIX, TILE = 16, 2048, 8, 512
PROJ_HIDDEN, LLM_DIM = 20480, 5120  # Nano V2 VL 12B: projector_hidden_size, LLM hidden size


def tower_flops(dims: tuple[int, int, int, int], tiles: int, tile: int = TILE, prefix: int = PREFIX,
                proj_hidden: int = PROJ_HIDDEN, llm_dim: int = LLM_DIM) -> float:
    """Floating-point operations (2 per multiply-add) of `tiles` tiles through the tower (+ projector): every
    product (patch embedding, qkv, proj, fc1, fc2) and attention's two products; norms and activations left out."""
    dim, depth, heads, mlp = dims
    n = (tile // PATCH) ** 2
    rows = n + prefix
    per_block = 2 * rows * dim * (3 * dim + dim + 2 * mlp) + 4 * rows * rows * dim
    flops = 2 * n * 3 * PATCH * PATCH * dim + depth * per_block
    flops += 2 * (n // 4) * (4 * dim * proj_hidden + proj_hidden * llm_dim)
    return float(tiles * flops)


def transformers_twin(enc: RadioEncoder, depth: int, heads: int, mlp_dim: int, attn: str = "sdpa"):
    """transformers' RadioModel carrying `enc`'s weights (the fused qkv split into q/k/v, shared, not copied)."""
    from transformers.models.radio.configuration_radio import RadioConfig
    from transformers.models.radio.modeling_radio import RadioModel

    dim, k = enc.embed_dim, enc.num_prefix_tokens
    cfg = RadioConfig(hidden_size=dim, num_hidden_layers=depth, num_attention_heads=heads, mlp_ratio=mlp_dim / dim,
                      patch_size=enc.patch_size, max_img_size=enc.patch_generator.max_grid * enc.patch_size,
                      num_cls_tokens=min(k, 2), num_registers=k - min(k, 2), summary_idxs=list(range(min(k, 2))))
    cfg._attn_implementation = attn
    with torch.device("meta"):
        ref = RadioModel(cfg)
    ref.make_preprocessor_external()
    sd = enc.state_dict()
    mapped = {"embeddings.patch_projection.weight": sd["patch_generator.embedder.weight"],
              "embeddings.position_embedding": sd["patch_generator.pos_embed"],
              "embeddings.cls_register_token": sd["patch_generator.cls_token.token"]}
    for i in range(depth):
        src, dst = f"blocks.{i}.", f"encoder.layer.{i}."
        for t in ("weight", "bias"):
            for part in ("norm1", "norm2", "mlp.fc1", "mlp.fc2"):
                mapped[f"{dst}{part}.{t}"] = sd[f"{src}{part}.{t}"]
            for name, tensor in zip(("q_proj", "k_proj", "v_proj"), sd[f"{src}attn.qkv.{t}"].chunk(3)):
                mapped[f"{dst}attention.{name}.{t}"] = tensor
            mapped[f"{dst}attention.o_proj.{t}"] = sd[f"{src}attn.proj.{t}"]
    dtype = sd["patch_generator.embedder.weight"].dtype
    for name, p in ref.named_parameters():  # LayerScale (1.0 in C-RADIO) is all RADIO has beyond ours
        if name not in mapped:
            if "layer_scale" not in name:
                raise RuntimeError(f"weight map incomplete: {name}")
            mapped[name] = torch.ones(p.shape, dtype=dtype)
    mapped["summary_idxs"] = torch.tensor(cfg.summary_idxs, dtype=torch.long)
    missing, unexpected = ref.load_state_dict(mapped, strict=True, assign=True)
    if missing or unexpected:
        raise RuntimeError(f"weight map incomplete: missing={missing} unexpected={unexpected}")
    return ref.eval()


def _randomize(module: torch.nn.Module, seed: int) -> None:
    """N(0, 0.02) matrices, norms near 1, small biases: a healthy random tower (no init in fp32 of 0.7B weights).
    The position table is smooth, as a trained one is: an 8 x 8 random grid resized bicubically to the table's, so
    that resampling it (the model's align_corners=False, llama.cpp's converter's True) changes it by a fraction of
    its scale, not by the whole of it as an i.i.d. random table would."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("pos_embed"):
                side = int(round(p.shape[1] ** 0.5))
                coarse = torch.randn(1, p.shape[2], 8, 8, generator=g) * 0.02
                fine = F.interpolate(coarse, size=(side, side), mode="bicubic", align_corners=False)
                p.copy_(fine.flatten(2).transpose(1, 2))
            elif name.endswith("weight") and p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (0.02 if p.dim() > 1 else 0.01))


def check_image(tile: int, seed: int) -> tuple[np.ndarray, torch.Tensor]:
    """A random RGB image of `tile` x `tile` bytes and the (1, 3, tile, tile) float32 tile the model sees: bytes / 255,
    normalised with RADIO's default mean and std (what llama.cpp's preprocessing makes of the same bytes)."""
    rgb = np.random.default_rng(seed).integers(0, 256, (tile, tile, 3), dtype=np.uint8)
    mean = torch.tensor(NORM["norm_mean"]).view(1, 3, 1, 1)
    std = torch.tensor(NORM["norm_std"]).view(1, 3, 1, 1)
    return rgb, (torch.from_numpy(rgb).permute(2, 0, 1)[None].float() / 255 - mean) / std


def build(dtype: torch.dtype, tower: str = TOWER, tile: int = TILE, proj_hidden: int = PROJ_HIDDEN,
          llm_dim: int = LLM_DIM, seed: int = 0, want_fp32_check: bool = False, want_fp32_embeddings: bool = False):
    """(ours, projector, transformers' twin, fp32 outputs of ours on the check tile or None, check image). The fp32
    outputs (made for a `dtype` other than float32 when asked) are the tower's features and, with
    `want_fp32_embeddings`, the projector's embeddings (else None); the check image is `check_image`'s pair
    (bytes, normalised tile)."""
    dims = vit_dims(tower)
    with torch.device("meta"):
        ours = RadioEncoder(*dims, patch_size=PATCH, cpe_max_size=CPE_MAX, num_prefix_tokens=PREFIX)
        proj = VisionProjector(dims[0], proj_hidden, llm_dim)
    ours, proj = ours.to_empty(device="cpu").eval(), proj.to_empty(device="cpu").eval()
    _randomize(ours, seed)
    _randomize(proj, seed + 1)
    check = check_image(tile, seed + 2)
    ref32 = None
    if want_fp32_check and dtype != torch.float32:
        with torch.inference_mode():
            feats = ours.forward_features(check[1])
            ref32 = feats, proj(feats, (tile // PATCH, tile // PATCH)) if want_fp32_embeddings else None
    ours, proj = ours.to(dtype), proj.to(dtype)
    return ours, proj, transformers_twin(ours, dims[1], dims[2], dims[3]), ref32, check


def _rotation(fns: dict, rounds: int) -> dict[str, list[tuple[float, float]]]:
    """(wall s, CPU s) per call of each fn over `rounds` rotations, after one warm-up call each."""
    for f in fns.values():
        f()
    out = {k: [] for k in fns}
    items = list(fns.items())
    for r in range(rounds):
        for k, f in items[r % len(items):] + items[:r % len(items)]:
            wall, cpu = time.perf_counter(), time.process_time()
            f()
            out[k].append((time.perf_counter() - wall, time.process_time() - cpu))
    return out


def gemm_fns(dims, rows: int, dtype: torch.dtype) -> dict:
    """Packed oneDNN products of the tower's four shapes at `rows` rows, as the fused path runs them."""
    dim, _, _, mlp = dims
    fns = {}
    g = torch.Generator().manual_seed(7)
    for k, n in ((dim, 3 * dim), (dim, dim), (dim, mlp), (mlp, dim)):
        lin = torch.nn.Linear(k, n).to(dtype)
        x = torch.randn(rows, k, generator=g).to(dtype)
        w = packed_weight(lin)
        fns[f"gemm_{k}x{n}"] = (lambda x=x, w=w, b=lin.bias: torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [],
                                                                                                  ""), 2.0 * rows * k * n)
    return fns


def run(dtype: torch.dtype = torch.bfloat16, threads: int | None = None, rounds: int = 5, page_tiles: int = 13,
        micro_batch: int = 4, tower: str = TOWER, tile: int = TILE, proj_hidden: int = PROJ_HIDDEN,
        llm_dim: int = LLM_DIM, llama_cpp=None, llama_cpp_types=("f16",), work_dir=None, log=lambda m: None) -> dict:
    """The measurement described in the module docstring; returns one JSON-able dict. `tower`, `tile`, `proj_hidden`
    and `llm_dim` default to the released sizes (tests pass small ones). `llama_cpp`: a `vl.bench.llama_cpp_mtmd.Mtmd`
    (a llama.cpp tree with libmtmd) whose encoder is timed on the same weights in each of `llama_cpp_types` (its
    converter's mmproj GGUF types), its files written under `work_dir` (default: a temporary folder)."""
    if threads:
        torch.set_num_threads(threads)
    dims = vit_dims(tower)
    t0 = time.perf_counter()
    ours, proj, theirs, ref32, check = build(dtype, tower, tile, proj_hidden, llm_dim, want_fp32_check=True,
                                             want_fp32_embeddings=llama_cpp is not None)
    grid = (tile // PATCH, tile // PATCH)
    res = {"tower": tower, "dims": list(dims), "prefix_rows": PREFIX, "tile": tile, "dtype": str(dtype).split(".")[-1],
           "threads": torch.get_num_threads(), "torch": torch.__version__, "cpu": cpu_isa(),
           "build_s": round(time.perf_counter() - t0, 1)}
    with torch.inference_mode():
        res["fused_path"] = fused_cpu_off(ours, check[1].to(dtype)) or "on"
    res["attention"] = attention.status()
    log(f"built in {res['build_s']} s; fused path: {res['fused_path']}; attention: {res['attention']}")

    def variant(name):  # -> (B, N, D) tower of `ours` as the entry `name` runs it (its flags as they were after)
        flags = {"ours": (ours.fused_cpu, ours.pack_weights), "ours_packed": (True, True),
                 "ours_plain": (False, False)}[name]

        def tower(x):
            before = ours.fused_cpu, ours.pack_weights
            ours.fused_cpu, ours.pack_weights = flags
            try:
                return ours.forward_features(x)
            finally:
                ours.fused_cpu, ours.pack_weights = before
        return tower

    def ours_fn(x):
        return proj(ours.forward_features(x), grid)

    def theirs_fn(x):
        return proj(theirs(x.to(dtype)).features, grid)

    with torch.inference_mode():
        x = check[1]
        outs = {name: variant(name)(x) for name in ("ours", "ours_packed", "ours_plain")}
        outs["transformers"] = theirs(x.to(dtype)).features
        scale = outs["transformers"].float().abs().max().item()
        res["max_abs_diff"] = {f"{a}_vs_{b}": (outs[a].float() - outs[b].float()).abs().max().item()
                               for a, b in (("ours", "ours_packed"), ("ours", "ours_plain"), ("ours", "transformers"),
                                            ("ours_plain", "transformers"))}
        res["output_scale"] = scale
        if ref32 is not None:
            res["max_abs_diff_vs_fp32"] = {k: (v.float() - ref32[0]).abs().max().item() for k, v in outs.items()}
            res["mean_abs_diff_vs_fp32"] = {k: (v.float() - ref32[0]).abs().mean().item() for k, v in outs.items()}
        if llama_cpp is not None:  # the embeddings llama.cpp is compared with: ours, transformers', fp32
            embeddings = {k: proj(outs[k], grid)[0].float() for k in ("ours", "transformers")}
            embeddings["fp32"] = ref32[1][0] if ref32 is not None else embeddings["ours"]
        del outs
        pair = torch.randn(2, 3, tile, tile, generator=torch.Generator().manual_seed(3))
        together = ours.forward_features(pair)
        alone = torch.cat([ours.forward_features(pair[i:i + 1]) for i in range(2)])
        res["batched_equals_alone_max_abs_diff"] = (together.float() - alone.float()).abs().max().item()
        del together, alone
        log(f"accuracy: {res['max_abs_diff']}")

        rows = (tile // PATCH) ** 2 + PREFIX
        gemms = gemm_fns(dims, rows, dtype)
        fns = {name: (lambda f=variant(name): proj(f(x), grid)) for name in ("ours", "ours_packed", "ours_plain")}
        fns["transformers"] = lambda: theirs_fn(x)
        fns.update({k: f for k, (f, _) in gemms.items()})
        times = _rotation(fns, rounds)
        flops = tower_flops(dims, 1, tile, PREFIX, proj_hidden, llm_dim)
        peak = max(fl / min(w for w, _ in times[k]) for k, (_, fl) in gemms.items())
        res["gemm_peak_tflops"] = round(peak / 1e12, 3)
        res["gemm_tflops"] = {k: round(fl / min(w for w, _ in times[k]) / 1e12, 3) for k, (_, fl) in gemms.items()}
        res["tower_tflop_per_tile"] = round(flops / 1e12, 4)
        theirs_med = statistics.median(w for w, _ in times["transformers"])
        res["rows"] = {}
        for k in ("ours", "ours_packed", "ours_plain", "transformers"):
            wall = [w for w, _ in times[k]]
            med, best = statistics.median(wall), min(wall)
            res["rows"][k] = {"median_s": round(med, 3), "best_s": round(best, 3),
                              "cpu_median_s": round(statistics.median(c for _, c in times[k]), 3),
                              "ratio_vs_transformers": round(theirs_med / med, 3),
                              "tflops_median": round(flops / med / 1e12, 3),
                              "pct_of_gemm_peak": round(100 * flops / med / peak, 1),
                              "rounds_s": [round(w, 3) for w in wall]}
        log(f"rows: { {k: v['median_s'] for k, v in res['rows'].items()} }; gemm peak {res['gemm_peak_tflops']} TF/s")
        del gemms
        if llama_cpp is not None:
            res["llama_cpp"] = llama_cpp_rows(llama_cpp, ours, proj, check[0], embeddings, tower=tower,
                                              types=llama_cpp_types, threads=torch.get_num_threads(), rounds=rounds,
                                              rows=res["rows"], flops=flops, work_dir=work_dir, log=log)

        if page_tiles < 1:
            return res
        page = torch.randn(page_tiles, 3, tile, tile, generator=torch.Generator().manual_seed(4))
        res["page"] = {}
        for mb in (micro_batch, page_tiles):
            with PeakRSS() as mem:
                start = time.perf_counter()
                for s in range(0, page_tiles, mb):
                    ours_fn(page[s:s + mb])
                elapsed = time.perf_counter() - start
            res["page"][f"micro_batch_{mb}"] = {"s_per_tile": round(elapsed / page_tiles, 3),
                                                "peak_rss_growth_MiB": round(mem.peak / 2**20)}
            log(f"page of {page_tiles}, micro-batch {mb}: {res['page'][f'micro_batch_{mb}']}")
    return res


def llama_cpp_rows(mtmd, ours, proj, rgb: np.ndarray, embeddings: dict, *, tower: str, types, threads: int,
                   rounds: int, rows: dict, flops: float, work_dir=None, log=lambda m: None) -> dict:
    """llama.cpp's encoder on `ours` and `proj` (written as a checkpoint, converted to each GGUF type in `types`):
    per type, `rounds` timed calls in one process after a warm-up (one process per type: its own load), ratios of
    our and transformers' medians to its median, and its embeddings of `rgb` against ours, transformers' and the
    fp32 tower's (`embeddings`, (tokens, width) each). Also how far llama.cpp's 32 x 32 position table (resampled
    once by its converter with align_corners=True) is from the one the model resamples (align_corners=False)."""
    pos = ours.patch_generator.pos_embed.float()
    side = rgb.shape[0] // PATCH
    table = cropped_pos_embed(pos, (side, side), align_corners=True)
    ref = cropped_pos_embed(pos, (side, side))
    out = {"pos_table_max_abs_diff": (table - ref).abs().max().item(),
           "pos_table_mean_abs_diff": (table - ref).abs().mean().item(),
           "pos_table_scale": ref.abs().max().item(), "embedding_scale": embeddings["fp32"].abs().max().item(),
           "types": {}}
    width = embeddings["fp32"].shape[-1]
    with tempfile.TemporaryDirectory(dir=work_dir) as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        hf = llama_cpp_mtmd.write_checkpoint(ours, proj, work / "hf", timm_name=tower, tile=rgb.shape[0], **NORM)
        tool = mtmd.build_tool(work)
        log(f"llama.cpp: checkpoint written and mtmd_encode built in {time.perf_counter() - t0:.0f} s")
        for kind in types:
            gguf = mtmd.convert(hf, kind, work / f"mmproj-{kind}.gguf")
            secs, emb = mtmd.encode(tool, gguf, rgb, threads=threads, repeats=rounds, width=width, work=work)
            emb = torch.from_numpy(emb)
            med = statistics.median(secs)
            row = {"median_s": round(med, 3), "best_s": round(min(secs), 3), "rounds_s": [round(x, 3) for x in secs],
                   "gguf_MiB": round(gguf.stat().st_size / 2**20), "tflops_median": round(flops / med / 1e12, 3),
                   "ours_vs_it": round(med / rows["ours"]["median_s"], 3),
                   "transformers_vs_it": round(med / rows["transformers"]["median_s"], 3), "tokens": emb.shape[0]}
            if emb.shape == embeddings["fp32"].shape:
                row["max_abs_diff"] = {k: (emb - v).abs().max().item() for k, v in embeddings.items()}
                row["mean_abs_diff"] = {k: (emb - v).abs().mean().item() for k, v in embeddings.items()}
            out["types"][kind] = row
            log(f"llama.cpp {kind}: {row}")
            gguf.unlink()
    for k in ("ours", "transformers"):
        out[f"{k}_vs_fp32_mean_abs_diff"] = (embeddings[k] - embeddings["fp32"]).abs().mean().item()
        out[f"{k}_vs_fp32_max_abs_diff"] = (embeddings[k] - embeddings["fp32"]).abs().max().item()
    return out


def format_result(r: dict) -> str:
    lines = [f"RADIO {r['tower']} {r['tile']} px + projector, {r['dtype']}, {r['threads']} threads; fused path: "
             f"{r['fused_path']}; attention: {r['attention']}; {r['tower_tflop_per_tile']} TFLOP per tile; GEMM peak {r['gemm_peak_tflops']} "
             f"TFLOP/s ({r['cpu']})",
             "| entry | median s/tile | best | CPU s | vs transformers | TFLOP/s | % of GEMM peak |",
             "|---|---|---|---|---|---|---|"]
    for k, v in r["rows"].items():
        lines.append(f"| {k} | {v['median_s']} | {v['best_s']} | {v['cpu_median_s']} | {v['ratio_vs_transformers']}x "
                     f"| {v['tflops_median']} | {v['pct_of_gemm_peak']}% |")
    for k, v in r.get("page", {}).items():
        lines.append(f"page {k}: {v['s_per_tile']} s/tile, peak RSS +{v['peak_rss_growth_MiB']} MiB")
    lines.append(f"max |diff|: {r['max_abs_diff']} (output scale {r['output_scale']:.3g}); batched vs alone: "
                 f"{r['batched_equals_alone_max_abs_diff']}")
    if "max_abs_diff_vs_fp32" in r:
        lines.append(f"vs the fp32 tower: max {r['max_abs_diff_vs_fp32']}, mean {r['mean_abs_diff_vs_fp32']}")
    if "llama_cpp" in r:
        lc = r["llama_cpp"]
        lines += ["llama.cpp's encoder (libmtmd) on the same weights, one process per GGUF type, after a warm-up call:",
                  "| GGUF | median s/tile | best | TFLOP/s | ours is | transformers is | embeddings: mean abs diff vs "
                  "fp32 / ours / transformers |", "|---|---|---|---|---|---|---|"]
        for kind, v in lc["types"].items():
            diff = v.get("mean_abs_diff")
            diffs = " / ".join(f"{diff[k]:.4g}" for k in ("fp32", "ours", "transformers")) if diff else \
                f"not compared ({v['tokens']} tokens)"
            lines.append(f"| {kind} ({v['gguf_MiB']} MiB) | {v['median_s']} | {v['best_s']} | {v['tflops_median']} | "
                         f"{v['ours_vs_it']}x faster | {v['transformers_vs_it']}x faster | {diffs} |")
        lines.append(f"embedding scale {lc['embedding_scale']:.3g}; ours vs fp32: mean abs diff "
                     f"{lc['ours_vs_fp32_mean_abs_diff']:.4g}, transformers "
                     f"{lc['transformers_vs_fp32_mean_abs_diff']:.4g}; "
                     f"llama.cpp's 32 x 32 position table (align_corners=True) vs the model's: max abs diff "
                     f"{lc['pos_table_max_abs_diff']:.3g}, mean {lc['pos_table_mean_abs_diff']:.3g} (table scale "
                     f"{lc['pos_table_scale']:.3g})")
    return "\n".join(lines)
