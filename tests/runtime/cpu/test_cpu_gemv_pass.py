"""Decode-sized bf16 / fp32 Linear products through the fused CPU GEMV (cpu_matmul.gemv_decode_linears) equal
the layer's own forward up to float32 summation order; a cached decode with the pass equals one without."""

import pytest
import torch
from torch import nn

from vl.kernels import gemv
from vl.runtime.cpu import matmul as cpu_matmul


@pytest.fixture()
def kern(tmp_path_factory, monkeypatch):
    """The kernel from one cache directory for the whole run (a fresh one per test rebuilt it each time, 2.5 s)."""
    monkeypatch.setenv("VL_KERNEL_CACHE", str(tmp_path_factory.getbasetemp() / "vl-kernels"))
    gemv._load.cache_clear()
    k = gemv.kernel()
    yield k
    gemv._load.cache_clear()


def _need(k, dtype):
    if k is None:
        pytest.skip("the fused CPU kernel does not build here; layers keep torch's forward")
    if not (k.dense_bf16 if dtype == torch.bfloat16 else k.dense_fp32):
        pytest.skip(f"no fast {dtype} GEMV on this CPU (needs AVX512{'-BF16' if dtype == torch.bfloat16 else ''}); "
                    "the pass leaves these layers alone")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(67, 200), (16, 1024), (3, 5)])
@pytest.mark.parametrize("bias", [False, True])
def test_gemv_equals_the_layers_own_forward(kern, dtype, shape, bias):
    _need(kern, dtype)
    n, k = shape
    lin = nn.Linear(k, n, bias=bias).to(dtype).eval()
    ref = nn.Linear(k, n, bias=bias).to(dtype).eval()
    ref.load_state_dict(lin.state_dict())
    calls = []
    orig = kern.dense
    kern.dense = lambda *a: calls.append(1) or orig(*a)
    try:
        assert cpu_matmul.gemv_decode_linears(lin) == 1
        assert cpu_matmul.gemv_decode_linears(lin) == 0  # applied once
        with torch.no_grad():
            for rows in (1, 2, 5, gemv.MAX_ROWS + 3):  # the last one keeps torch's forward (and 5 with AMX's bf16)
                x = torch.randn(1, rows, k).to(dtype)
                got, want = lin(x), ref(x)
                assert got.dtype == want.dtype and got.shape == want.shape
                tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)
                torch.testing.assert_close(got, want, **tol)
    finally:
        kern.dense = orig
    assert len(calls) == sum(r <= cpu_matmul.gemv_rows(dtype) for r in (1, 2, 5, gemv.MAX_ROWS + 3))


@pytest.mark.parametrize("amx", [True, False])
def test_with_amx_bf16_products_of_more_than_kernel_rows_take_torchs_gemm(kern, monkeypatch, amx):
    """oneDNN's AMX tile GEMM reads the weights once for all rows; the kernel once per 4 rows: with AMX, bf16
    products of 5+ rows keep torch's forward, fp32 ones (and bf16 without AMX) use the kernel up to MAX_ROWS."""
    cpu_matmul.gemv_rows.cache_clear()
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    try:
        assert cpu_matmul.gemv_rows(torch.bfloat16) == (gemv.KERNEL_ROWS if amx else gemv.MAX_ROWS)
        assert cpu_matmul.gemv_rows(torch.float32) == gemv.MAX_ROWS
    finally:
        cpu_matmul.gemv_rows.cache_clear()


