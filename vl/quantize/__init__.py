"""The offline quantizer: a BF16 / FP32 checkpoint -> a ModelOpt FP8 / NVFP4 one (`vl quantize`).

`ptq.py` is the library call (`quantize_checkpoint`), `cli.py` the command's flags. The bit formats and quantized
Linears live in vl/quant; this package sits above the runtime, whose loader it calibrates through. Nothing is
imported here, so that `vl quantize --help` answers without torch.
"""
