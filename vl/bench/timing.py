"""What `vl bench` and `vl bench --geometry` measure with: peak memory, the CPU's vector ISA, our prefill and our
per-token decode time (shared by vl/bench/run.py and vl/bench/geometry.py)."""

from __future__ import annotations

import threading
import time

import psutil
import torch

from vl.kernels.loader import cpu_flags
from vl.runtime.cache import HybridCache
from vl.runtime.generate import default_prefill_chunk, generate_steps
from vl.runtime.sampling import SamplingParams


class PeakRSS:
    """Peak resident memory above the starting point, sampled every 2 ms in a thread (CPU), or the CUDA
    allocator's peak above the starting allocation (GPU)."""

    def __init__(self, device="cpu"):
        self.device = torch.device(device)

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base, self.peak = torch.cuda.memory_allocated(), 0
            return self

        self.proc, self.stop, self.peak, self._since = psutil.Process(), False, 0, 0
        self.base = self.proc.memory_info().rss
        self.phases: dict[str, int] = {}  # name -> peak resident bytes (absolute) within that phase, see mark
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self):
        while not self.stop:
            rss = self.proc.memory_info().rss - self.base
            self.peak, self._since = max(self.peak, rss), max(self._since, rss)
            time.sleep(0.002)

    def mark(self, phase: str):
        """CPU: record the peak resident bytes since the previous mark (or the start) as `phase`."""
        rss = self.proc.memory_info().rss - self.base
        self.peak = max(self.peak, rss)
        self.phases[phase] = self.base + max(self._since, rss)
        self._since = rss

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated() - self.base
            return
        self.stop = True
        self.thread.join()


def memory_counters() -> dict[str, int]:
    """This process's resident anonymous and file-backed bytes (`RssAnon`, `RssFile`), major page faults and
    bytes read from storage so far (Linux /proc; {} elsewhere). Weights paged in from a file show as RssFile,
    and a decode that reads them back from disk as major faults and read bytes."""
    out = {}
    try:
        for line in open("/proc/self/status"):
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) * 1024
        out["majflt"] = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[9])
        for line in open("/proc/self/io"):
            if line.startswith("read_bytes:"):
                out["read_bytes"] = int(line.split(":")[1])
    except (OSError, ValueError, IndexError):
        return {}
    return out


def cpu_isa() -> str:
    """The vector ISA speed figures depend on: torch's CPU capability and the AVX512 / AMX flags of this CPU."""
    flags = {f for f in cpu_flags() if f.startswith(("avx512", "amx"))}
    return f"torch {torch.backends.cpu.get_cpu_capability()}; " + (" ".join(sorted(flags)) or "no AVX512/AMX")


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


@torch.no_grad()
def our_prefill(model, ids):
    w = model.backbone.embeddings.weight
    cache = HybridCache(model.config, 1, ids.shape[1] + 1, dtype=w.dtype, device=w.device)
    chunk = default_prefill_chunk(w.device, model.config, ids.shape[0])
    for s in range(0, ids.shape[1], chunk):  # as vl/runtime/decode_batch.py: logits for the last chunk only
        model(ids[:, s:s + chunk], cache=cache, logits_to_keep=1, cache_only=s + chunk < ids.shape[1])


@torch.no_grad()
def our_decode_s(model, ids, n, decode="fused") -> float:
    """Seconds per token over tokens 2..n+1 of a greedy run (timestamps as each token arrives)."""
    stamps = []
    for _ in generate_steps(model, input_ids=ids, max_new_tokens=n + 1, params=SamplingParams(), decode=decode):
        _sync()
        stamps.append(time.perf_counter())
    return (stamps[-1] - stamps[0]) / n
