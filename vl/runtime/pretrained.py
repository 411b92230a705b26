"""`vl.load_pretrained`: a checkpoint's model (vl/checkpoint/load.py) with the runtime passes applied from outside
the model code, in gpt-fast's `_load_model` order: build and assign, then the CPU matmul passes, then placement."""

from __future__ import annotations

import logging

from vl.checkpoint.load import load_model
from vl.kernels import ssd_scan
from vl.modeling.mamba2 import Mamba2Mixer
from vl.runtime.cpu import decode as cpu_decode
from vl.runtime.cpu import encoder_pages, gpu_libs, heap, hugepages
from vl.runtime.cpu.matmul import (bucket_llm_matmuls, gemv_decode_linears, onednn_fp32_matmuls,
                                   transpose_relu2_down_proj, upcast_16bit_matmuls)
from vl.runtime.placement import place

log = logging.getLogger(__name__)


def load_pretrained(path, dtype=None, device_map=None, max_memory=None, scan_nan: bool = False,
                    quant_mode: str | None = None):
    """Any supported checkpoint directory as an `nn.Module` (README, "Quickstart: Python")."""
    def release(checkpoint_bytes: int) -> bool:
        return device_map is None and encoder_pages.choose(checkpoint_bytes) == "release"

    model = load_model(path, dtype=dtype, device_map=device_map, scan_nan=scan_nan, quant_mode=quant_mode,
                       map_encoders=release)
    model.encoder_pages = "release" if model.mapped_encoder_bytes else "keep"
    if model.mapped_encoder_bytes:
        log.info("vl: %s: %.2f GiB of encoder weights are mapped from the checkpoint and in memory only while an "
                 "encoder runs (VL_ENCODER_PAGES=keep holds them)", path, model.mapped_encoder_bytes / 2**30)
    model = runtime_passes(model, device_map=device_map, max_memory=max_memory)
    encoder_pages.install(model)  # release mode: each encoder module maps its weights in only while it runs
    return model


def runtime_passes(model, device_map=None, max_memory=None):
    """The passes every loaded model gets (also applied by `vl bench` to the models it builds in memory)."""
    upcast_16bit_matmuls(model)  # before placement, so accelerate's hooks wrap the routed forward
    onednn_fp32_matmuls(model)  # fp32 products through oneDNN where MKL is slow (vl/kernels/gemm.py)
    bucket_llm_matmuls(model)  # the LLM's 16-bit products on rounded row counts: bounded oneDNN primitive cache
    gemv_decode_linears(model)  # decode-sized products at memory speed where the CPU kernel builds
    if device_map is not None:
        model = place(model, device_map, max_memory=max_memory)
    transpose_relu2_down_proj(model)  # decode reads only the down_proj rows of non-zero ReLU^2 inputs (cpu/matmul.py)
    hugepages.advise(model)  # CPU weights on 2 MiB pages: decode streams them faster (vl/runtime/cpu/hugepages.py)
    cpu_decode.prepare(getattr(model, "language_model", model))  # build the fused step now, not at the first request
    if any(isinstance(m, Mamba2Mixer) and m.dt_bias.device.type == "cpu" for m in model.modules()):
        ssd_scan.library()  # and the CPU prefill's C++ scan (vl/kernels/csrc/ssd_scan.cpp; ~3 s once per machine)
    gpu_libs.page_out()  # no CUDA device: the CUDA libraries' pages that `import torch` mapped go back (same dir)
    heap.trim_heap()  # the pages of the tensors the passes above copied and freed go back to the OS (vl/runtime/cpu/heap.py)
    heap.keep_freed_memory()  # from now on a prefill's freed temporaries stay for the next layer (same file)
    return model
