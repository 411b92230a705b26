"""The fused CPU decode step: one C++ call per generated token for bf16 / fp32 Nemotron-H models, with dense weights
or weight-only FP8 / NVFP4 ones (read packed, as the checkpoint stores them).

A decode step through the modules runs ~20 small torch ops per layer (norms, the Mamba-2 conv window
and state update, gating, attention over the cache, residual adds), and on a small model their dispatch and
allocations cost as much as reading the weights (docs/cpu_decode.md has the profile). The C++ step
(vl/kernels/decode_step.py over `csrc/decode_step.cpp`) does the same operations in one pass over the layers, with
the plain-math modules as its reference twin: same roundings to the model dtype, float32 accumulation, only the
order of float32 additions differs. Tests compare the two (tests/runtime/cpu/test_cpu_decode.py). This file is the
runtime pass: which models the step covers, the plan of pointers it reads, the step function decode uses.

One API, the fast or the reference path at run time (nanochat `flash_attention.py`): `step_fn(lm)` returns the
fused step where it applies and None otherwise, saying why once in the log. `VL_CPU_DECODE` = auto (default) |
portable (the plain C++ loops, no AVX512 intrinsics) | off (the modules); tests force a mode with `override`.
The library is built by the compile cache of vl/kernels/loader.py (g++ -O3 at first use, ~4 s, then loaded from
`$VL_KERNEL_CACHE`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import math
import operator

import torch
from torch import nn

from vl.kernels import decode_step as fused
from vl.kernels import gemv, loader
from vl.modeling.nemotron_h import NemotronHForCausalLM
from vl.quant.linear import QuantizedLinear
from vl.runtime.cpu.matmul import transposed

log = logging.getLogger(__name__)

MAX_ROWS = 64  # rows (batch) one fused step takes; larger batches keep the modules
_override: str | None = None
_load = fused.load  # (mode) -> (library, why), cached per mode

def _mode() -> str:
    if _override is not None:
        return _override
    return loader.mode("VL_CPU_DECODE")


@contextlib.contextmanager
def override(mode: str | None):
    """Force "auto", "portable" or "off" inside the block (tests); None restores the environment's choice."""
    global _override
    if mode not in (None, "auto", "portable", "off"):
        raise ValueError(f"override expects 'auto', 'portable', 'off' or None, got {mode!r}")
    old, _override = _override, mode
    try:
        yield
    finally:
        _override = old


def library() -> fused.Library | None:
    return _load(_mode())[0]


def status() -> str:
    """One line for logs and `vl bench`: which path decode mode "fused" takes here."""
    lib, why = _load(_mode())
    return f"fused {lib.isa} step ({lib.path.name})" if lib is not None else f"modules ({why})"


def unsupported(lm) -> str | None:
    """Why the fused step cannot run this model (None: it can). The step covers what the modules do on the CPU for
    plain and weight-only FP8 / NVFP4 Linears, MoE layers included (one router group, no latent projections);
    anything else (offloaded layers, biases, other activations, activation emulation) keeps them."""
    if type(lm) is not NemotronHForCausalLM:
        return f"not a NemotronHForCausalLM ({type(lm).__name__})"
    cfg = lm.config
    if set(cfg.pattern) - set(fused.KINDS):
        return f"layer kinds {sorted(set(cfg.pattern) - set(fused.KINDS))} are not in the fused step"
    if cfg.mlp_hidden_act != "relu2":
        return f"MLP activation {cfg.mlp_hidden_act!r}"
    if cfg.mamba_ssm_cache_dtype != "float32":
        return f"SSM state in {cfg.mamba_ssm_cache_dtype}"
    if cfg.use_bias or cfg.attention_bias or cfg.mlp_bias:
        return "Linear biases"
    dtype = lm.backbone.embeddings.weight.dtype
    if dtype not in (torch.bfloat16, torch.float32):
        return f"model dtype {dtype}"
    for name, module in lm.named_modules():
        if hasattr(module, "_hf_hook"):
            return f"{name or 'the model'} is placed by accelerate hooks"
    if "E" in cfg.pattern and (cfg.n_group > 1 or cfg.moe_latent_size):
        return "MoE with router groups or latent projections"
    projections = {"M": ("in_proj", "out_proj"), "*": ("q_proj", "k_proj", "v_proj", "o_proj"),
                   "-": ("up_proj", "down_proj"), "E": ()}
    for i, block in enumerate(lm.backbone.layers):
        mods = [(attr, getattr(block.mixer, attr)) for attr in projections[block.kind]]
        if block.kind == "E":
            mods = _moe_matrices(block.mixer)
        for attr, mod in mods:
            why = mod if isinstance(mod, str) else _matrix_unsupported(mod)
            if why:
                return f"layer {i} {attr}: {why}"
    why = _matrix_unsupported(lm.lm_head)
    if why:
        return f"lm_head: {why}"
    for name, p in lm.named_parameters():
        if p.device.type != "cpu":
            return f"{name} is on {p.device}"
        if p.dim() >= 2 and p.dtype != dtype and not name.endswith("mixer.gate.weight"):  # routers: read as fp32
            return f"{name} is {p.dtype}, the model {dtype}"
    return None


