"""The fused CPU FP8 / NVFP4 kernel against its twins: the pure-torch reference GEMV and the dequantize mode.

Both builds run where they can: the native one (AVX512 intrinsics on CPUs that have them, the plain C++ path
elsewhere) and the portable one (plain C++ forced). Equality is to float32 accumulation-order noise: the
kernel rebuilds bit-identical weights, only the order of the additions differs.
"""

import logging

import pytest
import torch
import torch.nn as nn

from vl.kernels import gemm, gemv, loader
from vl.quant import gemv_ref
from vl.quant.fp8 import quantize_fp8_blockwise, quantize_fp8_per_channel, quantize_fp8_per_tensor
from vl.quant.linear import resident_weight_bytes, swap_quantized_linears
from vl.quant.nvfp4 import quantize_nvfp4

FP8_QUANT = {"tensor": quantize_fp8_per_tensor, "channel": quantize_fp8_per_channel, "block": quantize_fp8_blockwise}


def _build(tmp_path_factory, folder: str, variants: dict) -> dict:
    """{name: Kernel} of `loader.build(SOURCE, **kwargs)` for each variant, into a fresh test cache; skips when no
    compiler works."""
    cache = tmp_path_factory.mktemp(folder)
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VL_KERNEL_CACHE", str(cache))
        for name, kwargs in variants.items():
            try:
                out[name] = gemv.Kernel(loader.build(gemv.SOURCE, **kwargs))
            except Exception as e:  # noqa: BLE001
                pytest.skip(f"the fused kernel does not build here ({e}); the reference path is what runs")
    return out


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    """{'native': Kernel, 'portable': Kernel}, built once into a test cache."""
    return _build(tmp_path_factory, "kernels", {"native": {}, "portable": {"portable": True}})


def _which(kernels, build):
    k = kernels[build]
    if build == "native" and k.isa != "avx512":
        pytest.skip("this CPU has no AVX512 (F/BW/VL): the native build is the portable path, tested as 'portable'")
    return k


def _close(got, ref, bf16_out=False):
    scale = ref.abs().max().clamp(min=1e-30)
    tol = 2e-6 if not bf16_out else 1e-2
    assert float((got.double() - ref.double()).abs().max() / scale) < tol


@pytest.mark.parametrize("build", ["native", "portable"])
@pytest.mark.parametrize("kind,shape", [("tensor", (37, 200)), ("tensor", (5, 7)), ("channel", (129, 72)),
                                        ("channel", (16, 1000)), ("block", (256, 384))])
@pytest.mark.parametrize("rows", [1, 3, 6])
@pytest.mark.parametrize("act", ["fp32", "bf16"])
def test_fp8_kernel_equals_reference_gemv(kernels, build, kind, shape, rows, act):
    k = _which(kernels, build)
    n, kin = shape
    w8, s = FP8_QUANT[kind](torch.randn(n, kin) * 0.05)
    # plant subnormal and extreme codes: 0x01..0x07 (subnormals), 0x7E (448), their negatives
    w8.view(torch.uint8)[0, : min(kin, 16)] = torch.tensor([1, 2, 3, 7, 8, 0x7E, 0x81, 0x87, 0xFE, 0, 0x80, 0x40,
                                                            0x38, 0x39, 0x3F, 0x47], dtype=torch.uint8)[: min(kin, 16)]
    x = torch.randn(rows, kin)
    if act == "bf16":
        x = x.bfloat16()
    got = k.fp8(x, w8, s.contiguous(), kind, act == "bf16")
    _close(got, gemv_ref.fp8_gemv_ref(x, w8, s, act == "bf16"))


@pytest.mark.parametrize("build", ["native", "portable"])
@pytest.mark.parametrize("shape", [(37, 208), (1, 16), (130, 48), (64, 1024), (19, 96), (3, 176)])
@pytest.mark.parametrize("rows", [1, 2, 5])
@pytest.mark.parametrize("act", ["fp32", "bf16"])
def test_nvfp4_kernel_equals_reference_gemv(kernels, build, shape, rows, act):
    k = _which(kernels, build)
    n, kin = shape
    packed, bs, gs = quantize_nvfp4(torch.randn(n, kin) * 0.05)
    bs.view(torch.uint8)[0, 0] = 0x01  # the smallest E4M3 subnormal block scale
    x = torch.randn(rows, kin)
    if act == "bf16":
        x = x.bfloat16()
    got = k.nvfp4(x, packed, bs, float(gs), act == "bf16")
    _close(got, gemv_ref.nvfp4_gemv_ref(x, packed, bs, gs, act == "bf16"))


