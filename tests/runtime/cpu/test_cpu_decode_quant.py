"""The fused CPU decode step on weight-only FP8 / NVFP4 models (packed Linears read through quant_gemv.cpp's
kernels inside the step) against its reference twin, the modules' forward, whose quantized Linears call the same
kernels one layer at a time: logits and every cache tensor after several steps, every scale layout, fp32 and bf16,
padded batches, both builds. Also what keeps such a model on the modules (activation emulation, the packed kernel
switched off)."""

import pytest
import torch

from test_cpu_decode import (  # noqa: F401 -- `lib` is the fixture of both builds
    assert_fused_uses_the_step_with_the_modules_tokens, compare_steps, lib, model)
from vl.config import LMConfig
from vl.kernels import gemv
from vl.quant.export import exclude_patterns, quantizable_linear_names, quantize_state_dict
from vl.quant.linear import QuantizedLinear, swap_quantized_linears
from vl.runtime.cpu import decode as cpu_decode
from vl.runtime.generate import left_pad

# widths that NVFP4 allows (in_features % 16 == 0) but the vector loops do not divide (64-column groups: tails)
SMALL = dict(vocab_size=301, hidden_size=48, pattern="M*-M-*M", num_attention_heads=4, num_key_value_heads=2,
             head_dim=12, intermediate_size=80, mamba_num_heads=4, mamba_head_dim=12, n_groups=2,
             ssm_state_size=24, chunk_size=16)
# FP8 128 x 128 blocks need every width a multiple of 128 (in_proj: 2 x 128 + 2 x 2 x 63 + 4 heads = 512 rows)
BLOCKS = dict(SMALL, hidden_size=128, intermediate_size=256, head_dim=32, mamba_head_dim=32, ssm_state_size=63,
               num_key_value_heads=4)
ALGOS = {  # algo -> (config, what the checkpoint stores)
    "FP8": (SMALL, "per-tensor FP8 (with a static input scale the weight-only path ignores)"),
    "FP8_PER_CHANNEL_PER_TOKEN": (SMALL, "per-row FP8 scales"),
    "FP8_PB_WO": (BLOCKS, "128 x 128 block FP8 scales"),
    "W4A16_NVFP4": (SMALL, "NVFP4 (E2M1 codes, E4M3 block scales, a global scale)"),
}


def quantized(algo: str, dtype, mode: str = "weight-only", seed: int = 0, **swap):
    """A random model whose projections are exported with `algo` (lm_head stays dense, as ModelOpt leaves it), and
    the same packed weights dequantized to fp32 plain Linears (the truth a bf16 run approximates)."""
    cfg = LMConfig(**ALGOS[algo][0])
    base = model(cfg, torch.float32, seed, std=0.3)
    names = quantizable_linear_names(base, exclude_patterns())
    sd = quantize_state_dict(base.state_dict(), names, algo, {n: 4.0 for n in names})
    runs = []
    for m, d, how in ((model(cfg, torch.float32, seed, std=0.3), dtype, mode),
                      (model(cfg, torch.float32, seed, std=0.3), torch.float32, "dequantize")):
        m = m.to(d)
        swap_quantized_linears(m, {k: v.clone() for k, v in sd.items()}, how, compute_dtype=torch.float32, **swap)
        runs.append(m.eval())
    return runs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("algo", sorted(ALGOS))
def test_fused_step_equals_the_modules_on_packed_weights(lib, algo, dtype):
    lm, truth = quantized(algo, dtype)
    assert sum(isinstance(m, QuantizedLinear) for m in lm.modules()) == 18  # every projection, not lm_head
    if gemv.kernel() is None:
        pytest.skip(f"the packed kernel does not build here: {gemv.status()}")
    assert cpu_decode.unsupported(lm) is None
    ids = torch.randint(3, 301, (1, 9))
    compare_steps(lm, lib, ids, truth=truth if dtype == torch.bfloat16 else None)


