"""Every benchmark, above the library and below the command line (`vl bench`):

- run.py: `vl bench` itself, ours against transformers in one process (prefill, decode, its weight-read rate
  against a copy, memory, cache), with the peers and tables below;
- quant.py: the FP8 / NVFP4 table (`vl bench --quant`; `python -m vl.bench.quant`);
- geometry.py: a released-width random checkpoint streamed to disk, loaded and timed (`vl bench --geometry`);
- omni_geometry.py: the Nemotron 3 Nano Omni 30B-A3B geometry's MoE figures (bytes read per token, BF16 parts, towers);
- media.py: requests end to end through the engine at released widths, each stage timed (`vl bench --geometry G
  --media`);
- vision.py: the released-size vision tower against transformers' RadioModel (`vl bench --vision-tower`);
- llama_cpp.py: llama.cpp as a peer (converter shim, llama-bench runner);
- timing.py: what they measure with (peak memory, the CPU's ISA, our prefill and per-token decode);
- evs_flops.py: the FLOPs and tokens EVS saves per video (`python -m vl.bench.evs_flops`).

Times are taken only here, never in tests (docs/benchmarks.md).
"""

import importlib
import sys
import warnings

_SUBMODULES = ("run", "quant", "geometry", "omni_geometry", "media", "vision", "llama_cpp", "timing", "evs_flops")


def __getattr__(name):
    """`vl.bench` was one module until it became this package: its names (`main`, `CONFIGS`, `build_pair`, ...)
    answer for one release from vl/bench/run.py, with a DeprecationWarning."""
    if name.startswith("__") or name in _SUBMODULES:  # dunder probes and submodule imports are not uses
        raise AttributeError(name)
    run = importlib.import_module("vl.bench.run")
    if not hasattr(run, name):
        raise AttributeError(f"module 'vl.bench' has no attribute {name!r}")
    if not sys._getframe(1).f_code.co_filename.startswith("<frozen importlib"):  # `from vl.bench import x` asks
        # the import system first (hasattr), then the caller's line: warn once, at the caller's line
        warnings.warn(f"vl.bench.{name} moved to vl.bench.run.{name}; the old name goes in the next release",
                      DeprecationWarning, stacklevel=2)
    return getattr(run, name)
