"""vl/kernels/gemm.py: fp32 products through oneDNN where torch's MKL is slow, equal to `F.linear` within fp32
accumulation order and batch-invariant (a row's bits do not depend on the other rows); the choice, its switch
and the cases that must stay on `F.linear`."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vl.errors import ConfigError
from vl.kernels import gemm as cpu_gemm

ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


@pytest.fixture
def choice(monkeypatch):
    """Set VL_CPU_GEMM for one test (use_onednn is cached per process)."""
    def set_(value):
        monkeypatch.setenv("VL_CPU_GEMM", value)
        cpu_gemm.use_onednn.cache_clear()
    yield set_
    monkeypatch.delenv("VL_CPU_GEMM", raising=False)
    cpu_gemm.use_onednn.cache_clear()


def _count_onednn_calls(monkeypatch) -> list:
    used = []
    real = torch.ops.mkldnn._linear_pointwise

    class Ops:  # stands in for torch.ops.mkldnn inside cpu_gemm, counting calls
        _linear_pointwise = staticmethod(lambda *a: used.append(1) or real(*a))

    monkeypatch.setattr(cpu_gemm.torch.ops, "mkldnn", Ops, raising=False)
    return used


@pytest.mark.skipif(not ONEDNN, reason="this torch build has no oneDNN linear op")
@pytest.mark.parametrize("shape,bias", [((64, 96), True), ((2, 40, 96), False), ((3, 17, 96), True)])
def test_onednn_linear_equals_f_linear(choice, shape, bias):
    choice("onednn")
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(*shape, generator=gen), torch.randn(48, 96, generator=gen)
    b = torch.randn(48, generator=gen) if bias else None
    with torch.no_grad():
        got, want = cpu_gemm.linear(x, w, b), F.linear(x, w, b)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    xt = torch.randn(96, 64, generator=gen).t()  # non-contiguous rows
    torch.testing.assert_close(cpu_gemm.linear(xt, w.t().contiguous().t(), b), F.linear(xt, w, b), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.skipif(not ONEDNN, reason="this torch build has no oneDNN linear op")
@pytest.mark.parametrize("k,n", [(1024, 3072), (3072, 1024), (192, 576), (96, 48), (17, 5)])
def test_a_rows_bits_do_not_depend_on_the_other_rows(choice, k, n):
    """Any prefix of rows (1 to 300), and the rows in another order, give each row the bits of one 300-row call:
    tiles encoded together equal tiles encoded alone, batched prefill equals single runs. Checked on the CPUs
    where the default picks oneDNN (on the others the products stay on MKL, whose kernels differ)."""
    choice("auto")
    if not cpu_gemm.use_onednn():
        pytest.skip("on this CPU the default keeps torch's BLAS (an Intel CPU, or no oneDNN): nothing to check")
    gen = torch.Generator().manual_seed(k)
    w, x = torch.randn(n, k, generator=gen), torch.randn(300, k, generator=gen)
    with torch.no_grad():
        full = cpu_gemm.linear(x, w)
        for m in list(range(1, 40)) + [64, 65, 127, 255]:
            assert torch.equal(cpu_gemm.linear(x[:m], w), full[:m]), m
        perm = torch.randperm(300, generator=gen)
        assert torch.equal(cpu_gemm.linear(x[perm], w), full[perm])


@pytest.mark.skipif(not ONEDNN, reason="this torch build has no oneDNN linear op")
def test_what_stays_on_f_linear(choice, monkeypatch):
    choice("onednn")
    used = _count_onednn_calls(monkeypatch)
    w = torch.randn(8, 16)
    cpu_gemm.linear(torch.randn(1, 16), w)
    assert used == [1]
    cpu_gemm.linear(torch.randn(64, 16).bfloat16(), w.bfloat16())  # not fp32
    wg = w.clone().requires_grad_()
    y = cpu_gemm.linear(torch.randn(64, 16), wg)  # recording gradients: the op has no backward
    y.sum().backward()
    assert wg.grad is not None and used == [1]
    with torch.no_grad():
        cpu_gemm.linear(torch.randn(64, 16), wg)
    assert used == [1, 1]


def test_the_switch_and_the_auto_rule(choice, monkeypatch):
    choice("blas")
    assert cpu_gemm.use_onednn() is False
    choice("onednn")
    assert cpu_gemm.use_onednn() is ONEDNN
    choice("auto")
    for vendor, machine, want in (("AuthenticAMD", "x86_64", True), ("GenuineIntel", "x86_64", False),
                                  ("", "aarch64", False)):
        monkeypatch.setattr(cpu_gemm, "_cpu_vendor", lambda v=vendor: v)
        monkeypatch.setattr(cpu_gemm.platform, "machine", lambda m=machine: m)
        cpu_gemm.use_onednn.cache_clear()
        assert cpu_gemm.use_onednn() is (want and ONEDNN and torch.backends.mkl.is_available()), vendor
    choice("fast please")  # unknown: the switch's typed error, naming the values it takes
    with pytest.raises(ConfigError, match=r"VL_CPU_GEMM='fast please'.*auto \| onednn \| blas"):
        cpu_gemm.use_onednn()
    choice(" OneDNN ")  # case and spaces as before
    assert cpu_gemm.use_onednn() is ONEDNN


@pytest.mark.skipif(not ONEDNN, reason="this torch build has no oneDNN linear op")
def test_loaded_fp32_models_route_their_linears(choice, tmp_path, monkeypatch):
    """The load pass routes fp32 Linears where oneDNN is chosen; prefill runs through it, and its logits equal
    the unrouted model's."""
    import vl
    from tiny_models import save_hf_nemotron
    from vl.runtime.cpu import matmul as cpu_matmul

    def routed(model):
        lins = [m for m in model.modules() if type(m) is nn.Linear]
        fwds = [vars(m).get("_vl_dense_forward", vars(m).get("forward")) for m in lins]
        return lins and [getattr(f, "__func__", None) is cpu_matmul._fp32_forward for f in fwds]

    path, _ = save_hf_nemotron(tmp_path, "hybrid")
    ids = torch.randint(0, 64, (1, 40), generator=torch.Generator().manual_seed(0))
    choice("blas")
    plain = vl.load_pretrained(path, dtype=torch.float32)
    choice("onednn")
    fast = vl.load_pretrained(path, dtype=torch.float32)
    assert not any(routed(plain)) and all(routed(fast))
    used = _count_onednn_calls(monkeypatch)
    with torch.no_grad():
        got = fast(ids).logits
        assert used
        torch.testing.assert_close(got, plain(ids).logits, rtol=1e-4, atol=1e-4)
