"""vl/kernels/gemm.py: fp32 products through oneDNN where torch's MKL is slow, equal to `F.linear` within fp32
accumulation order and batch-invariant (a row's bits do not depend on the other rows); the choice, its switch
and the cases that must stay on `F.linear`."""

import types

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
        return lins and [getattr(f, "__func__", None) is cpu_matmul._gemm_forward for f in fwds]

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


NATIVE_BF16 = cpu_gemm.native_16bit(torch.bfloat16)


def _record_rows(monkeypatch, seen: list):
    """Record the row count of every F.linear call made by vl/kernels/gemm.py (only there)."""
    real = F.linear
    monkeypatch.setattr(cpu_gemm, "F", types.SimpleNamespace(linear=lambda x, w, b=None: seen.append(x.shape[0])
                                                             or real(x, w, b)))


@pytest.mark.skipif(not NATIVE_BF16, reason="this CPU has no native bf16 GEMM (AVX512-BF16 / AMX): 16-bit products "
                    "are upcast to fp32 there and never reach oneDNN's bf16 kernels")
def test_16bit_products_run_on_a_multiple_of_16_rows(monkeypatch):
    """Every row count above 16 reaches the GEMM rounded up to a multiple of 16 (one oneDNN primitive per 16
    counts instead of one per count), and the answer is the padded call's first rows, zero rows not leaking in."""
    seen, real = [], F.linear
    _record_rows(monkeypatch, seen)
    gen = torch.Generator().manual_seed(0)
    w, b = torch.randn(40, 64, generator=gen).bfloat16(), torch.randn(40, generator=gen).bfloat16()
    x = torch.randn(200, 64, generator=gen).bfloat16()
    with torch.no_grad():
        for m in (1, 5, 16, 17, 31, 32, 33, 100, 200):
            got = cpu_gemm.linear(x[:m], w, b)
            padded = torch.cat([x[:m], x.new_zeros(-m % 16 if m > 16 else 0, 64)])
            assert seen[-1] == padded.shape[0] and seen[-1] == (m if m <= 16 else -(-m // 16) * 16), m
            assert torch.equal(got, real(padded, w, b)[:m]), m
        y3 = cpu_gemm.linear(x[:51].reshape(3, 17, 64), w)  # leading dims kept
        assert y3.shape == (3, 17, 40) and seen[-1] == 64
    wg = w.float().clone().bfloat16().requires_grad_()  # recording gradients: plain F.linear, no padding
    cpu_gemm.linear(x[:17], wg)
    assert seen[-1] == 17


def test_moe_expert_products_see_few_row_counts(monkeypatch):
    """A bf16 MoE prefill multiplies each expert by its own token count; through `gemm.linear` those counts reach
    the GEMM as multiples of 16, so a prompt's experts build a handful of oneDNN primitives, not one per count."""
    if not NATIVE_BF16:
        pytest.skip("no native bf16 GEMM on this CPU: the products are not oneDNN's bf16 ones")
    from vl.config import LMConfig
    from vl.modeling.mlp import MoE

    cfg = LMConfig(hidden_size=32, moe_intermediate_size=48, n_routed_experts=8, num_experts_per_tok=2,
                   moe_shared_expert_intermediate_size=24, mlp_hidden_act="relu2", n_group=1, topk_group=1)
    torch.manual_seed(0)
    moe = MoE(cfg).bfloat16()
    seen, real = [], F.linear
    _record_rows(monkeypatch, seen)
    with torch.no_grad():
        moe(torch.randn(1, 300, 32).bfloat16())
    counts = [c for c in seen if c > 16]
    assert counts and all(c % 16 == 0 for c in counts), seen


@pytest.mark.skipif(not NATIVE_BF16, reason="this CPU has no native bf16 GEMM: its 16-bit Linears are upcast to fp32")
def test_a_bf16_llm_prefills_on_rounded_row_counts(tmp_path, monkeypatch):
    """`vl.load_pretrained` routes the bf16 LLM's Linears through `gemm.linear`: a 37-token prefill reaches the GEMM
    as 48 rows (one oneDNN primitive per row bucket, not per prompt length), with the logits of the plain forward
    within bf16 noise, and decode-sized products still take the GEMV kernel."""
    import vl
    from tiny_models import save_hf_nemotron
    from vl.runtime.cpu import matmul as cpu_matmul

    path, _ = save_hf_nemotron(tmp_path, "hybrid")
    model = vl.load_pretrained(path, dtype=torch.bfloat16)
    lins = [m for m in model.modules() if type(m) is nn.Linear]
    assert lins and all(getattr(vars(m).get("_vl_dense_forward", vars(m).get("forward")), "__func__", None)
                        is cpu_matmul._gemm_forward for m in lins)
    ids = torch.randint(0, 64, (1, 37), generator=torch.Generator().manual_seed(0))
    seen = []
    _record_rows(monkeypatch, seen)
    with torch.no_grad():
        got = model(ids).logits
    assert seen and set(seen) == {48}, seen
    monkeypatch.setattr(cpu_gemm, "rounded_rows", lambda rows: rows)  # the same model without rounding
    with torch.no_grad():
        want = model(ids).logits
    torch.testing.assert_close(got.float(), want.float(), rtol=0.05, atol=0.05)
