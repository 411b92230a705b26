"""How one decode step runs (eager, fixed-shape, compiled, CUDA graphs), and the sizes decode and prefill use; shared
by the generation loop (vl/runtime/generate.py) and the batch rows join and leave (vl/runtime/decode_batch.py)."""

from __future__ import annotations

import torch

from vl.errors import GenerationOptionError
from vl.runtime.cpu import decode as cpu_decode


DECODE_MODES = ("eager", "static", "compiled", "cuda-graphs")


def decode_step(lm, mode: str):
    """The one-token step for `mode`: "eager" (Python positions; the modules, or on the CPU the fused step of
    `cpu_decode` that they are the reference twin of), "static" (fixed shapes,
    a tensor position), "compiled" (static under torch.compile) or "cuda-graphs" (static, compiled with
    mode="reduce-overhead" so each step replays one CUDA graph). Compiled steps are kept on the model."""
    if mode not in DECODE_MODES:
        raise GenerationOptionError(f"decode mode {mode!r}: expected one of {DECODE_MODES}")
    if mode == "eager":  # on the CPU, the fused step of vl/runtime/cpu/decode.py where it applies
        fused = cpu_decode.step_fn(lm) if _on_cpu(lm) else None
        return fused or (lambda tok, cache, pos: lm(input_ids=tok, cache=cache).logits[:, -1])

    def step(tok, cache, pos):
        return lm(input_ids=tok, cache=cache, input_pos=pos).logits[:, -1]

    if mode == "static":
        return step
    cached = getattr(lm, "_vl_compiled_steps", None)
    if cached is None:
        cached = lm._vl_compiled_steps = {}
    if mode not in cached:
        cached[mode] = torch.compile(step, mode="reduce-overhead" if mode == "cuda-graphs" else None)
    return cached[mode]


def _on_cpu(lm) -> bool:
    w = getattr(getattr(getattr(lm, "backbone", None), "embeddings", None), "weight", None)
    return w is not None and w.device.type == "cpu"


def default_prefill_chunk(device) -> int:
    """Tokens per prefill call: bounded activations on the CPU; on a GPU, long chunks keep the flash kernels
    busy (a chunk after the first attends through an explicit mask)."""
    return 16384 if torch.device(device).type == "cuda" else 2048


def _bucket(n: int, step: int = 256) -> int:
    """Cache lengths rounded up, so compiled steps see a few shapes rather than one per request."""
    return -(-n // step) * step
