"""Nemotron Nano V2 VL, end to end: `load_pretrained`, `load_processor`, `Engine`.

Heavy modules are imported on first use so that `import vl` stays cheap and free of side effects
beyond registering the transformers Auto classes.
"""

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


def __getattr__(name):
    if name == "Engine":
        from vl.runtime.engine import Engine

        return Engine
    if name == "RequestOptions":  # one request's options, declared once (docs/architecture.md, "Options")
        from vl.options import RequestOptions

        return RequestOptions
    raise AttributeError(f"module 'vl' has no attribute {name!r}")
from vl import hf as _hf  # registers the transformers Auto classes
