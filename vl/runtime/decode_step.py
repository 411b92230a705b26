"""How one decode step runs (fused, modules, fixed-shape, compiled, CUDA graphs), and the sizes decode and prefill
use; shared by the generation loop (vl/runtime/generate.py) and the batch rows join and leave
(vl/runtime/decode_batch.py)."""

from __future__ import annotations

import warnings

import torch

from vl.errors import GenerationOptionError
from vl.runtime.cpu import decode as cpu_decode


DECODE_MODES = ("fused", "modules", "static", "compiled", "cuda-graphs")
DEPRECATED_MODES = {"eager": "fused"}  # the old name of "fused" (on the CPU it ran the fused step), for one release


def decode_mode(mode: str, stacklevel: int = 1) -> str:
    """A decode mode's current name: "eager" reads as "fused" with a DeprecationWarning (blaming the caller
    `stacklevel` frames above the one that asks); a name not in DECODE_MODES is a GenerationOptionError."""
    if mode in DEPRECATED_MODES:
        new = DEPRECATED_MODES[mode]
        warnings.warn(f"decode mode {mode!r} is now {new!r} (the fused C++ step where it applies, else the modules); "
                      f"{mode!r} goes in the next release", DeprecationWarning, stacklevel=stacklevel + 2)
        return new
    if mode not in DECODE_MODES:
        raise GenerationOptionError(f"decode mode {mode!r}: expected one of {DECODE_MODES}")
    return mode


def decode_step(lm, mode: str):
    """The one-token step for `mode`: "fused" (the fused C++ step of vl/runtime/cpu/decode.py on a CPU model it
    covers, else the modules), "modules" (the modules with Python positions: the fused step's reference twin),
    "static" (the modules with fixed shapes, a tensor position), "compiled" (static under torch.compile) or
    "cuda-graphs" (static, compiled with mode="reduce-overhead" so each step replays one CUDA graph). Compiled
    steps are kept on the model."""
    mode = decode_mode(mode)
    if mode in ("fused", "modules"):
        fused = cpu_decode.step_fn(lm) if mode == "fused" and _on_cpu(lm) else None
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


def default_prefill_chunk(device, config=None, rows: int = 1) -> int:
    """Positions per prefill call (of each of `rows` batch rows): bounded activations on the CPU; on a GPU, long
    chunks keep the flash kernels busy (a chunk after the first attends through an explicit mask). A lone prompt of
    a mixture of experts on the CPU (`config` with `E` layers) takes 4096: a call gives each routed expert about
    tokens x k / E rows (96 at 2048 for Omni's 128 experts, 6 per token), and each expert's packed weights are
    rebuilt once per call whatever its row count, so twice the rows per call cost Omni's MoE layer ~20% less per
    token (189 -> 151 us at 2 threads) for more temporaries (docs/quant_cpu_kernels.md, "A MoE's prompt"). Batched
    prompts already give the experts that many rows, and their temporaries grow with the rows: they keep 2048."""
    if torch.device(device).type == "cuda":
        return 16384
    return 4096 if rows == 1 and "E" in getattr(config, "pattern", "") else 2048


def default_mix_chunk(device) -> int:
    """Tokens of a joining prompt prefilled per decode step while other rows decode (vl/runtime/decode_batch.py)
    when its chunk is a call of its own, and the prompt length above which a joiner is chunked at all. On the CPU a
    64-token chunk of the 180m config costs about 2-3 8-row decode steps (a second pass over the weights), so as its
    own call it raises the running rows' gaps ~3.5x while a 4k-token prompt joins; where the chunk rides inside the
    fused step (`default_ride_chunk`) the gaps stay under 2x (docs/server.md, "Throughput"). A GPU's chunks are cheap
    next to its steps."""
    return 512 if torch.device(device).type == "cuda" else 64


def default_ride_chunk(rows: int, ride_rows: int) -> int:
    """Tokens of a joining prompt that ride along with a fused CPU decode step of `rows` running rows (one pass
    over the weights for both, vl/runtime/decode_batch.py): enough to fill the step to `ride_rows`, the rows the
    step takes at well under twice the cost of its decode rows (vl/runtime/cpu/decode.py `ride_rows`), and at least
    4 so that the joiner moves."""
    return max(4, ride_rows - rows)


def _bucket(n: int, step: int = 256) -> int:
    """Cache lengths rounded up, so compiled steps see a few shapes rather than one per request."""
    return -(-n // step) * step
