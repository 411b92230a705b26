"""Where one fused CPU decode step's time goes (docs/cpu_decode.md, "Where a step's time goes").

Builds a timed copy of `vl/kernels/csrc/decode_step.cpp` (wall-clock counters around every weight product, each
layer kind and the Mamba-2 conv / state / gated-norm parts) in a temporary directory, then decodes 32 tokens
after a 128-token prompt with the 180m `vl bench` config in bf16 and as weight-only FP8 / NVFP4 copies, 1 thread (`--threads`),
and prints ms per token for each part and for the Python side (wall time per token minus the C++ step).
The product's library is untouched; the counters cost ~1 us per step.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python scripts/research/profile_decode_step.py [--config 180m]
"""

from __future__ import annotations

import argparse
import ctypes
import shutil
import tempfile
import time
from pathlib import Path

import torch

from vl.bench.run import CONFIGS, build_pair
from vl.bench.timing import our_decode_s
from vl.bench.quant import quantized_copy
from vl.kernels import decode_step
from vl.runtime.cpu import decode as cpu_decode

KERNELS = Path(decode_step.SOURCE).parent
EDITS = [  # (anchor, replacement): counters PROF[0..2] GEMV by format, [3..5] layer kinds, [6] step, [7] steps,
    # [8] conv, [9] state update, [10] gated norm
    ('#include "row_kernels.h"  // VL_AVX512, the dense / FP8 / NVFP4 row kernels, bf16_to_float',
     '#include "row_kernels.h"\n#include <chrono>\nstatic double PROF[12];\n'
     'static inline double now_s() { return std::chrono::duration<double>('
     'std::chrono::steady_clock::now().time_since_epoch()).count(); }\n'
     'extern "C" void vl_prof(double* o) { for (int i = 0; i < 12; ++i) { o[i] = PROF[i]; PROF[i] = 0; } }\n'),
    ('static void gemv(const float* x,', 'static void gemv_(const float* x,'),
    ('// ---------------------------------------------------------------------------------------------------------------\n// Scratch:',
     'static void gemv(const float* x, const uint16_t* xb, int M, const VlMat& W, int bf16, float* y, int nt) {\n'
     '  double t = now_s(); gemv_(x, xb, M, W, bf16, y, nt); PROF[W.fmt] += now_s() - t; }\n// Scratch:'),
    ('    const VlLayer& L = m->layers[l];\n', '    const VlLayer& L = m->layers[l];\n    double t0 = now_s();\n'),
    ('      mlp_layer(*m, L, B, h.data(), nthreads);\n  }',
     '      mlp_layer(*m, L, B, h.data(), nthreads);\n    PROF[3 + L.kind] += now_s() - t0;\n  }'),
    ('  h.resize((size_t)B * m->D);\n', '  double T0 = now_s();\n  h.resize((size_t)B * m->D);\n'),
    ('  round_n(logits, (size_t)B * m->vocab, rnd.bf16);\n  return 0;',
     '  round_n(logits, (size_t)B * m->vocab, rnd.bf16);\n  PROF[6] += now_s() - T0; PROF[7] += 1;\n  return 0;'),
    ('  for (int b = 0; b < B; ++b) {\n    float* z = zx.data()',
     '  double tc = now_s();\n  for (int b = 0; b < B; ++b) {\n    float* z = zx.data()'),
    ('    const float* xs = xbc;', '    PROF[8] += now_s() - tc; tc = now_s();\n    const float* xs = xbc;'),
    ('    // gated RMSNorm (norm after the gate)',
     '    PROF[9] += now_s() - tc; tc = now_s();\n    // gated RMSNorm (norm after the gate)'),
    ('  yn.sync_bf16((size_t)B * L.d_inner, m.bf16);\n  out.resize',
     '  PROF[10] += now_s() - tc;\n  yn.sync_bf16((size_t)B * L.d_inner, m.bf16);\n  out.resize'),
]


def timed_source(tmp: Path) -> Path:
    text = Path(decode_step.SOURCE).read_text()
    for anchor, new in EDITS:
        if anchor not in text:
            raise SystemExit(f"decode_step.cpp changed: cannot place a counter at {anchor[:60]!r}")
        text = text.replace(anchor, new, 1)
    kernels = kernel_tree(tmp)
    (kernels / "decode_step.cpp").write_text(text)
    return kernels / "decode_step.cpp"


def kernel_tree(tmp: Path) -> Path:
    """A copy of vl/kernels/csrc (the sources with the headers they include) under `tmp` -> the copy's folder; also
    used by ab_decode_kernel.py."""
    kernels = tmp / "csrc"
    kernels.mkdir(parents=True, exist_ok=True)
    for f in KERNELS.iterdir():
        shutil.copy(f, kernels / f.name)
    return kernels


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="180m", choices=sorted(CONFIGS))
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        decode_step.SOURCE = timed_source(Path(tmp))
        cpu_decode._load.cache_clear()
        lib = cpu_decode.library()
        if lib is None:
            raise SystemExit(f"the fused step is not available here: {cpu_decode.status()}")
        read = lib.lib.vl_prof
        read.argtypes = [ctypes.c_void_p]
        cfg = CONFIGS[args.config]()
        ours, _ = build_pair(cfg, torch.bfloat16)
        calib = torch.randint(3, cfg.vocab_size, (1, 64), generator=torch.Generator().manual_seed(1))
        models = {"bf16": ours, **{f: quantized_copy(ours, f, calib) for f in ("fp8", "nvfp4")}}
        ids = torch.randint(3, cfg.vocab_size, (1, 128), generator=torch.Generator().manual_seed(2))
        buf = (ctypes.c_double * 12)()
        print(f"{args.config}, {args.threads} thread(s), {args.tokens} tokens after 128, ms per token ({time.strftime('%F %T %Z')})")
        print("model   tok/s   step  python | GEMV dense  fp8  nvfp4 | other C++: conv  state  gnorm  rest")
        for name, m in models.items():
            read(buf)
            s = our_decode_s(m, ids, args.tokens)
            read(buf)
            v = [1e3 * x / buf[7] for x in buf]
            other = v[6] - v[0] - v[1] - v[2]
            print(f"{name:6s} {1 / s:6.1f} {v[6]:6.2f} {1e3 * s - v[6]:6.2f}  | {v[0]:9.2f} {v[1]:5.2f} {v[2]:6.2f} |"
                  f" {other:9.2f} {v[8]:5.2f} {v[9]:6.2f} {v[10]:6.2f} {other - v[8] - v[9] - v[10]:5.2f}")


if __name__ == "__main__":
    main()
