"""Quantized Linear modules and the swap pass: modes, key names, memory, errors, native-vs-reference on GPU."""

import logging

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from vl.errors import CheckpointError, ConfigError
from vl.kernels import gemv
from vl.quant.config import QuantFormatError, QuantUnavailableError, detect_quantized_linears
from vl.quant.export import export_quantized
from vl.quant.fp8 import dequantize_fp8, quantize_fp8_activation
from vl.quant.linear import (
    FP8Linear,
    NVFP4Linear,
    dequantize_state_dict,
    native_fp8_support,
    resident_weight_bytes,
    swap_quantized_linears,
)
from vl.quant.nvfp4 import dequantize_nvfp4, ref_nvfp4_quant

from quant_toy import IN_PROJ, OUT_PROJ, run, toy


def exported(algo, bias=False, seed=0):
    torch.manual_seed(seed)
    m = toy(bias=bias)
    x = torch.randn(6, 32)
    from vl.quant.export import collect_input_amax
    amax = collect_input_amax(m, lambda: run(m, x))
    sd, _ = export_quantized(m, algo, amax)
    return m, sd, x


def load_into_fresh(sd, mode, bias=False, **kw):
    m = toy(bias=bias)
    report = swap_quantized_linears(m, sd, mode, compute_dtype=torch.float32, **kw)
    rest = {k: v for k, v in sd.items() if k not in report.consumed_keys}
    missing, unexpected = m.load_state_dict(rest, strict=False)
    assert set(missing) <= report.consumed_keys and not unexpected
    return m, report


