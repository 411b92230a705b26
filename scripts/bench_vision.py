"""Vision-tower CPU benchmark: our RADIO encoder vs transformers' RadioModel on the same weights.

Measures, in one process with one thread setting:
  * tiles/s at 512x512 for a ViT-B/16-sized RADIO tower (768 wide, 12 deep, ~98M parameters with the
    128 x 128 CPE table), ours and transformers' (the ratio is the figure to quote, not the absolute);
  * peak RSS growth while encoding one 13-tile page (12 tiles + thumbnail) through `encode_tiles`
    with micro-batching, and optionally all 13 tiles at once, sampled by a psutil thread.

Usage: .venv/bin/python scripts/bench_vision.py [--threads 2] [--rounds 3] [--batch 1] [--micro-batch 4]
       [--full-page]   (the default run takes ~4 minutes on 2 CPU cores; --full-page adds ~2)
The micro-batched page runs first, so allocator memory it leaves behind can only lower the
all-at-once figure that follows (the comparison is conservative).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import psutil
import torch

from vl.modeling.radio import RadioEncoder, encode_tiles, vit_dims


def transformers_twin(enc: RadioEncoder, depth: int, heads: int, mlp_dim: int, cpe_max: int, k: int):
    """transformers RadioModel carrying `enc`'s weights (fused qkv split into q/k/v), default attention."""
    from transformers.models.radio.configuration_radio import RadioConfig
    from transformers.models.radio.modeling_radio import RadioModel

    dim = enc.embed_dim
    cfg = RadioConfig(hidden_size=dim, num_hidden_layers=depth, num_attention_heads=heads, mlp_ratio=mlp_dim / dim,
                      patch_size=enc.patch_size, max_img_size=cpe_max, num_cls_tokens=min(k, 2),
                      num_registers=k - min(k, 2), summary_idxs=list(range(min(k, 2))))
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
    missing, unexpected = ref.load_state_dict(mapped, strict=False)
    if unexpected or any("layer_scale" not in m and m != "summary_idxs" for m in missing):
        raise RuntimeError(f"weight map incomplete: missing={missing} unexpected={unexpected}")
    return ref.eval()


class PeakRSS:
    """Samples this process's RSS every `interval` s in a thread; `.peak_delta` = peak - RSS at entry."""

    def __init__(self, interval: float = 0.002):
        self.interval, self.proc = interval, psutil.Process()

    def __enter__(self):
        self.base = self.peak = self.proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(self.interval)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)
        self.peak_delta = self.peak - self.base


def timed(fn, pixels) -> tuple[float, float]:
    """(wall s, process CPU s): on a shared machine the CPU time is the steadier of the two."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn(pixels)
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="vit_base_patch16_224", help="timm ViT name for the tower's dims")
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--cpe-max-size", type=int, default=2048)
    ap.add_argument("--prefix-tokens", type=int, default=8)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--batch", type=int, default=1, help="tiles per timed forward")
    ap.add_argument("--rounds", type=int, default=3, help="timed forwards per model (interleaved, median)")
    ap.add_argument("--page-tiles", type=int, default=13)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--full-page", action="store_true", help="also encode all page tiles at once (memory baseline)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dim, depth, heads, mlp_dim = vit_dims(args.model)
    ours = RadioEncoder(dim, depth, heads, mlp_dim, 16, args.cpe_max_size, args.prefix_tokens).eval()
    theirs = transformers_twin(ours, depth, heads, mlp_dim, args.cpe_max_size, args.prefix_tokens)
    n_params = sum(p.numel() for p in ours.parameters())
    res = {"model": args.model, "dims": [dim, depth, heads, mlp_dim], "params_M": round(n_params / 1e6, 1),
           "tile": args.size, "threads": args.threads, "torch": torch.__version__,
           "reference_attn": theirs.config._attn_implementation}

    def run_ours(x):
        return ours.forward_features(x)

    def run_theirs(x):
        return theirs(x).features

    with torch.inference_mode():
        check = torch.randn(1, 3, args.size, args.size)
        diff = (run_ours(check) - run_theirs(check)).abs().max().item()  # doubles as the warm-up
        res["max_abs_diff_vs_reference"] = diff
        pixels = torch.randn(args.batch, 3, args.size, args.size)
        t_ours, t_theirs = [], []
        for _ in range(args.rounds):
            t_ours.append(timed(run_ours, pixels))
            t_theirs.append(timed(run_theirs, pixels))
        for i, clock in enumerate(("wall", "cpu")):
            ours_s = statistics.median(t[i] for t in t_ours)
            theirs_s = statistics.median(t[i] for t in t_theirs)
            res[f"tiles_per_{clock}_s_ours"] = round(args.batch / ours_s, 4)
            res[f"tiles_per_{clock}_s_reference"] = round(args.batch / theirs_s, 4)
            res[f"speed_ratio_{clock}_ours_over_reference"] = round(theirs_s / ours_s, 3)
            res[f"rounds_{clock}_s"] = {"ours": [round(t[i], 2) for t in t_ours],
                                        "reference": [round(t[i], 2) for t in t_theirs]}
        print(json.dumps(res), flush=True)

        page = torch.randn(args.page_tiles, 3, args.size, args.size)
        runs = [args.micro_batch] + ([args.page_tiles] if args.full_page else [])
        for mb in runs:
            with PeakRSS() as mem:
                start = time.perf_counter()
                encode_tiles(ours, page, micro_batch=mb)
                elapsed = time.perf_counter() - start
            res[f"page{args.page_tiles}_mb{mb}_peak_rss_delta_MiB"] = round(mem.peak_delta / 2**20, 1)
            res[f"page{args.page_tiles}_mb{mb}_seconds"] = round(elapsed, 1)
            print(json.dumps({k: v for k, v in res.items() if k.startswith("page")}), flush=True)
    print(json.dumps(res, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
