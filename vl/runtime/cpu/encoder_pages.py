"""Encoder weights that are in memory only while they are used, on machines the LLM nearly fills.

A vision or audio request runs each encoder once (RADIO and its projector; Omni's Parakeet and its projector), then
the LLM prefills and decodes for seconds to minutes without them. Nemotron 3 Nano Omni's NVFP4 LLM holds 16.9 GiB of
a 23 GiB machine, and its two towers add 2.7 GiB of BF16 weights that no decode step reads. In `release` mode the
loader leaves the encoders' weights as views of a private map of the checkpoint file (vl/checkpoint/files.py
`_map_tensor`), and `install` hooks every encoder module that holds such weights (a RADIO block whole, with its
layers' weights: the tower's fused CPU path runs a block without calling its layers, vl/modeling/radio.py
`runs_whole`):
- before its forward, `madvise(MADV_POPULATE_READ)` maps its weights' pages in, one call per tensor (from the page
  cache when the file's pages are there, else from disk), instead of a page fault per few KiB inside the matmul;
- after its forward, `madvise(MADV_DONTNEED)` drops them from the process again. The file's pages stay in the page
  cache, which the kernel may reclaim under pressure (the next use then reads them from disk).
So an encoder holds one module's weights at a time (at most a projector's 5120 x 20480 BF16 matrix, 0.2 GiB; a RADIO
block's 0.04 GiB) beside the LLM, and none during prefill and decode. A tower run in micro-batches maps each block's weights once per
micro-batch. When a request's encoders are done (`in_memory` around them) every mapped page of theirs is dropped
once more (weights read without their module's forward: a fault maps them, nothing else drops them) and
`malloc_trim` gives back the encoders' freed activations, which the prefill's heap setting would otherwise keep
(vl/runtime/cpu/heap.py). The values never change: the same bytes come back from the file (a write into a mapped
weight would be undone at the next drop; in this mode they are read-only). The cost is mapping the pages again on
each use (the Omni vision stage took 60-66 s per request with the towers resident or not, docs/benchmarks.md). In
the same mode the LLM's prefill gives its freed temporaries back after each layer of a chunk
(`_trim_after_prefill_layer`), and the heap is trimmed when a batch of requests ends (`after_requests`).

Only memory in a map of a file is ever dropped (`MADV_DONTNEED` on torch's own memory would zero it): tensors are
checked against /proc/self/maps at install, and each hook checks that its module still holds the same storage.

`VL_ENCODER_PAGES` chooses: `keep` (the weights are read into process memory and stay, as every other weight),
`release`, or `auto` (the default): `release` on Linux when the checkpoint's files hold more than RELEASE_FRACTION
of the machine's RAM, else `keep`. Only tensors stored in the dtype they run in (no cast) and of at least 64 KiB
(vl/checkpoint/load.py `MAPPED_MIN_BYTES`) are mapped; a CPU model without a device map only.
"""

from __future__ import annotations

import bisect
import os
import platform

import torch
from torch import nn

from vl.kernels import switches
from vl.modeling.radio import runs_whole
from vl.runtime.cpu.decode import skipped_by_decode_step
from vl.runtime.cpu.heap import madvise_libc, trim_heap

RELEASE_FRACTION = 0.6
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
MADV_WILLNEED, MADV_DONTNEED, MADV_POPULATE_READ = 3, 4, 22