@pytest.mark.parametrize("algo", ["FP8", "W4A16_NVFP4"])
def test_fused_step_on_packed_weights_and_padded_batches(lib, algo):
    lm, truth = quantized(algo, torch.bfloat16, seed=1)
    if gemv.kernel() is None:
        pytest.skip(f"the packed kernel does not build here: {gemv.status()}")
    ids, mask = left_pad([torch.randint(3, 301, (n,)) for n in (4, 11, 7, 1, 9, 3)])  # kernel row groups 4 + 2
    compare_steps(lm, lib, ids, mask, truth=truth)


def test_the_fused_mode_decodes_packed_weights_with_the_modules_tokens(lib, monkeypatch):
    lm, _ = quantized("W4A16_NVFP4", torch.float32, seed=2)
    if gemv.kernel() is None:
        pytest.skip(f"the packed kernel does not build here: {gemv.status()}")
    assert_fused_uses_the_step_with_the_modules_tokens(lm, lib, monkeypatch)


def test_what_keeps_a_packed_model_on_the_modules(lib, monkeypatch):
    lm, _ = quantized("FP8", torch.float32, emulate_activations=True)
    assert "emulating activations" in cpu_decode.unsupported(lm)
    lm, _ = quantized("W4A16_NVFP4", torch.float32)
    monkeypatch.setenv("VL_QUANT_KERNEL", "off")
    assert "packed kernel is off" in cpu_decode.unsupported(lm)
    with torch.no_grad():  # a NaN code in an FP8 weight: that layer takes the reference path, so the model does too
        lm, _ = quantized("FP8_PER_CHANNEL_PER_TOKEN", torch.float32)
        monkeypatch.delenv("VL_QUANT_KERNEL")
        if gemv.kernel() is None:
            pytest.skip(f"the packed kernel does not build here: {gemv.status()}")
        w = lm.backbone.layers[0].mixer.in_proj.weight
        w.view(torch.uint8)[0, 0] = 0x7F
    assert "reference path" in cpu_decode.unsupported(lm)


def test_a_changed_packed_weight_is_seen(lib):
    lm, _ = quantized("W4A16_NVFP4", torch.float32)
    if gemv.kernel() is None:
        pytest.skip(f"the packed kernel does not build here: {gemv.status()}")
    ids = torch.randint(3, 301, (1, 5))
    compare_steps(lm, lib, ids, steps=1)
    with torch.no_grad():
        lm.backbone.layers[2].mixer.up_proj.weight.bitwise_xor_(0x11)  # in place: the plan must be rebuilt
    compare_steps(lm, lib, ids, steps=2)


@pytest.mark.parametrize("algo", ["FP8", "W4A16_NVFP4"])
def test_exporting_a_loaded_model_whose_down_proj_is_stored_by_rows(lib, algo):
    """`vl quantize` and `vl bench --formats` quantize a model after the load passes, which may leave the ReLU^2
    down_proj weights stored (K, N) (cpu_matmul.transpose_relu2_down_proj): the exported tensors are the same as
    from the plain layout, contiguous, and the packed Linears stay on the fused step (not the slow reference)."""
    from test_cpu_decode import down_by_rows

    cfg = LMConfig(**ALGOS[algo][0])
    plain = model(cfg, torch.float32, 0, std=0.3)
    rows = down_by_rows(model(cfg, torch.float32, 0, std=0.3))
    names = quantizable_linear_names(plain, exclude_patterns())
    want = quantize_state_dict(plain.state_dict(), names, algo, {n: 4.0 for n in names})
    got = quantize_state_dict(rows.state_dict(), names, algo, {n: 4.0 for n in names})
    assert want.keys() == got.keys()
    for k in want:
        assert torch.equal(got[k].float(), want[k].float()), k
        assert got[k].is_contiguous() or "down_proj.weight" not in k, k
    swap_quantized_linears(rows, got, "weight-only", compute_dtype=torch.float32)
    assert all(m.packed_operands() is not None for m in rows.modules() if isinstance(m, QuantizedLinear))
    assert cpu_decode.unsupported(rows) is None