def _moe_matrices(moe) -> list:
    """(name, module) of a MoE layer's matrices as the step reads them: the shared expert's two Linears and every
    routed expert's, fused rows (a dense (E, out, in) tensor: nn.Linear views of its rows) or one Linear each
    (vl/quant/experts.py); (name, why) where the step cannot read them."""
    out = [("shared_experts.up_proj", moe.shared_experts.up_proj),
           ("shared_experts.down_proj", moe.shared_experts.down_proj)]
    for proj in ("up_proj", "down_proj"):
        held = getattr(moe.experts, proj)
        if isinstance(held, nn.ModuleList):
            out += [(f"experts.{proj}.{e}", m) for e, m in enumerate(held)]
        elif not (isinstance(held, torch.Tensor) and held.dim() == 3 and held.is_contiguous()):
            out.append((f"experts.{proj}", f"routed experts held as {type(held).__name__}"))
    return out


def _matrix_unsupported(mod) -> str | None:
    """Why the step cannot read this projection's weights as its module would use them (None: it can). Plain
    Linears are read in place; weight-only FP8 / NVFP4 Linears through the packed row kernels (vl/kernels/gemv.py), as
    their own forward does on the CPU (so the kernel library must be on: `VL_QUANT_KERNEL` not off)."""
    if type(mod) is nn.Linear:
        return None
    if not isinstance(mod, QuantizedLinear):
        return f"a {type(mod).__name__}"
    if mod.mode not in ("weight-only", "auto") or mod.emulate_activations or mod.bias is not None:
        return f"a {mod.fmt.upper()} Linear in mode {mod.mode!r}{' emulating activations' * mod.emulate_activations}"
    if gemv.kernel() is None:
        return f"a {mod.fmt.upper()} Linear and the packed kernel is off ({gemv.status()})"
    if mod.packed_operands() is None:
        return f"a {mod.fmt.upper()} Linear whose packed weights take the reference path"
    return None


def _f32(t: torch.Tensor) -> torch.Tensor:
    return t.detach().float().contiguous()


_VERSION = operator.attrgetter("_version")


