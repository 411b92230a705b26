"""Where a CPU prefill's memory goes, layer by layer: a checkpoint loaded with `vl.load_pretrained`, two prefill
chunks into a HybridCache as the engine runs them, and the process's RSS above the loaded model after every LLM
layer (a forward hook). `--trim` calls `malloc_trim(0)` after each layer first (what release mode does,
vl/runtime/cpu/encoder_pages.py), so the difference is what glibc's heap keeps. oneDNN's primitive cache is sized
by the environment (`ONEDNN_PRIMITIVE_CACHE_CAPACITY`, read once per process).

    python scripts/research/prefill_layer_rss.py DIR [--tokens 4096] [--chunk 2048] [--trim]

DIR: e.g. a checkpoint `vl bench --geometry nano-omni-30b-a3b --format nvfp4 --keep --work-dir W` left.
Journal: docs/journal/2026-12-06-omni-encoder-pages-intel-xeon-amx.md, section 4.
"""

import argparse
import time

import psutil
import torch

import vl
from vl.runtime.cache import HybridCache
from vl.runtime.cpu.heap import trim_heap


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--chunk", type=int, default=2048)
    p.add_argument("--trim", action="store_true")
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    lm = vl.load_pretrained(a.model, dtype=torch.bfloat16)
    proc, rows = psutil.Process(), []

    def hook(i):
        def after(module, args, output):
            if a.trim:
                trim_heap()
            rows.append((i, lm.config.pattern[i], proc.memory_info().rss / 2**30))
        return after

    for i, layer in enumerate(lm.backbone.layers):
        layer.register_forward_hook(hook(i))
    ids = torch.randint(3, lm.config.vocab_size, (1, a.tokens))
    with torch.no_grad():
        cache = HybridCache(lm.config, 1, a.tokens + 1, dtype=torch.bfloat16)
        trim_heap()
        base = proc.memory_info().rss / 2**30
        t0 = time.perf_counter()
        for s in range(0, a.tokens, a.chunk):
            rows.append(("chunk", s, None))
            lm(ids[:, s:s + a.chunk], cache=cache, logits_to_keep=1, cache_only=s + a.chunk < a.tokens)
        seconds = time.perf_counter() - t0
    print(f"base {base:.2f} GiB; {a.tokens} tokens in {seconds:.1f} s; trim after each layer: {a.trim}")
    line = []
    for i, kind, rss in rows:
        if i == "chunk":
            if line:
                print(" ".join(line))
            line = [f"chunk at {kind}:"]
        else:
            line.append(f"{i}{kind}:{rss - base:+.2f}")
    print(" ".join(line))


if __name__ == "__main__":
    main()