@pytest.mark.parametrize("algo", ["NVFP4", "FP8", "FP8_PER_CHANNEL_PER_TOKEN", "W4A16_NVFP4"])
@pytest.mark.parametrize("bias", [False, True])
def test_weight_only_equals_linear_with_the_dequantized_weight(algo, bias):
    _, sd, x = exported(algo, bias)
    m, report = load_into_fresh(sd, "weight-only", bias)
    assert set(report.modules) == {IN_PROJ, OUT_PROJ}
    lin = m.get_submodule(IN_PROJ)
    assert isinstance(lin, NVFP4Linear if "NVFP4" in algo else FP8Linear)
    if "NVFP4" in algo:
        w = dequantize_nvfp4(sd[f"{IN_PROJ}.weight"], sd[f"{IN_PROJ}.weight_scale"], sd[f"{IN_PROJ}.weight_scale_2"])
    else:
        w = dequantize_fp8(sd[f"{IN_PROJ}.weight"], sd[f"{IN_PROJ}.weight_scale"])
    h = torch.randn(5, 64)
    b = sd.get(f"{IN_PROJ}.bias")
    # 5 rows take the fused CPU kernel where it builds: the same weights, float32 sums in another order
    torch.testing.assert_close(lin(h), F.linear(h, w, b), rtol=1e-5, atol=1e-6)
    # dequantize mode gives a plain nn.Linear with exactly that weight, and the same model output
    md, _ = load_into_fresh(sd, "dequantize", bias)
    assert type(md.get_submodule(IN_PROJ)) is nn.Linear and torch.equal(md.get_submodule(IN_PROJ).weight, w)
    assert torch.allclose(run(md, x), run(m, x), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("algo", ["NVFP4", "FP8"])
def test_state_dict_keys_are_the_checkpoint_names(algo):
    _, sd, _ = exported(algo)
    m, _ = load_into_fresh(sd, "weight-only")
    keys = set(m.state_dict())
    assert keys == set(sd)
    assert f"{IN_PROJ}.weight_scale" in keys and f"{IN_PROJ}.input_scale" in keys
    assert (f"{IN_PROJ}.weight_scale_2" in keys) == (algo == "NVFP4")


@pytest.mark.parametrize("algo", ["NVFP4", "FP8_PER_CHANNEL_PER_TOKEN"])
def test_build_from_specs_then_strict_load(algo):
    _, sd, x = exported(algo)
    m = toy()
    swap_quantized_linears(m, detect_quantized_linears(sd), "weight-only")
    m.load_state_dict(sd, strict=True)  # every checkpoint key has a home, under its own name
    ref, _ = load_into_fresh(sd, "weight-only")
    assert torch.equal(run(m, x), run(ref, x))
    with pytest.raises(ConfigError, match="needs the checkpoint tensors"):
        swap_quantized_linears(toy(), detect_quantized_linears(sd), "dequantize")


def test_wrong_dtype_at_load_is_an_error_naming_the_tensor():
    _, sd, _ = exported("NVFP4")
    m = toy()
    swap_quantized_linears(m, detect_quantized_linears(sd), "weight-only")
    bad = dict(sd)
    bad[f"{IN_PROJ}.weight_scale"] = sd[f"{IN_PROJ}.weight_scale"].to(torch.bfloat16)
    with pytest.raises(QuantFormatError, match=f"{IN_PROJ}.weight_scale: expected dtype torch.float8_e4m3fn"):
        m.load_state_dict(bad)


def test_nvfp4_weight_only_holds_about_a_quarter_of_bf16_bytes():
    lin = nn.Linear(512, 1024, bias=False)
    bf16 = nn.Sequential(lin).to(torch.bfloat16)
    sd, _ = export_quantized(nn.Sequential(nn.Linear(512, 1024, bias=False)), "W4A16_NVFP4", exclude_lm_head=False)
    q = nn.Sequential(nn.Linear(512, 1024, bias=False))
    swap_quantized_linears(q, sd, "weight-only")
    ratio = resident_weight_bytes(q) / resident_weight_bytes(bf16)
    # 0.5 B (packed FP4) + 1/16 B (E4M3 block scale) per weight vs 2 B -> 0.28125 (+4 B global scale)
    assert ratio == pytest.approx((1024 * 256 + 1024 * 32 + 4) / (1024 * 512 * 2))
    assert ratio < 0.3


def test_fp8_activation_emulation_equals_w8a8_formula():
    _, sd, _ = exported("FP8")
    m, _ = load_into_fresh(sd, "weight-only", emulate_activations=True)
    lin = m.get_submodule(IN_PROJ)
    h = torch.randn(7, 64) * 3
    s_in, s_w, w8 = sd[f"{IN_PROJ}.input_scale"], sd[f"{IN_PROJ}.weight_scale"], sd[f"{IN_PROJ}.weight"]
    xq = quantize_fp8_activation(h, s_in)  # e4m3(clamp(x / input_scale))
    expect = (xq.float() @ w8.float().T) * (s_in * s_w)
    assert torch.allclose(lin(h), expect, rtol=1e-5, atol=1e-5)
    plain = load_into_fresh(sd, "weight-only")[0].get_submodule(IN_PROJ)
    assert not torch.equal(lin(h), plain(h))  # the flag does change the numerics


def test_nvfp4_activation_emulation_equals_w4a4_reference():
    _, sd, _ = exported("NVFP4")
    m, _ = load_into_fresh(sd, "weight-only", emulate_activations=True)
    lin = m.get_submodule(IN_PROJ)
    h = torch.randn(7, 64)
    s_in = sd[f"{IN_PROJ}.input_scale"]
    vals, bscale = ref_nvfp4_quant(h, s_in)
    gs = 1.0 / s_in
    x_dq = (vals.reshape(7, 4, 16) * (bscale / gs).unsqueeze(-1)).reshape(7, 64)
    w = dequantize_nvfp4(sd[f"{IN_PROJ}.weight"], sd[f"{IN_PROJ}.weight_scale"], sd[f"{IN_PROJ}.weight_scale_2"])
    assert torch.allclose(lin(h), x_dq @ w.T, rtol=1e-5, atol=1e-6)


def test_emulation_without_input_scale_is_an_error():
    _, sd, _ = exported("W4A16_NVFP4")
    with pytest.raises(QuantFormatError, match="input_scale: missing"):
        swap_quantized_linears(toy(), sd, "weight-only", emulate_activations=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU error path; a CUDA machine may support it")
def test_native_on_cpu_raises_a_clear_error():
    _, sd, x = exported("FP8")
    m, _ = load_into_fresh(sd, "native")
    with pytest.raises(QuantUnavailableError, match="native FP8 execution requested but unavailable"):
        run(m, x)
    ok, why = native_fp8_support()
    assert not ok and "CUDA" in why


def test_native_nvfp4_is_refused_at_swap_time():
    _, sd, _ = exported("NVFP4")
    with pytest.raises(QuantUnavailableError, match="native NVFP4 GEMM is not implemented"):
        swap_quantized_linears(toy(), sd, "native")


def test_auto_on_cpu_runs_weight_only_and_says_so(caplog):
    _, sd, x = exported("FP8")
    with caplog.at_level(logging.INFO, logger="vl.quant.linear"):
        auto, _ = load_into_fresh(sd, "auto")
        y = run(auto, x)
    ref, _ = load_into_fresh(sd, "weight-only")
    if not torch.cuda.is_available():
        assert torch.equal(y, run(ref, x))
    assert "2 FP8 Linears, auto" in caplog.text


def test_bf16_activations():
    _, sd, x = exported("NVFP4")
    m, _ = load_into_fresh(sd, "weight-only")
    lin = m.get_submodule(IN_PROJ)
    h = torch.randn(3, 64)
    y = lin(h.to(torch.bfloat16))
    assert y.dtype == torch.bfloat16
    assert torch.allclose(y.float(), lin(h), rtol=2e-2, atol=2e-2)


def test_model_mismatch_errors_name_the_module():
    _, sd, _ = exported("NVFP4")
    renamed = {k.replace("layers.0", "layers.5"): v for k, v in sd.items()}
    with pytest.raises(CheckpointError, match="layers.5.mixer.in_proj' but the model has no such module"):
        swap_quantized_linears(toy(), renamed, "weight-only")
    with pytest.raises(CheckpointError, match="in=32, out=64 as in the model, found in=64, out=128"):
        swap_quantized_linears(toy(d=32), sd, "weight-only")  # wrong shapes in the model
    with pytest.raises(ConfigError, match="mode"):
        swap_quantized_linears(toy(), sd, "fast")


def test_dequantize_state_dict_gives_a_plain_state_dict():
    m0, sd, x = exported("NVFP4")
    plain = dequantize_state_dict(sd, dtype=torch.float32)
    assert not any(k.endswith(("weight_scale", "weight_scale_2", "input_scale")) for k in plain)
    m = toy()
    m.load_state_dict(plain, strict=True)
    ref, _ = load_into_fresh(sd, "weight-only")
    assert torch.allclose(run(m, x), run(ref, x), rtol=1e-6, atol=1e-6)
    assert plain["mlp1.1.weight"] is sd["mlp1.1.weight"]  # untouched tensors are passed through


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; CPU-only machine")
def test_native_fp8_matches_weight_only_emulation_on_gpu():
    ok, why = native_fp8_support()
    if not ok:
        pytest.skip(f"native FP8 unavailable: {why}")
    torch.manual_seed(0)
    src = nn.Sequential(nn.Linear(256, 512, bias=True))
    x = torch.randn(33, 256)
    from vl.quant.export import collect_input_amax
    amax = collect_input_amax(src, lambda: src(x))
    sd, _ = export_quantized(src, "FP8", amax, exclude_lm_head=False)
    sd = {k: v.cuda() for k, v in sd.items()}
    native, emul = nn.Sequential(nn.Linear(256, 512)), nn.Sequential(nn.Linear(256, 512))
    swap_quantized_linears(native, sd, "native")
    swap_quantized_linears(emul, sd, "weight-only", emulate_activations=True, compute_dtype=torch.bfloat16)
    xb = x.cuda().to(torch.bfloat16)
    y_native, y_emul = native(xb), emul(xb)
    assert y_native.dtype == torch.bfloat16
    assert torch.allclose(y_native.float(), y_emul.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("algo", ["NVFP4", "FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO"])
def test_row_chunked_dequantize_equals_one_shot(algo, monkeypatch):
    import vl.quant.linear as ql

    src = nn.Sequential(nn.Linear(128, 384, bias=False))
    sd, _ = export_quantized(src, algo, {"0": 1.0}, exclude_lm_head=False)
    q = nn.Sequential(nn.Linear(128, 384, bias=False))
    swap_quantized_linears(q, sd, "weight-only")
    whole = q[0].dequantized_weight(torch.float32)
    monkeypatch.setattr(ql, "DEQUANT_CHUNK_ROWS", 128)  # 3 chunks
    chunked = q[0].dequantized_weight(torch.float32)
    assert torch.equal(whole, chunked)
    name = "0"
    if algo.endswith("NVFP4"):
        ref = dequantize_nvfp4(sd[f"{name}.weight"], sd[f"{name}.weight_scale"], sd[f"{name}.weight_scale_2"])
    else:
        ref = dequantize_fp8(sd[f"{name}.weight"], sd[f"{name}.weight_scale"])
    assert torch.equal(chunked, ref)


@pytest.mark.skipif(not torch._C._dispatch_has_kernel_for_dispatch_key("aten::_scaled_mm", "CPU"),
                    reason="this torch build has no CPU torch._scaled_mm to exercise the native call on")
def test_native_fp8_call_matches_w8a8_emulation_on_cpu_scaled_mm():
    """The GPU fast path's torch._scaled_mm call (layouts, scale_a = input_scale, scale_b = weight_scale),
    exercised through torch's CPU kernel, against the pure-torch W8A8 twin."""
    _, sd, _ = exported("FP8", bias=True)
    m, _ = load_into_fresh(sd, "weight-only", bias=True, emulate_activations=True)
    lin = m.get_submodule(IN_PROJ)
    h = torch.randn(2, 3, 64)
    assert torch.allclose(lin._native(h), lin(h), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("algo", ["NVFP4", "FP8"])
def test_model_to_dtype_keeps_quantized_tensors_and_scales(algo):
    _, sd, x = exported(algo, bias=True)
    m, _ = load_into_fresh(sd, "weight-only", bias=True)
    y32 = run(m, x)
    m.to(torch.bfloat16)
    lin = m.get_submodule(IN_PROJ)
    assert lin.weight.dtype == sd[f"{IN_PROJ}.weight"].dtype  # not cast to BF16
    assert lin.weight_scale.dtype == sd[f"{IN_PROJ}.weight_scale"].dtype
    assert lin.input_scale.dtype == torch.float32
    assert torch.equal(lin.weight_scale.float(), sd[f"{IN_PROJ}.weight_scale"].float())
    assert lin.bias.dtype == torch.bfloat16  # ordinary parameters still follow the requested dtype
    y16 = run(m, x.to(torch.bfloat16))
    assert torch.allclose(y16.float(), y32, rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("algo", ["NVFP4", "FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO"])
@pytest.mark.parametrize("bias", [False, True])
def test_row_chunked_prefill_equals_the_dequantize_mode(algo, bias, monkeypatch):
    """Many-row inputs of a layer taller than DEQUANT_CHUNK_ROWS run one weight row block at a time into its
    output slice (bounded memory at 12B size): the result is the dequantize mode's, to float32 ordering."""
    import vl.quant.linear as ql

    src = nn.Sequential(nn.Linear(128, 384, bias=bias))
    sd, _ = export_quantized(src, algo, {"0": 1.0}, exclude_lm_head=False)
    fast, ref = nn.Sequential(nn.Linear(128, 384, bias=bias)), nn.Sequential(nn.Linear(128, 384, bias=bias))
    swap_quantized_linears(fast, sd, "weight-only", compute_dtype=torch.float32)
    swap_quantized_linears(ref, sd, "dequantize", compute_dtype=torch.float32)
    monkeypatch.setattr(ql, "DEQUANT_CHUNK_ROWS", 128)  # 3 row blocks
    calls = []
    orig = type(fast[0])._dequantized_block
    monkeypatch.setattr(type(fast[0]), "_dequantized_block", lambda self, *a: calls.append(a[:2]) or orig(self, *a))
    x = torch.randn(2, 40, 128)  # 80 rows: above the decode kernel's row limit
    for kernel in ("auto", "off"):  # the packed kernel's expansion, and the torch dequantizers
        monkeypatch.setenv("VL_QUANT_KERNEL", kernel)
        calls.clear()
        with torch.no_grad():
            got, want = fast(x), ref(x)
        assert calls == [(0, 128), (128, 256), (256, 384)]
        assert got.shape == want.shape and torch.allclose(got, want, rtol=1e-5, atol=1e-5)


def test_wide_inputs_take_fewer_weight_rows_per_block(monkeypatch):
    """A row block holds at most DEQUANT_CHUNK_ELEMS weights, in multiples of 128 rows: a 12B down_proj (20480
    inputs) multiplies 384 rows at a time (15 MiB of bf16) instead of 2048 (80 MiB), a 5120-wide layer 1536."""
    import vl.quant.linear as ql

    assert ql.row_block(20480) == 384 and ql.row_block(5120) == 1536 and ql.row_block(1024) == 2048
    assert ql.row_block(10**7) == 128  # never below one scale block
    src = nn.Sequential(nn.Linear(128, 384))
    sd, _ = export_quantized(src, "FP8_PB_WO", {"0": 1.0}, exclude_lm_head=False)
    fast, ref = nn.Sequential(nn.Linear(128, 384)), nn.Sequential(nn.Linear(128, 384))
    swap_quantized_linears(fast, sd, "weight-only", compute_dtype=torch.float32)
    swap_quantized_linears(ref, sd, "dequantize", compute_dtype=torch.float32)
    monkeypatch.setenv("VL_QUANT_KERNEL", "off")  # the torch dequantizers' row blocks (the kernel's: test above)
    monkeypatch.setattr(ql, "DEQUANT_CHUNK_ELEMS", 256 * 128 + 5)  # 256 rows of 128 inputs per block
    calls = []
    orig = type(fast[0]).dequantized_rows
    monkeypatch.setattr(type(fast[0]), "dequantized_rows", lambda self, *a: calls.append(a[:2]) or orig(self, *a))
    x = torch.randn(2, 40, 128)
    with torch.no_grad():
        got, want = fast(x), ref(x)
    assert calls == [(0, 256), (256, 384)]
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("algo", ["NVFP4", "FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO"])
def test_bounded_dequantize_temporaries_give_the_same_bits(algo, monkeypatch):
    """A row block expanded 128 rows at a time (DEQUANT_BLOCK_ELEMS) by the torch dequantizers is the one-shot
    expansion, and a many-row forward through it gives bit-for-bit the same output, as does the packed kernel's
    expansion (one pass over the block)."""
    import vl.quant.linear as ql

    src = nn.Sequential(nn.Linear(128, 384, bias=True))
    sd, _ = export_quantized(src, algo, {"0": 1.0}, exclude_lm_head=False)
    q = nn.Sequential(nn.Linear(128, 384, bias=True))
    swap_quantized_linears(q, sd, "weight-only", compute_dtype=torch.bfloat16)
    x = torch.randn(2, 40, 128).bfloat16()
    monkeypatch.setenv("VL_QUANT_KERNEL", "off")
    with torch.no_grad():
        want, whole = q(x), q[0].dequantized_rows(0, 384, torch.bfloat16)
    monkeypatch.setattr(ql, "DEQUANT_BLOCK_ELEMS", 128 * 128)  # 3 pieces of 128 rows
    calls = []
    orig = type(q[0]).dequantized_rows
    monkeypatch.setattr(type(q[0]), "dequantized_rows", lambda self, *a: calls.append(a[:2]) or orig(self, *a))
    with torch.no_grad():
        got = q(x)
    assert calls == [(0, 128), (128, 256), (256, 384)]
    assert torch.equal(got, want)
    assert torch.equal(q[0]._dequantized_block(0, 384, torch.bfloat16), whole)
    monkeypatch.setenv("VL_QUANT_KERNEL", "auto")
    monkeypatch.setenv("VL_NVFP4_TILES", "off")  # (on AMX tiles 80 bf16 rows would skip the expansion)
    calls.clear()
    with torch.no_grad():
        assert torch.equal(q(x), want)
    assert torch.equal(q[0]._dequantized_block(0, 384, torch.bfloat16), whole)
    assert calls == [] or gemv.kernel() is None  # the kernel expanded them (where it builds)


def test_resident_bytes_count_each_tensors_own_range_and_shared_views_once():
    store = torch.zeros(10_000)  # one storage under two small weights, as in the huge-page arena
    m = torch.nn.Module()
    m.a = torch.nn.Parameter(store[:1000].view(10, 100))
    m.b = torch.nn.Parameter(store[5000:5500])
    m.register_buffer("tied", store[:1000].view(10, 100))  # the same bytes as `a`
    m.register_buffer("col", store[2000:3000].view(100, 10)[:, 0])  # strided: spans 991 floats
    assert resident_weight_bytes(m) == (1000 + 500 + 991) * 4


def test_a_packed_layers_row_blocks_share_one_padded_copy_of_the_rows(monkeypatch):
    """A packed layer wider than one row block (prefill) multiplies the same rows by every block of its expanded
    weight: on the CPU they are padded to the GEMM's rounded row count once for all blocks, not once per block (for
    1831 rows of 20480 inputs each copy cost about half a block's product), and the output is the first rows of the
    padded products, bit for bit."""
    import vl.quant.linear as ql
    from vl.kernels import gemm

    src = nn.Sequential(nn.Linear(128, 384, bias=True))
    sd, _ = export_quantized(src, "FP8", {"0": 1.0}, exclude_lm_head=False)
    q = nn.Sequential(nn.Linear(128, 384, bias=True))
    swap_quantized_linears(q, sd, "weight-only", compute_dtype=torch.bfloat16)
    monkeypatch.setattr(ql, "DEQUANT_BLOCK_ELEMS", 128 * 128)  # 3 row blocks
    x = torch.randn(37, 128).bfloat16()  # 37 rows: past the packed kernel's 16, rounded to 48 for the GEMM
    copies, real = [], gemm._padded
    monkeypatch.setattr(gemm, "_padded", lambda x2, rows, target: copies.append((rows, target)) or real(x2, rows, target))
    with torch.no_grad():
        got = q(x)
    assert [c for c in copies if c[0] != c[1]] == [(37, gemm.rounded_rows(37))]
    w = q[0].dequantized_rows(0, 384, torch.bfloat16)
    padded = torch.cat([x, x.new_zeros(gemm.rounded_rows(37) - 37, 128)])
    want = torch.cat([gemm.linear(padded, w[r0:r1], q[0].bias[r0:r1].bfloat16())
                      for r0, r1 in ((0, 128), (128, 256), (256, 384))], dim=1)[:37]
    assert torch.equal(got, want)
