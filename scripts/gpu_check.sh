#!/usr/bin/env bash
# One prepared run on a CUDA machine (the `device` tool): the GPU-only tests, then `vl bench` on CUDA.
# The machine has its own python3/torch and no network: the project runs from the working tree
# (PYTHONPATH), and mamba-ssm's Triton kernels come from .gpu_shim (carried; see README "GPU checks").
set -u
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/.gpu_shim:$PWD" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
{
  nvidia-smi -L
  python3 -c "import torch, transformers, timm, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'timm', timm.__version__, 'triton', triton.__version__)"
  python3 -c "from vl.modeling import kernels; print('mamba-ssm fast path available:', kernels.fast_available())"
} 2>&1 | tee "$OUT/env.txt"
timeout ${TEST_S:-90} python3 -m pytest -q -p no:cacheprovider -rA ${TESTS:-\
  tests/modeling/test_kernels_gpu.py \
  tests/runtime/test_decode_modes.py::test_cuda_graph_step_equals_eager_on_gpu \
  tests/quant/test_linear.py::test_native_fp8_matches_weight_only_emulation_on_gpu \
  tests/quant/test_checkpoint_loading.py::test_auto_on_cuda_runs_native_fp8_where_it_can_and_matches_w8a8_emulation \
  tests/token_reduction/test_reducer_contract.py} \
  2>&1 | tail -30 | tee "$OUT/gpu_tests.txt"
timeout ${BENCH_S:-150} python3 -m vl.cli bench --device cuda --configs 1b --dtypes bf16 ${BENCH_ARGS:---prefill 2048,8192 \
  --decode-ctx 128,4096 --new-tokens 64 --repeats 3} --json "$OUT/bench_cuda.json" 2>&1 | grep -v "falling back" \
  | tail -15 | tee "$OUT/bench_cuda.txt"
