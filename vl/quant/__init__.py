"""FP8 / NVFP4 (NVIDIA ModelOpt layout): formats, checkpoint detection, quantized Linear execution, PTQ export."""

from vl.quant.config import (
    LinearQuantSpec,
    QuantConfig,
    QuantFormatError,
    QuantUnavailableError,
    detect_quantized_linears,
    is_excluded,
    never_quantized,
    read_quant_config,
)
from vl.quant.export import collect_input_amax, export_quantized, quantize_state_dict, write_hf_quant_config
from vl.quant.linear import (
    FP8Linear,
    NVFP4Linear,
    QuantizedLinear,
    dequantize_state_dict,
    resident_weight_bytes,
    swap_quantized_linears,
)

__all__ = [
    "FP8Linear", "LinearQuantSpec", "NVFP4Linear", "QuantConfig", "QuantFormatError", "QuantUnavailableError",
    "QuantizedLinear", "collect_input_amax", "dequantize_state_dict", "detect_quantized_linears",
    "export_quantized", "is_excluded", "never_quantized", "quantize_state_dict", "read_quant_config",
    "resident_weight_bytes", "swap_quantized_linears", "write_hf_quant_config",
]