class Plan:
    """The model as the kernel reads it: pointers to the weight matrices (used in place) and float32 copies of the
    small vectors (norm weights, conv taps, dt bias, A = -exp(A_log), D), rebuilt when a parameter changes."""

    def __init__(self, lm):
        self.params = _tensors(lm)
        self.stamp = self._stamp()
        cfg = lm.config
        self.dtype = lm.backbone.embeddings.weight.dtype
        keep = []  # tensors whose memory the structs point at
        self.formats = set()  # VlMat.fmt of every matrix the step reads

        def ptr(t):
            t = t.detach()
            if not t.is_contiguous():
                t = t.contiguous()
            keep.append(t)
            return t.data_ptr()

        def mat(mod) -> fused.Mat:
            if type(mod) is nn.Linear:
                n, k = mod.weight.shape
                if transposed(mod.weight):  # laid out (K, N) by matmul.transpose_relu2_down_proj
                    self.formats.add(fused.DENSE_T)
                    return fused.Mat(fmt=fused.DENSE_T, N=n, K=k, w=ptr(mod.weight.t()))
                self.formats.add(0)
                return fused.Mat(fmt=0, N=n, K=k, w=ptr(mod.weight))
            ops = mod.packed_operands()
            self.formats.add(fused.FORMATS[ops["fmt"]])
            m = fused.Mat(fmt=fused.FORMATS[ops["fmt"]], N=mod.out_features, K=mod.in_features, w=ptr(ops["weight"]))
            if ops["fmt"] == "fp8":
                m.scale, m.scale_kind = ptr(ops["scale"]), gemv.SCALE_KIND[ops["kind"]]
            else:
                m.block_scale, m.global_scale = ptr(ops["block_scale"]), ops["global_scale"]
            return m

        def expert_mats(held):  # a MoE's routed experts of one projection: an array of E matrices
            if isinstance(held, nn.ModuleList):
                mats = [mat(m) for m in held]
            else:  # fused (E, out, in), contiguous: row e is expert e's dense matrix, read in place
                e, n, k = held.shape
                base, step = ptr(held), n * k * held.element_size()
                mats = [fused.Mat(fmt=0, N=n, K=k, w=base + i * step) for i in range(e)]
                self.formats.add(0)
            arr = (fused.Mat * len(mats))(*mats)
            keep.append(arr)
            return arr

        layers = (fused.Layer * len(lm.backbone.layers))()
        for L, block in zip(layers, lm.backbone.layers):
            mix = block.mixer
            L.kind = fused.KINDS[block.kind]
            L.norm_w = ptr(_f32(block.norm.weight))
            if block.kind == "M":
                L.w_in, L.w_out = mat(mix.in_proj), mat(mix.out_proj)
                L.d_inner, L.conv_dim, L.n_heads, L.head_dim = mix.d_inner, mix.conv_dim, mix.n_heads, mix.head_dim
                L.n_groups, L.d_state, L.conv_k = mix.n_groups, mix.d_state, mix.conv1d.weight.shape[-1]
                L.conv_w = ptr(_f32(mix.conv1d.weight[:, 0].t()))  # tap-major
                L.conv_b = ptr(_f32(mix.conv1d.bias)) if mix.conv1d.bias is not None else None
                L.dt_bias = ptr(_f32(mix.dt_bias))
                L.A = ptr((-torch.exp(mix.A_log.detach().float())).contiguous())  # as the module computes it
                L.Dskip = ptr(_f32(mix.D))
                L.gnorm_w = ptr(_f32(mix.norm.weight))
                lo, hi = mix.dt_limit
                L.dt_clamp = int((lo, hi) != (0.0, math.inf))
                L.dt_lo, L.dt_hi = lo, (hi if math.isfinite(hi) else 3.0e38)
            elif block.kind == "*":
                L.w_in, L.w_k, L.w_v, L.w_out = mat(mix.q_proj), mat(mix.k_proj), mat(mix.v_proj), mat(mix.o_proj)
                L.n_q_heads, L.n_kv_heads, L.attn_head_dim = mix.n_heads, mix.n_kv, mix.head_dim
            elif block.kind == "E":
                gate = mix.gate
                L.w_in, L.w_out = mat(mix.shared_experts.up_proj), mat(mix.shared_experts.down_proj)
                L.router_w, L.router_bias = ptr(_f32(gate.weight)), ptr(_f32(gate.e_score_correction_bias))
                L.n_experts, L.top_k, L.norm_topk = gate.weight.shape[0], gate.top_k, int(gate.norm_topk_prob)
                L.routed_scale = gate.scale
                L.up_e, L.down_e = (expert_mats(getattr(mix.experts, p)) for p in ("up_proj", "down_proj"))
            else:
                L.w_in, L.w_out = mat(mix.up_proj), mat(mix.down_proj)
        self.tiles = gemv.tile_from()  # NVFP4 rows on AMX tiles from this many decode rows (0: never; read at load)
        self.model = fused.Model(bf16=int(self.dtype == torch.bfloat16),
                            res_f32=int(cfg.residual_in_fp32 and self.dtype != torch.float32),
                            packed_tiles=self.tiles,
                            D=cfg.hidden_size, vocab=lm.lm_head.out_features, n_layers=len(layers),
                            eps=cfg.layer_norm_epsilon, embed=ptr(lm.backbone.embeddings.weight),
                            embed_rows=lm.backbone.embeddings.weight.shape[0],
                            norm_f=ptr(_f32(lm.backbone.norm_f.weight)), lm_head=mat(lm.lm_head),
                            layers=layers)
        self.layers, self.keep, self.vocab = layers, keep, self.model.vocab

    def _stamp(self):
        return list(map(torch.Tensor.data_ptr, self.params)), list(map(_VERSION, self.params))

    def unchanged(self) -> bool:
        """No parameter got new storage or an in-place change (checked every step: ~100 attribute reads)."""
        return self._stamp() == self.stamp

    def fresh(self, lm) -> bool:
        """Also the same parameter objects (a module swapped in since): checked once per batch."""
        params = _tensors(lm)
        return len(params) == len(self.params) and all(a is b for a, b in zip(params, self.params)) \
            and self.unchanged()


def _tensors(lm) -> list[torch.Tensor]:
    """What the step reads: the parameters and the buffers (the packed weights and scales of quantized Linears)."""
    return list(lm.parameters()) + [b for b in lm.buffers() if b is not None]