@pytest.fixture(scope="module")
def nvfp4_loops(tmp_path_factory):
    """The native build twice, with each NVFP4 loop for bf16 activations forced (-DVL_NVFP4_FMA=1 | 0): a CPU
    picks one of them at compile time (AMX or not), and both must hold wherever they run."""
    return _build(tmp_path_factory, "kernels_loops", {"fma": {"defines": ("VL_NVFP4_FMA=1",)},
                                                      "dot": {"defines": ("VL_NVFP4_FMA=0",)}})


@pytest.mark.parametrize("loop", ["fma", "dot"])
@pytest.mark.parametrize("shape", [(37, 208), (130, 48), (19, 1024), (2, 16)])
@pytest.mark.parametrize("rows", [1, 3, 6])
def test_both_nvfp4_bf16_loops_equal_the_reference(nvfp4_loops, loop, shape, rows):
    k = nvfp4_loops[loop]
    if k.isa != "avx512":
        pytest.skip("this CPU has no AVX512 (F/BW/VL): only the portable NVFP4 loop exists here")
    if loop == "dot" and not k.bf16_dot:
        pytest.skip("the VDPBF16PS table loop needs AVX512-BF16 and AVX512-VBMI, which this CPU lacks")
    assert k.nvfp4_loop == {"fma": "vpermps + fma", "dot": "vdpbf16ps table"}[loop]  # the define took effect
    n, kin = shape
    packed, bs, gs = quantize_nvfp4(torch.randn(n, kin) * 0.05)
    bs.view(torch.uint8)[0, 0] = 0x01  # the smallest E4M3 subnormal block scale
    x = torch.randn(rows, kin).bfloat16()
    x[0, :3] = torch.tensor([1e-39, -3e-40, 0.0]).bfloat16()  # subnormal activations: exact in the FMA loop
    got = k.nvfp4(x, packed, bs, float(gs), True)
    _close(got, gemv_ref.nvfp4_gemv_ref(x, packed, bs, gs, True))
    # float32 activations take the FMA loop in both builds
    xf = torch.randn(rows, kin)
    _close(k.nvfp4(xf, packed, bs, float(gs), False), gemv_ref.nvfp4_gemv_ref(xf, packed, bs, gs, False))


@pytest.mark.parametrize("build", ["native", "portable"])
@pytest.mark.parametrize("act", ["fp32", "bf16"])
def test_one_thread_and_several_give_the_same_bits(kernels, build, act):
    """Output rows are split between OpenMP threads, each row computed whole by one thread; one thread runs a plain
    loop. Either way the same bits, for every format."""
    k = _which(kernels, build)
    w = torch.randn(70, 256) * 0.05
    w8, s = quantize_fp8_per_tensor(w)
    packed, bs, gs = quantize_nvfp4(w)
    x = torch.randn(3, 256)
    x = x.bfloat16() if act == "bf16" else x
    dense_w = w.to(x.dtype)
    threads, got = torch.get_num_threads(), []
    try:
        for n in (1, 3):
            torch.set_num_threads(n)
            got.append([k.fp8(x, w8, s.contiguous(), "tensor", act == "bf16"),
                        k.nvfp4(x, packed, bs, float(gs), act == "bf16"), k.dense(x, dense_w)])
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(*got):
        assert torch.equal(a, b)


