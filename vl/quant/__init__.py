"""FP8 / NVFP4 (NVIDIA ModelOpt layout): formats, checkpoint detection, quantized Linear execution, PTQ export.

The names below are imported from their modules on first use, not when the package is: every module of the package
needs torch, and importing the package alone should not pay for it. The offline quantizer (`vl quantize`)
is vl/quantize.
"""

import importlib

_HOME = {
    "vl.quant.config": ("LinearQuantSpec", "QuantConfig", "QuantFormatError", "QuantUnavailableError",
                        "detect_quantized_linears", "is_excluded", "never_quantized", "read_quant_config"),
    "vl.quant.export": ("collect_input_amax", "export_quantized", "quantize_state_dict", "write_hf_quant_config"),
    "vl.quant.linear": ("FP8Linear", "NVFP4Linear", "QuantizedLinear", "dequantize_state_dict",
                        "resident_weight_bytes", "swap_quantized_linears"),
}
_MODULE_OF = {name: module for module, names in _HOME.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name):
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'vl.quant' has no attribute {name!r}")
    return getattr(importlib.import_module(_MODULE_OF[name]), name)