def _plan(lm, full_check: bool = True) -> Plan:
    plan = getattr(lm, "_vl_cpu_decode_plan", None)
    if plan is None or not (plan.fresh(lm) if full_check else plan.unchanged()):
        plan = Plan(lm)
        lm._vl_cpu_decode_plan = plan
    return plan


def run_step(lm, lib: fused.Library, tok: torch.Tensor, cache, plan: Plan | None = None,
             chunk: tuple | None = None) -> torch.Tensor | None:
    """One token per row: tok (b, 1) ids -> logits (b, vocab) float32, the cache advanced by one position, as
    `lm(input_ids=tok, cache=cache).logits[:, -1]` does; None (nothing done) for a cache it does not read or an id
    outside the embedding table (the modules raise their IndexError). `plan`: the one `step_fn` checked at the
    start of its batch; without it the model's parameters are checked for changes first (~200 tensors: after a
    step has streamed the weights through the caches, that check alone cost ~0.2 ms of cache misses).

    chunk: (x, chunk_cache, last) -- a joining prompt's next tokens riding along with the step: x (t, d) their
    embeddings in the model dtype, chunk_cache its own one-row cache without padding, advanced by t as
    `lm(inputs_embeds=x[None], cache=chunk_cache)` would advance it (up to float32 summation order: its Mamba
    recurrence runs token by token); with `last`, the logits get a row b, its last token's. None where the step
    cannot take the chunk (nothing done): the caller runs the two apart."""
    plan = plan or _plan(lm, full_check=False)
    ptrs = _cache_pointers(cache, plan.dtype)
    if ptrs is None:
        return None  # a cache this step does not read: the caller runs the modules
    b = tok.shape[0]
    if b != cache.batch_size or tok.numel() != b:
        return None  # rows the cache does not hold: the modules raise their shape error
    seg = None
    if chunk is not None:
        x, ccache, last = chunk
        cptrs = _cache_pointers(ccache, plan.dtype)
        if (cptrs is None or ccache.batch_size != 1 or ccache.padded or x.dim() != 2 or x.dtype != plan.dtype
                or x.shape[1] != plan.model.D or not x.is_cpu):
            return None
        ccache.check_room(ccache.length, x.shape[0])
        xf = x.float().contiguous()  # (alive until the call returns: the struct holds its address)
        seg = fused.Segment(T=x.shape[0], x=xf.data_ptr(), caches=ctypes.cast(cptrs, ctypes.c_void_p),
                            pos=ccache.length, max_len=ccache.max_len, valid=ccache.valid.data_ptr(), logits=int(last))
    ids = tok if tok.dtype is torch.int64 and tok.is_contiguous() else tok.to(torch.int64).contiguous()  # (b, 1)
    pos = cache.length
    cache.check_room(pos, 1)
    logits = torch.empty(b + (seg is not None and seg.logits), plan.vocab, dtype=torch.float32)
    if lib.lib.vl_decode_step(ctypes.byref(plan.model), b, ids.data_ptr(), ptrs, pos, cache.max_len,
                              cache.valid.data_ptr(), int(cache.padded), logits.data_ptr(),
                              None if seg is None else ctypes.byref(seg), torch.get_num_threads()):
        return None  # an id outside the table: the kernel read and wrote nothing
    cache.length = pos + 1
    if seg is not None:
        ccache.length += seg.T
    return logits


def _cache_pointers(cache, dtype):
    """The layers' cache addresses as the step takes them (two per layer), or None for a cache it does not read;
    checked once per cache and remembered on it while its tensors (and `valid`) stay the same objects."""
    tensors = list(cache.tensors())  # valid, then each layer's two
    memo = getattr(cache, "_vl_step_pointers", None)
    if memo is not None and len(memo[0]) == len(tensors) and all(map(operator.is_, memo[0], tensors)):
        return memo[1]
    ptrs = (ctypes.c_void_p * (2 * len(cache.layers)))()
    for i, layer in enumerate(cache.layers):
        if layer is None:
            continue
        a, c = (layer.k, layer.v) if hasattr(layer, "k") else (layer.conv, layer.ssm)
        if not (a.is_contiguous() and c.is_contiguous() and a.device.type == "cpu") or a.dtype != dtype \
                or (not hasattr(layer, "k") and c.dtype != torch.float32):
            return None
        ptrs[2 * i], ptrs[2 * i + 1] = a.data_ptr(), c.data_ptr()
    if not (cache.valid.is_contiguous() and cache.valid.dtype == torch.bool and cache.valid.device.type == "cpu"):
        return None
    cache._vl_step_pointers = (tensors, ptrs)
    return ptrs


