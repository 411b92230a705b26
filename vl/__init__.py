"""Nemotron Nano V2 VL, end to end: `load_pretrained`, `load_processor`, `Engine`.

Heavy modules are imported on first use so that `import vl` stays cheap and free of side effects
beyond registering the transformers Auto classes (and the old names of moved modules, below).
"""

import importlib
import sys
import types
import warnings

from vl.errors import VLError

__all__ = ["load_pretrained", "load_processor", "Engine", "RequestOptions", "VLError"]


def load_pretrained(path, dtype=None, device_map=None, **kwargs):
    """Load any supported checkpoint directory (see README) as an `nn.Module`."""
    from vl.runtime.pretrained import load_pretrained as _load

    return _load(path, dtype=dtype, device_map=device_map, **kwargs)


def load_processor(path, **kwargs):
    """Messages -> model inputs, for the checkpoint directory at `path`."""
    from vl.processing.load import load_processor as _load

    return _load(path, **kwargs)


# Modules that moved (one folder per layer): the old name answers for one release. Importing it costs
# nothing; its first use imports the new home and warns. A string, not an import: the layer test sees the callers'
# imports of the new names, and nothing of the library below the CLI depends on these.
MOVED = {
    "vl.remote": "vl.server.client",
    "vl.cli_flags": "vl.cli.flags",
    "vl.chat_cli": "vl.cli.chat",
    "vl.native": "vl.kernels.loader",
    "vl.cpu_gemm": "vl.kernels.gemm",
    "vl.bench_geometry": "vl.bench.geometry",
    "vl.bench_llama_cpp": "vl.bench.llama_cpp",
    "vl.bench_timing": "vl.bench.timing",
}


class _MovedModule(types.ModuleType):
    """An old module name: each attribute comes from the new home, with a DeprecationWarning."""

    def __getattr__(self, name):
        if name.startswith("__"):  # the import system, inspect and pickle probe dunders of every module: not a use
            raise AttributeError(name)
        new = MOVED[self.__name__]
        warnings.warn(f"{self.__name__} moved to {new}; the old name goes in the next release", DeprecationWarning,
                      stacklevel=2)
        return getattr(importlib.import_module(new), name)


for _old in MOVED:
    sys.modules.setdefault(_old, _MovedModule(_old))


def __getattr__(name):
    if f"vl.{name}" in MOVED:  # `import vl.remote` then `vl.remote.X`, or `from vl import chat_cli`
        return sys.modules[f"vl.{name}"]
    if name == "Engine":
        from vl.runtime.engine import Engine

        return Engine
    if name == "RequestOptions":  # one request's options, declared once (docs/architecture.md, "Options")
        from vl.options import RequestOptions

        return RequestOptions
    raise AttributeError(f"module 'vl' has no attribute {name!r}")
from vl import hf as _hf  # registers the transformers Auto classes
