"""The fused CPU decode step in C++ (`csrc/decode_step.cpp`): one call per generated token for a whole Nemotron-H
model, dense bf16 / fp32 or weight-only FP8 / NVFP4 weights read in place. Its twin is the plain-math modules
(vl/modeling): same roundings to the model dtype, float32 accumulation, only the order of float32 additions differs.

This file is the library as ctypes sees it: the structs that mirror `VlMat`, `VlLayer` and `VlModel`, the loader
for a mode, and the one call. What the structs point at (the model's weights, its cache) is filled in by the
runtime pass vl/runtime/cpu/decode.py, which knows the model; this file does not.
"""

from __future__ import annotations

import ctypes
import functools

from vl.kernels import loader

SOURCE = loader.CSRC / "decode_step.cpp"
KINDS = {"M": 0, "*": 1, "-": 2, "E": 3}  # VlLayer.kind per pattern character
FORMATS = {"fp8": 1, "nvfp4": 2}  # VlMat.fmt; 0 = dense
DENSE_T = 3  # VlMat.fmt of a dense weight stored transposed: the kernel skips its zero inputs

_p, _i, _f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float


class Mat(ctypes.Structure):  # mirrors `struct VlMat` of csrc/decode_step.cpp
    _fields_ = [("fmt", _i), ("N", _i), ("K", _i), ("w", _p), ("scale", _p), ("scale_kind", _i),
                ("block_scale", _p), ("global_scale", _f)]


class Layer(ctypes.Structure):  # mirrors `struct VlLayer`
    _fields_ = [("kind", _i), ("norm_w", _p), ("w_in", Mat), ("w_k", Mat), ("w_v", Mat), ("w_out", Mat),
                ("d_inner", _i), ("conv_dim", _i), ("n_heads", _i),
                ("head_dim", _i), ("n_groups", _i), ("d_state", _i), ("conv_k", _i), ("conv_w", _p), ("conv_b", _p),
                ("dt_bias", _p), ("A", _p), ("Dskip", _p), ("gnorm_w", _p), ("dt_lo", _f), ("dt_hi", _f),
                ("dt_clamp", _i), ("n_q_heads", _i), ("n_kv_heads", _i), ("attn_head_dim", _i),
                ("router_w", _p), ("router_bias", _p), ("n_experts", _i), ("top_k", _i), ("norm_topk", _i),
                ("routed_scale", _f), ("up_e", ctypes.POINTER(Mat)), ("down_e", ctypes.POINTER(Mat))]


class Model(ctypes.Structure):  # mirrors `struct VlModel`
    _fields_ = [("bf16", _i), ("res_f32", _i), ("packed_tiles", _i), ("D", _i), ("vocab", _i), ("n_layers", _i), ("eps", _f),
                ("embed", _p), ("embed_rows", _i), ("norm_f", _p), ("lm_head", Mat),
                ("layers", ctypes.POINTER(Layer))]


class Segment(ctypes.Structure):  # mirrors `struct VlSegment`: a joining prompt's chunk riding along with a step
    _fields_ = [("T", _i), ("x", _p), ("caches", _p), ("pos", _i), ("max_len", _i), ("valid", _p), ("logits", _i)]


FUNCTIONS = {"vl_decode_step": ([ctypes.POINTER(Model), _i, _p, _p, _i, _i, _p, _i, _p, ctypes.POINTER(Segment), _i],
                                _i),
             "vl_tile_rows": ([], _i),
             "vl_packed_tiles": ([], _i)}
Library = loader.Library


@functools.cache
def load(mode: str) -> tuple[Library | None, str]:
    """The step's library for a mode (auto | portable | off) -> (library, "ok") or (None, why)."""
    # auto keeps the modules without AVX512: the portable loops lose to torch's GEMV
    return loader.load(SOURCE, mode, "VL_CPU_DECODE", "the fused decode step",
                       functools.partial(Library, functions=FUNCTIONS))
