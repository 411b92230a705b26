"""Native code, the bottom layer: every C++ source and shared header in csrc/, their build cache and loader
(loader.py), and one ctypes wrapper per library, each naming its pure-torch twin:

- gemv.py: FP8 / NVFP4 and dense few-row products (csrc/quant_gemv.cpp over csrc/row_kernels.h); twins
  vl/quant/gemv_ref.py and `F.linear`;
- ssd_scan.py: the chunked SSD scan of a CPU prefill (csrc/ssd_scan.cpp); twin `vl.modeling.ssd_ref.ssd_chunked`;
- decode_step.py: one whole Nemotron-H decode step (csrc/decode_step.cpp); twin the plain-math modules.

Nothing here knows the model: the runtime passes that point the kernels at a model's tensors live in
vl/runtime/cpu/. Importing this package loads nothing (no torch, no compiler).
"""