@pytest.mark.parametrize("build", ["native", "portable"])
@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
@pytest.mark.parametrize("act", ["fp32", "bf16"])
def test_tiny_scales_whose_weights_are_float32_subnormal(kernels, build, fmt, act):
    """Scales so small that some weights are float32 subnormals: the vector bf16 conversion would flush them to
    zero, so those table rows (NVFP4) or layers (FP8) take the exact scalar rounding; the result still equals
    the reference's."""
    k = _which(kernels, build)
    n, kin = 40, 336  # 5 groups of 64 + a 16-column tail
    x = torch.randn(2, kin)
    if act == "bf16":
        x = x.bfloat16()
    if fmt == "fp8":
        w8, _ = quantize_fp8_per_tensor(torch.randn(n, kin))
        s = torch.tensor(2.0 ** -136)  # |w8| ~ 2^-6..448 times 2^-136: nearly all below 2^-126, subnormal
        got = k.fp8(x, w8, s, "tensor", act == "bf16")
        ref = gemv_ref.fp8_gemv_ref(x, w8, s, act == "bf16")
    else:
        packed, bs, _ = quantize_nvfp4(torch.randn(n, kin))
        gs = torch.tensor(2.0 ** -140)  # |E2M1| x block scale <= 6 x 448 ~ 2^11.4: nearly all below 2^-126
        got = k.nvfp4(x, packed, bs, float(gs), act == "bf16")
        ref = gemv_ref.nvfp4_gemv_ref(x, packed, bs, gs, act == "bf16")
    assert ref.abs().max() > 0
    # subnormal sums: accumulation-order noise is absolute (2^-149 per addition, 336 terms); weights flushed
    # to zero would lose most of each sum
    assert float((got.double() - ref.double()).abs().max()) <= 2e-6 * float(ref.abs().max()) + 336 * 2.0 ** -149


def _one_linear_sd(fmt, n, kin, bias, kind="tensor"):
    w = torch.randn(n, kin) * 0.05
    if fmt == "fp8":
        w8, s = FP8_QUANT[kind](w)
        sd = {"proj.weight": w8, "proj.weight_scale": s}
    else:
        p, bs, gs = quantize_nvfp4(w)
        sd = {"proj.weight": p, "proj.weight_scale": bs, "proj.weight_scale_2": gs}
    if bias:
        sd["proj.bias"] = torch.randn(n).bfloat16()
    return sd


def _model(sd, mode, dtype, n, kin, bias):
    m = nn.ModuleDict({"proj": nn.Linear(kin, n, bias=bias)})
    rep = swap_quantized_linears(m, sd, mode, compute_dtype=dtype)
    assert set(rep.modules) == {"proj"}
    return m.to(dtype) if mode == "dequantize" else m