def test_autograd_keeps_torchs_forward(kern):
    _need(kern, torch.float32)
    lin = nn.Linear(32, 8)
    cpu_matmul.gemv_decode_linears(lin)
    x = torch.randn(1, 32, requires_grad=True)
    lin(x).sum().backward()
    assert x.grad is not None and lin.weight.grad is not None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cached_decode_with_the_pass_equals_without(kern, dtype):
    _need(kern, dtype)
    from vl.bench.run import CONFIGS
    from vl.modeling.nemotron_h import NemotronHForCausalLM
    from vl.runtime.cache import HybridCache

    cfg = CONFIGS["tiny"]()
    torch.manual_seed(0)
    base = NemotronHForCausalLM(cfg).eval().to(dtype)
    fast = NemotronHForCausalLM(cfg).eval().to(dtype)
    fast.load_state_dict(base.state_dict())
    assert cpu_matmul.gemv_decode_linears(fast) > 0
    ids = torch.randint(3, cfg.vocab_size, (1, 40))
    caches = [HybridCache(cfg, 1, 48, dtype=dtype) for _ in range(2)]
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=5e-2, atol=5e-2)
    with torch.no_grad():
        la = base(ids[:, :32], cache=caches[0]).logits
        lb = fast(ids[:, :32], cache=caches[1]).logits  # 32 rows: torch's forward
        torch.testing.assert_close(lb, la, rtol=0, atol=0)
        for t in range(32, 40):  # one-token steps: the fused GEMV
            la = base(ids[:, t:t + 1], cache=caches[0]).logits.float()
            lb = fast(ids[:, t:t + 1], cache=caches[1]).logits.float()
            torch.testing.assert_close(lb, la, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_relu2_down_proj_stored_by_rows(kern, dtype, monkeypatch, tmp_path):
    """transpose_relu2_down_proj: only the ReLU^2 MLPs' plain down_proj weights are laid out (K, N), the module sees
    the same (N, K) values; its forward (few rows: the skipping kernel; many rows: torch's GEMM on the transposed
    operand) equals the untouched model's; a checkpoint saved from it holds the same tensors; applied once;
    VL_SPARSE_DOWN=0 turns it off."""
    if kern is None or kern.isa != "avx512":
        pytest.skip("the pass needs the AVX512 build of the kernel; without it the weights stay as loaded")
    from vl.bench.run import CONFIGS
    from vl.checkpoint.files import CheckpointFiles, save_tensors
    from vl.modeling.nemotron_h import NemotronHForCausalLM
    from vl.runtime.cache import HybridCache

    cfg = CONFIGS["tiny"]()
    torch.manual_seed(0)
    base = NemotronHForCausalLM(cfg).eval().to(dtype)
    fast = NemotronHForCausalLM(cfg).eval().to(dtype)
    fast.load_state_dict(base.state_dict())
    monkeypatch.setenv("VL_SPARSE_DOWN", "0")
    assert cpu_matmul.transpose_relu2_down_proj(fast) == 0
    assert cpu_matmul.sparse_down_status() == "as stored (VL_SPARSE_DOWN=off)"
    monkeypatch.delenv("VL_SPARSE_DOWN")
    assert cpu_matmul.sparse_down_status().startswith("stored by input rows")
    cpu_matmul.gemv_decode_linears(fast)
    mlps = [b.mixer for b in fast.backbone.layers if b.kind == "-"]
    assert cpu_matmul.transpose_relu2_down_proj(fast) == len(mlps) > 0
    assert cpu_matmul.transpose_relu2_down_proj(fast) == 0  # done once
    for name, p in fast.named_parameters():
        assert cpu_matmul.transposed(p) == name.endswith("down_proj.weight"), name
        assert torch.equal(p, base.get_parameter(name))
    calls = []
    orig = kern.dense_t
    kern.dense_t = lambda *a: calls.append(1) or orig(*a)
    ids = torch.randint(3, cfg.vocab_size, (1, 40))
    caches = [HybridCache(cfg, 1, 48, dtype=dtype) for _ in range(2)]
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=5e-2, atol=5e-2)
    try:
        with torch.no_grad():
            la = base(ids[:, :32], cache=caches[0]).logits
            lb = fast(ids[:, :32], cache=caches[1]).logits  # 32 rows: torch's GEMM with the (K, N) operand
            torch.testing.assert_close(lb.float(), la.float(), **tol)
            assert not calls
            for t in range(32, 40):  # one-token steps through the modules: the skipping kernel
                la = base(ids[:, t:t + 1], cache=caches[0]).logits.float()
                lb = fast(ids[:, t:t + 1], cache=caches[1]).logits.float()
                torch.testing.assert_close(lb, la, **tol)
    finally:
        kern.dense_t = orig
    assert len(calls) == 8 * len(mlps)
    save_tensors(fast.state_dict(), tmp_path)  # the saver writes contiguous tensors
    saved = CheckpointFiles(tmp_path).load_all()
    assert all(torch.equal(saved[k], v) for k, v in base.state_dict().items())