def memory_total() -> int | None:
    """The machine's RAM in bytes (Linux `/proc/meminfo` MemTotal), None where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def choose(weight_bytes: int, total: int | None = None) -> str:
    """`release` or `keep` for a checkpoint of `weight_bytes` on a machine of `total` bytes of RAM (default: this
    one's), by `VL_ENCODER_PAGES` (module docstring)."""
    wanted = switches.get("VL_ENCODER_PAGES")
    if wanted != "auto":
        return wanted
    if platform.system() != "Linux":
        return "keep"
    total = memory_total() if total is None else total
    return "release" if total and weight_bytes > RELEASE_FRACTION * total else "keep"


def file_maps() -> list[tuple[int, int]]:
    """This process's memory maps of files (Linux /proc/self/maps), adjacent ones merged: [(start, end)]."""
    spans: list[tuple[int, int]] = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split(None, 5)
                if len(fields) == 6 and fields[5].startswith("/") and fields[4] != "0":
                    a, b = (int(v, 16) for v in fields[0].split("-"))
                    if spans and spans[-1][1] == a:
                        spans[-1] = (spans[-1][0], b)
                    else:
                        spans.append((a, b))
    except OSError:
        return []
    return spans


def _inside(spans, start: int, end: int) -> bool:
    i = bisect.bisect_right(spans, (start, float("inf"))) - 1
    return i >= 0 and spans[i][0] <= start and end <= spans[i][1]


def file_backed(t: torch.Tensor, spans=None) -> bool:
    """Whether a CPU tensor's storage lies in a map of a file (the loader's `whole` and `mapped` tensors). Only
    such memory is ever dropped: `MADV_DONTNEED` on torch's own memory would zero it."""
    if t.device.type != "cpu" or t.numel() == 0:
        return False
    st = t.untyped_storage()
    return _inside(file_maps() if spans is None else spans, st.data_ptr(), st.data_ptr() + st.nbytes())


def _ranges(module: nn.Module, spans=None):
    spans, seen = file_maps() if spans is None else spans, set()
    for t in [*module.parameters(), *module.buffers()]:
        if t is None or not file_backed(t, spans):
            continue
        st = t.untyped_storage()
        if st.data_ptr() in seen:
            continue
        seen.add(st.data_ptr())
        start = st.data_ptr() // PAGE * PAGE
        yield start, st.data_ptr() + st.nbytes() - start


def _advise(module: nn.Module, advice: int, spans=None) -> None:
    libc = madvise_libc()
    if libc is None:
        return
    for start, n in _ranges(module, spans):
        libc.madvise(start, n, advice)


def _own(module: nn.Module, spans, whole: bool = False) -> list[tuple[str, int, int]]:
    """(name, data_ptr, nbytes) of the file-backed tensors `module` holds itself (not its children's), or with
    `whole` those of its whole subtree (names as paths below it)."""
    out = []
    tensors = ([*module.named_parameters(), *module.named_buffers()] if whole
               else [*module._parameters.items(), *module._buffers.items()])
    for name, t in tensors:
        if t is not None and file_backed(t, spans):
            st = t.untyped_storage()
            out.append((name, st.data_ptr(), st.nbytes()))
    return out


def _tensor(module: nn.Module, path: str) -> torch.Tensor | None:
    """The parameter or buffer at `path` below `module` (None where there is none now)."""
    owner_path, _, name = path.rpartition(".")
    try:
        owner = module.get_submodule(owner_path) if owner_path else module
    except AttributeError:
        return None
    t = owner._parameters.get(name)
    return owner._buffers.get(name) if t is None else t


def _hooks(own: list[tuple[str, int, int]]):
    libc = madvise_libc()

    def advise(module, advice):
        for name, ptr, n in own:
            t = _tensor(module, name)
            if t is None or t.untyped_storage().data_ptr() != ptr or t.untyped_storage().nbytes() != n:
                continue  # replaced since install (moved, cast): not the file map any more, never dropped
            start = ptr // PAGE * PAGE
            if libc.madvise(start, ptr + n - start, advice) != 0 and advice == MADV_POPULATE_READ:
                libc.madvise(start, ptr + n - start, MADV_WILLNEED)  # Linux < 5.14: read-ahead instead

    def pre(module, args):
        advise(module, MADV_POPULATE_READ)

    def post(module, args, output):
        advise(module, MADV_DONTNEED)

    return pre, post


def install(model: nn.Module) -> int:
    """In `release` mode: hook each module of the encoder parts that holds file-mapped weights (module docstring),
    and drop what is mapped now; and trim the heap after each LLM layer of a prefill chunk. -> how many encoder
    modules were hooked (0 in `keep` mode, or on a C library without madvise)."""
    if getattr(model, "encoder_pages", "keep") != "release" or madvise_libc() is None:
        return 0
    spans, n = file_maps(), 0
    for name in VISION + AUDIO:
        part = getattr(model, name, None)
        if not isinstance(part, nn.Module):
            continue
        inside = set()  # the layers of a module hooked whole
        for module in part.modules():
            if id(module) in inside:
                continue
            whole = runs_whole(module)  # a RADIO block: its fused path calls none of its layers
            if whole:
                inside.update(id(m) for m in module.modules() if m is not module)
            own = _own(module, spans, whole)
            if own:
                pre, post = _hooks(own)
                module.register_forward_pre_hook(pre)
                module.register_forward_hook(post)
                n += 1
        _advise(part, MADV_DONTNEED, spans)
    lm = getattr(model, "language_model", None)
    for layer in getattr(getattr(lm, "backbone", None), "layers", ()):
        layer.register_forward_hook(_trim_after_prefill_layer)
    return n


TRIM_TOKENS = 64  # a prefill chunk, not a decode step (the modules' decode would pay a trim per layer per token)


@skipped_by_decode_step  # a one-token step trims nothing: the fused decode step still runs
def _trim_after_prefill_layer(module, args, output):
    """After an LLM layer of a prefill chunk: glibc keeps the layer's freed temporaries (a MoE layer's per-expert
    products of varying sizes leave holes), and over a 52-layer chunk of the Omni LLM they held 1.9 GiB more than the
    weights; trimmed after each layer 1.0 GiB. Each layer then faults its temporaries in again: 20-25% of the
    prefill in 4096-token calls. Trimming once per chunk instead keeps that time but peaks ~0.45 GiB higher, more
    than the Omni 16k request's margin to 21 GB (docs/benchmarks.md, Omni end to end)."""
    h = args[0] if args else None
    if isinstance(h, torch.Tensor) and h.dim() == 3 and h.shape[1] >= TRIM_TOKENS:
        trim_heap()


VISION = ("vision", "vision_final_layernorm", "projector")  # what an image, tile or tubelet goes through
AUDIO = ("audio_encoder", "audio_projector")


class in_memory:  # noqa: N801 (used as a context manager, like contextlib's)
    """The encoder made of `model`'s parts `names` (VISION, AUDIO), for one request: `with in_memory(model, VISION)
    as vision:` then `vision.wrap(encode)` for each encoder call. In `release` mode, once one of them has run, the
    parts' mapped pages are dropped and the heap trimmed when the block ends (module docstring), and the heap is
    trimmed before the first encoder call too (the media decoding's freed frames and temporaries, which the
    prefill's heap setting keeps, would otherwise sit under the encoder's activations); a request whose items all
    come from the encoder cache does nothing; in `keep` mode nothing is done."""

    def __init__(self, model: nn.Module, names: tuple[str, ...]):
        parts = [getattr(model, n, None) for n in names]
        self.parts = [p for p in parts if isinstance(p, nn.Module)]
        self.release = bool(self.parts) and getattr(model, "encoder_pages", "keep") == "release"
        self.ran = False

    def __enter__(self):
        return self

    def wrap(self, encode):
        def run():
            if self.release and not self.ran:  # what the request's media decoding freed, before the activations
                trim_heap()
            self.ran = self.ran or self.release
            return encode()
        return run

    def __exit__(self, *exc):
        if self.ran:
            spans = file_maps()  # read once for all parts: no map is made or removed in between
            for part in self.parts:
                _advise(part, MADV_DONTNEED, spans)
            trim_heap()
            self.ran = False
        return False


def after_requests(model: nn.Module) -> None:
    """In `release` mode, when a batch of requests ends: the heap's free pages back to the OS. The prefill keeps
    its freed temporaries for reuse (vl/runtime/cpu/heap.py); on a machine the LLM nearly fills they would sit
    beside the next request's media and encoders."""
    if getattr(model, "encoder_pages", "keep") == "release":
        trim_heap()