def prepare(lm) -> bool:
    """Build (or load from the cache) the fused step's library now if `lm` would use it, so that the first request
    does not wait for the compiler; -> whether it will be used. Called by `vl.load_pretrained`."""
    on_cpu = all(p.device.type == "cpu" for p in lm.parameters())
    return on_cpu and unsupported(lm) is None and library() is not None


def step_fn(lm):
    """The fused step for `lm` (decode mode "fused") -- `(tok (b, 1), cache, pos) -> logits (b, vocab)` -- or None
    where it does not apply (then the modules run; the reason is logged once). Rows beyond MAX_ROWS, grad mode and
    tensors off the CPU fall back per call."""
    lib, why = _load(_mode())
    reason = why if lib is None else unsupported(lm)
    if reason is not None:
        _log_once(reason)
        return None
    plan = _plan(lm)  # built (or checked against swapped modules) once per batch: weights changed in place while
    # a batch runs are seen from the next batch on
    hooks = _hook_dicts(lm)

    def step(tok, cache, pos):
        if (tok.shape[0] <= MAX_ROWS and tok.is_cpu and not torch.is_grad_enabled()
                and not _hooked(hooks)):
            logits = run_step(lm, lib, tok, cache, plan)
            if logits is not None:
                return logits
        return lm(input_ids=tok, cache=cache).logits[:, -1]

    def mix(tok, cache, x, chunk_cache, last):
        """The step with a joining prompt's chunk riding along (`run_step`'s `chunk`) -> logits with b rows, or
        b + 1 with `last`; None (nothing done) where it cannot: the caller prefills the chunk and steps apart."""
        if (tok.shape[0] + x.shape[0] <= MAX_ROWS and tok.is_cpu and not torch.is_grad_enabled()
                and not _hooked(hooks)):
            return run_step(lm, lib, tok, cache, plan, (x, chunk_cache, last))
        return None

    step.mix = mix
    step.ride_rows = ride_rows(plan, lib)
    return step


def ride_rows(plan: Plan, lib: fused.Library) -> int:
    """Rows in all (decode rows and a riding chunk's tokens) that a step of this model takes at well under twice the
    cost of its decode rows alone, as measured on the 180m config with 7 decode rows (docs/cpu_decode.md, "A
    joining prompt's chunk inside the step"): on AMX tiles every dense bf16 product, and every NVFP4 one unless
    `VL_NVFP4_TILES=off`, takes 32 rows in one pass (7 + 25 rows: 1.74x); a ReLU^2 down_proj stored by input rows
    costs fp32 multiply-adds per row (7 + 9: 1.45x, 7 + 16: 2.0x); packed FP8 products (and NVFP4 without tiles)
    take four rows per pass (NVFP4 7 + 4: 1.46x, 7 + 9: 1.99x), as do the row loops without tiles."""
    if plan.dtype != torch.bfloat16 or not lib.lib.vl_tile_rows():
        return 12
    tiled = {0, fused.FORMATS["nvfp4"]} if plan.tiles and lib.lib.vl_packed_tiles() else {0}
    if plan.formats <= tiled:
        return 32
    return 16 if plan.formats <= tiled | {fused.DENSE_T} else 12


def skipped_by_decode_step(hook):
    """Mark a forward hook as one that does nothing for a one-token decode step (the prefill's per-layer heap trim
    of vl/runtime/cpu/encoder_pages.py), so that the fused step, which runs no hooks, still runs while it is
    registered. Returns the hook."""
    hook._vl_skipped_by_decode_step = True
    return hook


def _hook_dicts(lm) -> list[dict]:
    """Every module's forward (pre-)hook dict: `register_forward_hook` adds to these same dicts in place."""
    return [d for m in lm.modules() for d in (m._forward_hooks, m._forward_pre_hooks)]


def _hooked(hooks: list[dict]) -> bool:
    """Whether a forward hook is registered on the model or globally: the fused step would skip it (a probe, a
    step counter, a slowed step in a test), so the modules run that step instead. One C-level pass over the
    hook dicts (~5 us for the 180m model, where a Python loop over its modules took ~140 us per token); only the
    non-empty ones are looked into, for hooks marked `skipped_by_decode_step`, which do not count."""
    glob = nn.modules.module
    if glob._global_forward_hooks or glob._global_forward_pre_hooks:
        return True
    return any(hooks) and any(not getattr(f, "_vl_skipped_by_decode_step", False)
                              for d in hooks if d for f in d.values())


@functools.cache
def _log_once(reason: str) -> None:
    log.info("vl: the fused CPU decode step is not used (%s); decoding through the modules", reason)