@pytest.mark.parametrize("fmt,kind,shape", [("fp8", "tensor", (67, 200)), ("fp8", "channel", (33, 96)),
                                            ("fp8", "block", (128, 256)), ("nvfp4", None, (67, 208))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_weight_only_decode_equals_dequantize_mode(kernels, monkeypatch, fmt, kind, shape, dtype, bias):
    """The user-facing twin: a weight-only layer on decode-sized inputs (fused kernel) against the same
    checkpoint loaded in dequantize mode (plain Linear in the compute dtype)."""
    monkeypatch.setenv("VL_KERNEL_CACHE", str(kernels["native"].path.parent))
    gemv._load.cache_clear()
    n, kin = shape
    sd = _one_linear_sd(fmt, n, kin, bias, kind or "tensor")
    fast = _model(sd, "weight-only", dtype, n, kin, bias)
    ref = _model(sd, "dequantize", dtype, n, kin, bias)
    calls = []
    orig = type(fast["proj"])._fused_gemv
    monkeypatch.setattr(type(fast["proj"]), "_fused_gemv",
                        lambda self, *a: calls.append(1) or orig(self, *a))
    before = resident_weight_bytes(fast)
    for rows in (1, 4, 9):
        x = torch.randn(2, rows, kin).to(dtype)[:1]  # a batch of one, decode-sized
        with torch.no_grad():
            got, want = fast["proj"](x), ref["proj"](x)
        assert got.dtype == want.dtype == dtype and got.shape == want.shape
        # bf16 outputs: both are the same float32 sums rounded once to bf16, so they differ by at most one
        # bf16 step where the float32 sums straddle a rounding boundary
        _close(got.float(), want.float(), bf16_out=dtype == torch.bfloat16)
    assert calls, "decode-sized inputs should have taken the fused kernel"
    assert resident_weight_bytes(fast) == before  # nothing cached beside the packed weights


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_sized_inputs_take_the_reference_path(kernels, monkeypatch, dtype):
    """Past `MAX_ROWS` rows (past `TILE_MAX_ROWS` for bf16 NVFP4 rows on AMX tiles) the layer expands its weights and
    runs a GEMM; bf16 rows in between take the tiles where this CPU has them."""
    monkeypatch.setenv("VL_KERNEL_CACHE", str(kernels["native"].path.parent))
    gemv._load.cache_clear()
    kern = gemv.kernel()
    calls = []
    monkeypatch.setattr(kern.lib, "vl_nvfp4_gemv", lambda *a: calls.append(a[1]))
    sd = _one_linear_sd("nvfp4", 32, 64, False)
    fast = _model(sd, "weight-only", dtype, 32, 64, False)
    tiles = dtype == torch.bfloat16 and kern.packed_tiles and kern.bf16_dot
    limit = gemv.TILE_MAX_ROWS if tiles else gemv.MAX_ROWS
    fast["proj"](torch.randn(limit + 1, 64, dtype=dtype))
    assert calls == []
    fast["proj"](torch.randn(gemv.MAX_ROWS + 1, 64, dtype=dtype))
    assert calls == ([gemv.MAX_ROWS + 1] if tiles else [])


def test_fp8_nan_codes_fall_back_to_the_reference(kernels, monkeypatch):
    """E4M3 0x7F is NaN; the SIMD decode does not produce NaN, so such a layer runs the reference (NaN out)."""
    monkeypatch.setenv("VL_KERNEL_CACHE", str(kernels["native"].path.parent))
    gemv._load.cache_clear()
    sd = _one_linear_sd("fp8", 16, 32, False)
    sd["proj.weight"].view(torch.uint8)[3, 5] = 0x7F
    m = _model(sd, "weight-only", torch.float32, 16, 32, False)
    y = m["proj"](torch.randn(1, 32))
    assert torch.isnan(y[0, 3]) and not torch.isnan(y[0, :3]).any()


def test_falls_back_with_a_logged_reason_when_the_kernel_cannot_build(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("VL_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "/bin/false")
    gemv._load.cache_clear()
    gemv._warn_once.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="vl.kernels.gemv"):
            assert gemv.kernel() is None
        assert "unavailable" in caplog.text and "/bin/false failed" in caplog.text
        sd = _one_linear_sd("fp8", 16, 32, True)
        fast = _model(sd, "weight-only", torch.float32, 16, 32, True)
        ref = _model(sd, "dequantize", torch.float32, 16, 32, True)
        x = torch.randn(1, 32)
        with torch.no_grad():  # the reference path: the dequantized weight through the same GEMM (vl/kernels/gemm.py)
            assert torch.equal(fast["proj"](x), gemm.linear(x, ref["proj"].weight, ref["proj"].bias))
    finally:
        gemv._load.cache_clear()


def test_off_switch(monkeypatch):
    monkeypatch.setenv("VL_QUANT_KERNEL", "off")
    assert gemv.kernel() is None
    assert "VL_QUANT_KERNEL=off" in gemv.status()



def test_a_layer_rebinds_its_kernel_call_when_its_tensors_change_in_place(kernels, monkeypatch):
    """The bound kernel call (pointers, global scale, NaN check) is cached per layer; an in-place change of a
    tensor (load_state_dict copies into the buffers) bumps its version, so the next call sees the new values."""
    monkeypatch.setenv("VL_KERNEL_CACHE", str(kernels["native"].path.parent))
    gemv._load.cache_clear()
    sd = _one_linear_sd("nvfp4", 32, 64, False)
    fast = _model(sd, "weight-only", torch.float32, 32, 64, False)
    x = torch.randn(1, 64)
    with torch.no_grad():
        fast["proj"](x)
        fast["proj"].weight_scale_2.mul_(2.0)  # the global scale is bound as a float: must be re-read
        want = gemv_ref.nvfp4_gemv_ref(x, fast["proj"].weight, fast["proj"].weight_scale, fast["proj"].weight_scale_2,
                                       False)
        _close(fast["proj"](x), want)
    sd8 = _one_linear_sd("fp8", 16, 32, False)
    fp8 = _model(sd8, "weight-only", torch.float32, 16, 32, False)
    with torch.no_grad():
        fp8["proj"](torch.randn(1, 32))
        fp8["proj"].weight.view(torch.uint8)[3, 5] = 0x7F  # a NaN code written after the first call
        y = fp8["proj"](torch.randn(1, 32))
    assert torch.isnan(y[0, 3]) and not torch.isnan(y[0, :3]).any()


def _relu2_rows(m, k, seed=0):
    """Activation rows as a ReLU^2 down_proj sees them: about half exact zeros, one row all zero, one column
    non-zero in only one row (so the batch's union of non-zero inputs differs from each row's own)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).relu().square()
    if m > 2:
        x[1] = 0
        x[:, -1] = 0
        x[2, -1] = 0.75
    return x


@pytest.mark.parametrize("build", ["native", "portable"])
@pytest.mark.parametrize("shape", [(37, 200), (1024, 96), (40, 52), (16, 3), (130, 7)])  # (N, K): tails, N < 16
@pytest.mark.parametrize("rows", [1, 3, 6, 9])  # more than 4: the column-block loop (y in registers)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_transposed_sparse_gemv_equals_the_product(kernels, build, shape, rows, dtype):
    """`dense_t` (a weight stored (K, N), rows of zero inputs skipped) against the float64 product of the same
    values: float32 accumulation-order noise only; every row equals that row computed alone, bit for bit."""
    k = _which(kernels, build)
    n, kin = shape
    w = (torch.randn(n, kin, generator=torch.Generator().manual_seed(1)) * 0.05).to(dtype)
    x = _relu2_rows(rows, kin).to(dtype).float()  # model-dtype values, as float32 (what the step passes)
    got = k.dense_t(x, w.t().contiguous())
    assert got.dtype == torch.float32 and got.shape == (rows, n)
    _close(got, x.double() @ w.double().t())
    for r in range(rows):
        assert torch.equal(k.dense_t(x[r:r + 1].contiguous(), w.t().contiguous()), got[r:r + 1])


@pytest.mark.parametrize("build", ["native", "portable"])
def test_transposed_sparse_gemv_same_bits_on_any_thread_count_and_all_zero_input(kernels, build):
    """The columns are split between threads, each output summed whole by one: the same bits on 1 and 3 threads.
    An all-zero input reads no weight row and gives exact zeros."""
    k = _which(kernels, build)
    wt = (torch.randn(300, 1040) * 0.05).bfloat16()
    for rows in (4, 8):
        x = _relu2_rows(rows, 300, seed=2).bfloat16().float()
        threads, got = torch.get_num_threads(), []
        try:
            for n in (1, 3):
                torch.set_num_threads(n)
                got.append(k.dense_t(x, wt))
        finally:
            torch.set_num_threads(threads)
        assert torch.equal(got[0], got[1])
        assert torch.equal(k.dense_t(torch.zeros(rows, 300), wt), torch.zeros(rows, 1040))


@pytest.mark.parametrize("build", ["native", "portable", "fma", "dot"])
@pytest.mark.parametrize("shape", [(37, 208), (130, 48), (64, 1024)])
@pytest.mark.parametrize("groups,shared", [(1, True), (3, True), (6, False), (2, False)])
@pytest.mark.parametrize("act", ["fp32", "bf16"])
def test_nvfp4_group_equals_each_layer_alone(kernels, nvfp4_loops, build, shape, groups, shared, act):
    """A MoE layer's experts in one call (`nvfp4_group`): group g's row is bit for bit the one-layer call's, with
    one activation row for every group (up projections) or a row each (down projections), each group its own global
    scale (one of them small enough that the bf16 table path must not take it), on 1 and 2 threads."""
    k = {**kernels, **nvfp4_loops}[build]
    if build in ("fma", "dot") and k.isa != "avx512":
        pytest.skip("this CPU has no AVX512 (F/BW/VL): only the portable NVFP4 loop exists here")
    n, kin = shape
    layers = [quantize_nvfp4(torch.randn(n, kin) * 0.05 * (g + 1)) for g in range(groups)]
    if groups > 1:  # a global scale whose least weight is not a normal bf16: the whole group takes the fp32 table
        layers[-1] = (layers[-1][0], layers[-1][1], torch.tensor(1e-37))
    x = torch.randn(1 if shared else groups, kin)
    if act == "bf16":
        x = x.bfloat16()
    rows = [0] * groups if shared else list(range(groups))
    old = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            got = k.nvfp4_group(x, rows, [p.data_ptr() for p, _, _ in layers], [s.data_ptr() for _, s, _ in layers],
                                [float(gs) for _, _, gs in layers], n, act == "bf16")
            assert got.shape == (groups, n)
            for g, (p, s, gs) in enumerate(layers):
                want = k.nvfp4(x[rows[g]:rows[g] + 1], p, s, float(gs), act == "bf16")
                assert torch.equal(got[g:g + 1], want), (g, threads)
    finally:
        torch.set_num_threads(old)


def _nvfp4_raw(k, x, packed, bs, gs, tiles: int) -> torch.Tensor:
    """One `vl_nvfp4_gemv` call on all rows of bf16 x with `tiles` as given (the Python rule bypassed)."""
    m, kin = x.shape
    y = torch.empty(m, packed.shape[0])
    k.lib.vl_nvfp4_gemv(x.data_ptr(), m, kin, packed.data_ptr(), bs.data_ptr(), float(gs), packed.shape[0], 1, 1,
                        tiles, y.data_ptr(), torch.get_num_threads())
    return y


def _tiled(kernels):
    k = kernels["native"]
    if not (k.packed_tiles and k.bf16_dot):
        pytest.skip("no AMX tiles here (AMX-BF16 and the kernel's bf16 activations): NVFP4 rows keep their loops")
    return k


@pytest.mark.parametrize("shape", [(37, 208), (130, 48), (64, 1024), (19, 96), (16, 16), (5, 2048), (20, 12352)])
def test_nvfp4_rows_on_tiles_equal_the_reference_with_the_same_bits_in_every_row_count(kernels, shape):
    """NVFP4 on AMX tiles (row_kernels.h nvfp4_rows_amx; past one slab of rows nvfp4_rows_amx_many, which rebuilds
    the weights once per call and multiplies in K-blocks): row counts from 1 to 200 (a B tile per 16 rows, a second
    slab past 64, a last slab of 8 rows at 200) give each row the bits of that row alone on tiles, and the
    reference's sums within float32 noise; odd block counts (K = 208, 48, 16), weight rows past the last whole 16
    (N = 37, 130, 19, 5, 20) and 32-row slabs (K = 12352) included, with a subnormal block scale, on 1 and 2 threads.
    The tiles sum in another order than the float32 loop, so on the widest layer the two differ somewhere: the call
    took the tiles."""
    k = _tiled(kernels)
    n, kin = shape
    packed, bs, gs = quantize_nvfp4(torch.randn(n, kin) * 0.05)
    bs.view(torch.uint8)[0, 0] = 0x01  # the smallest E4M3 subnormal block scale
    x = torch.randn(200, kin).bfloat16()
    ref = gemv_ref.nvfp4_gemv_ref(x, packed, bs, gs, True)
    old = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            alone = torch.cat([_nvfp4_raw(k, x[i:i + 1], packed, bs, gs, 1) for i in range(200)])
            _close(alone, ref)
            for m in (2, 3, 16, 17, 33, 48, 63, 64, 65, 70, 129, 200):
                assert torch.equal(_nvfp4_raw(k, x[:m], packed, bs, gs, 1), alone[:m]), (m, threads)
    finally:
        torch.set_num_threads(old)
    if kin == 2048:
        assert not torch.equal(alone, _nvfp4_raw(k, x, packed, bs, gs, 0))


@pytest.mark.parametrize("rule", ["auto", "on", "off"])
def test_the_tile_rule_picks_the_path_by_row_count_alone(kernels, monkeypatch, rule):
    """`VL_NVFP4_TILES` as a quantized Linear's bound call reads it: auto takes tiles for calls of
    `gemv.TILE_FROM_ROWS` rows or more (fewer keep the float32 loop), on for every call, off for none; a row's bits
    then depend on the rule and on its call's row count, never on the other rows. A layer whose least weight is not
    a normal bf16 keeps the loop."""
    k = _tiled(kernels)
    monkeypatch.setenv("VL_NVFP4_TILES", rule)
    packed, bs, gs = quantize_nvfp4(torch.randn(48, 2048) * 0.05)
    x = torch.randn(9, 2048).bfloat16()
    call = k.nvfp4_layer(packed, bs, float(gs))
    counts = (1, gemv.TILE_FROM_ROWS - 1, gemv.TILE_FROM_ROWS, 9)
    for m in counts:
        tiled = rule == "on" or (rule == "auto" and m >= gemv.TILE_FROM_ROWS)
        assert torch.equal(call(x[:m], True), _nvfp4_raw(k, x[:m], packed, bs, gs, int(tiled))), m
    prompt = torch.randn(100, 2048).bfloat16()  # a short prompt's rows: tiles too (auto, on), in one call
    want = _nvfp4_raw(k, prompt, packed, bs, gs, int(rule != "off"))
    assert torch.equal(call(prompt, True), want)
    _close(want, gemv_ref.nvfp4_gemv_ref(prompt, packed, bs, gs, True))
    tiny = torch.tensor(1e-37)  # weights below the normal bf16 range: the tiles would flush them
    assert torch.equal(k.nvfp4_layer(packed, bs, float(tiny))(x, True), _nvfp4_raw(k, x, packed, bs, tiny, 0))


@pytest.mark.parametrize("build", ["native", "portable"])
@pytest.mark.parametrize("fmt,kind,shape", [("nvfp4", None, (37, 208)), ("nvfp4", None, (300, 64)),
                                            ("fp8", "tensor", (37, 200)), ("fp8", "channel", (129, 72)),
                                            ("fp8", "block", (384, 256))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_expanded_rows_equal_the_reference_dequantizers(kernels, build, fmt, kind, shape, dtype):
    """The prefill path's expansion (`nvfp4_expand`, `fp8_expand`): every weight bit for bit what the torch
    dequantizers give (NaN where they give NaN), NaN codes and subnormal scales included, for whole layers and row ranges from a multiple of
    128 to an odd end, on 1 and 2 threads."""
    from vl.quant.fp8 import dequantize_fp8
    from vl.quant.nvfp4 import dequantize_nvfp4

    k = _which(kernels, build)
    n, kin = shape
    w = torch.randn(n, kin) * 0.05
    if fmt == "nvfp4":
        packed, bs, gs = quantize_nvfp4(w)
        bs.view(torch.uint8)[0, 0] = 0x01  # the smallest E4M3 subnormal block scale
        bs.view(torch.uint8)[1, 1] = 0x7F  # a NaN block scale
        want = dequantize_nvfp4(packed, bs, gs, dtype)
        run = lambda r0, r1: k.nvfp4_expand(packed, bs, float(gs), r0, r1, dtype)  # noqa: E731
    else:
        w8, s = FP8_QUANT[kind](w)
        w8.view(torch.uint8)[0, :3] = torch.tensor([0x7F, 0xFF, 0x01], dtype=torch.uint8)  # NaN codes, a subnormal
        want = dequantize_fp8(w8, s, dtype)
        scale = s.float().contiguous()
        run = lambda r0, r1: k.fp8_expand(w8, scale, kind, r0, r1, dtype)  # noqa: E731
    old = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for r0, r1 in ((0, n), (0, 1), (128, n) if n > 128 else (0, n - 1), (0, n - 2 if n > 2 else n)):
                got = run(r0, r1)
                assert got.dtype == dtype and got.shape == (r1 - r0, kin)
                torch.testing.assert_close(got, want[r0:r1], rtol=0, atol=0, equal_nan=True)  # NaN where it is NaN
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("build", ["native", "portable"])
@pytest.mark.parametrize("kind,shape", [("tensor", (37, 200)), ("channel", (129, 72)), ("block", (256, 384))])
@pytest.mark.parametrize("groups,shared", [(1, True), (3, True), (4, False)])
@pytest.mark.parametrize("act", ["fp32", "bf16"])
def test_fp8_group_equals_each_layer_alone(kernels, build, kind, shape, groups, shared, act):
    """`fp8_group`, as `nvfp4_group`: group g's row bit for bit the one-layer call's, each group its own scales (one
    of them small enough that its bf16 table would not be exact, so that group alone takes the float32 loop)."""
    k = _which(kernels, build)
    n, kin = shape
    layers = [FP8_QUANT[kind](torch.randn(n, kin) * 0.05 * (g + 1)) for g in range(groups)]
    if groups > 1:
        layers[-1] = (layers[-1][0], layers[-1][1] * 1e-34)
    scales = [s.float().contiguous() for _, s in layers]
    x = torch.randn(1 if shared else groups, kin)
    if act == "bf16":
        x = x.bfloat16()
    rows = [0] * groups if shared else list(range(groups))
    old = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            got = k.fp8_group(x, rows, [w.data_ptr() for w, _ in layers], [s.data_ptr() for s in scales], kind, n,
                              act == "bf16")
            assert got.shape == (groups, n)
            for g, (w, _) in enumerate(layers):
                want = k.fp8(x[rows[g]:rows[g] + 1], w, scales[g], kind, act == "bf16")
                assert torch.equal(got[g:g + 1], want), (g, threads)
    finally:
        torch.set_num_threads(old)
