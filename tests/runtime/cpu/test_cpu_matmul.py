"""16-bit matmuls computed in fp32 on CPUs without native 16-bit GEMM (vl/runtime/cpu/matmul.py)."""

import pytest
import torch
from torch import nn

from vl.runtime.cpu import matmul as cpu_matmul


def _operands(m, k=64, n=96, dtype=torch.bfloat16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, m, k, generator=gen).to(dtype)
    w = (torch.randn(n, k, generator=gen) * 0.1).to(dtype)
    b = torch.randn(n, generator=gen).to(dtype)
    return x, w, b


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_linear_fp32_is_the_fp32_product_rounded_once(dtype, monkeypatch):
    x, w, b = _operands(16, dtype=dtype)
    want = nn.functional.linear(x.float(), w.float(), b.float()).to(dtype)
    torch.testing.assert_close(cpu_matmul.linear_fp32(x, w, b), want, rtol=0, atol=0)
    monkeypatch.setattr(cpu_matmul, "BLOCK_ELEMS", 64 * 7)  # 7 output rows per block: 14 blocks, a ragged last
    got = cpu_matmul.linear_fp32(x, w, b)
    assert got.dtype == dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=2 ** -7, atol=1e-6)  # at most a rounding step apart


def test_linear_fp32_agrees_with_the_native_16bit_gemm():
    x, w, b = _operands(32)
    native = nn.functional.linear(x, w, b).float()
    got = cpu_matmul.linear_fp32(x, w, b).float()
    assert (got - native).abs().max() <= 2 ** -7 * native.abs().max()


def test_routing_only_16bit_cpu_linears_and_only_for_enough_rows(monkeypatch):
    monkeypatch.setattr(cpu_matmul, "native_16bit", lambda dtype: False)
    model = nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 8)).to(torch.bfloat16)
    assert cpu_matmul.upcast_16bit_matmuls(model) == 2
    assert cpu_matmul.upcast_16bit_matmuls(nn.Linear(4, 4)) == 0  # fp32 weights: nothing to do
    lin = model[0]
    few, _, _ = _operands(1)  # 2 rows < MIN_ROWS: the plain 16-bit product, bit for bit
    torch.testing.assert_close(lin(few), nn.functional.linear(few, lin.weight, lin.bias), rtol=0, atol=0)
    many, _, _ = _operands(16)
    torch.testing.assert_close(lin(many), cpu_matmul.linear_fp32(many, lin.weight, lin.bias), rtol=0, atol=0)
    monkeypatch.setattr(cpu_matmul, "native_16bit", lambda dtype: True)
    assert cpu_matmul.upcast_16bit_matmuls(nn.Linear(4, 4).to(torch.bfloat16)) == 0  # native GEMM: left alone


def _upcast(m):
    """Whether the 16-bit upcast forward is installed (directly, or under the decode GEMV pass)."""
    fwd = vars(m).get("_vl_dense_forward", vars(m).get("forward"))
    return getattr(fwd, "__func__", None) is cpu_matmul._forward


def test_a_bf16_model_loaded_with_routing_matches_the_native_path(tmp_path, monkeypatch):
    import vl
    from tiny_models import save_hf_nemotron

    path, _ = save_hf_nemotron(tmp_path, "hybrid")
    ids = torch.randint(0, 64, (1, 40), generator=torch.Generator().manual_seed(0))
    monkeypatch.setattr(cpu_matmul, "native_16bit", lambda dtype: False)
    routed = vl.load_pretrained(path, dtype=torch.bfloat16)
    assert any(type(m) is nn.Linear and _upcast(m) for m in routed.modules())
    monkeypatch.setattr(cpu_matmul, "native_16bit", lambda dtype: True)
    native = vl.load_pretrained(path, dtype=torch.bfloat16)
    assert not any(_upcast(m) for m in native.modules() if type(m) is nn.Linear)
    with torch.no_grad():
        a, b = routed(ids).logits.float(), native(ids).logits.float()
    assert (a - b).abs().max() <= 0.05 * b.abs().max()  # bf16 rounding through a few layers
