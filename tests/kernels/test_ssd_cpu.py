"""The C++ chunked SSD scan of CPU prefill (vl/kernels/ssd_scan.py, csrc/ssd_scan.cpp) against its reference twin
`ssd_ref.ssd_chunked` and the plain recurrence: outputs and final states on odd shapes (vector tails in the head dim,
the state size and the chunk), batches, carried states, both model dtypes, the strided views the mixer passes, a
group's heads split across threads, and both builds (AVX512 where the CPU has it, the portable loops everywhere).
Also: `kernels.ssd_scan` picks it only where it applies, and a prefill through it matches the reference's."""

import contextlib

import pytest
import torch

from vl.config import LMConfig
from vl.kernels import ssd_scan
from vl.modeling import kernels, ssd_ref
from vl.modeling.nemotron_h import NemotronHForCausalLM
from vl.runtime.cache import HybridCache


def _has_avx512() -> bool:
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return False
    return "avx512f" in flags


@contextlib.contextmanager
def _mode(monkeypatch, mode: str):
    monkeypatch.setenv("VL_SSD_KERNEL", mode)
    ssd_scan._load.cache_clear()
    try:
        yield
    finally:
        monkeypatch.delenv("VL_SSD_KERNEL")
        ssd_scan._load.cache_clear()


@pytest.fixture(params=["auto", "portable"])
def lib(request, tmp_path_factory, monkeypatch):
    """The library of one build; one cache directory for the module run, so each builds once."""
    monkeypatch.setenv("VL_KERNEL_CACHE", str(tmp_path_factory.getbasetemp() / "vl-kernels"))
    if request.param == "auto" and not _has_avx512():
        pytest.skip("this CPU lacks AVX512: the scan's AVX512 build is not used here (portable is tested)")
    with _mode(monkeypatch, request.param):
        got = ssd_scan.library()
        if got is None:
            pytest.skip(f"the C++ scan does not build here: {ssd_scan.status()}")
        assert got.isa == ("avx512" if request.param == "auto" else "portable")
        yield got


def inputs(b, t, h, p, g, n, dtype, seed=0, init=False):
    """x, B and C as the mixer passes them: strided views into one projection output (b, t, h*p + 2*g*n)."""
    gen = torch.Generator().manual_seed(seed)
    xbc = torch.randn(b, t, h * p + 2 * g * n, generator=gen).to(dtype)
    x = xbc[..., :h * p].reshape(b, t, h, p)
    B = xbc[..., h * p:h * p + g * n].reshape(b, t, g, n)
    C = xbc[..., h * p + g * n:].reshape(b, t, g, n)
    dt = torch.nn.functional.softplus(torch.randn(b, t, h, generator=gen) - 1)
    A = -(torch.rand(h, generator=gen) * 4 + 0.1)
    s0 = torch.randn(b, h, p, n, generator=gen) if init else None
    return x, dt, A, B, C, s0


def close(got, want, rtol=1e-5):
    """Within float32 summation-order noise: max |diff| against the reference's scale."""
    err = (got - want).abs().max().item()
    assert err <= rtol * max(want.abs().max().item(), 1.0), f"max |diff| {err:.3g}, scale {want.abs().max().item():.3g}"


SHAPES = [  # b, t, h, p, g, n, chunk
    (1, 100, 8, 32, 2, 16, 32),  # a partial last chunk
    (2, 77, 6, 20, 3, 24, 32),  # p and n not multiples of 16, a batch
    (1, 300, 16, 80, 2, 128, 32),  # the 12B model's head dim and state
    (1, 40, 4, 70, 1, 33, 16),  # one group, p past 64 (a second column block), odd n
    (2, 5, 2, 8, 2, 8, 32),  # shorter than a chunk
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("init", [False, True], ids=["zero-state", "carried-state"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_the_scan_equals_its_reference_twin(lib, shape, init, dtype):
    b, t, h, p, g, n, chunk = shape
    x, dt, A, B, C, s0 = inputs(b, t, h, p, g, n, dtype, init=init)
    y_ref, s_ref = ssd_ref.ssd_chunked(x, dt, A, B, C, chunk, s0)
    y, s = ssd_scan.ssd_chunked(x, dt, A, B, C, chunk, s0, lib)
    assert y.dtype == s.dtype == torch.float32 and y.shape == y_ref.shape and s.shape == s_ref.shape
    close(y, y_ref)
    close(s, s_ref)


def test_the_scan_equals_the_plain_recurrence(lib):
    """Against the oracle the reference itself is tested with, over several chunks and a carried state."""
    x, dt, A, B, C, s0 = inputs(2, 70, 6, 20, 3, 24, torch.float32, seed=3, init=True)
    y_seq, s_seq = ssd_ref.ssd_sequential(x, dt, A, B, C, s0)
    y, s = ssd_scan.ssd_chunked(x, dt, A, B, C, 16, s0, lib)
    close(y, y_seq, rtol=1e-4)
    close(s, s_seq, rtol=1e-4)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_groups_heads_split_across_threads_give_the_same_scan(lib, threads):
    """One row and one group with more threads than (row, group) pairs: the heads are split, each part computing
    the group's scores itself. Same numbers as one thread, as the reference."""
    x, dt, A, B, C, s0 = inputs(1, 90, 5, 24, 1, 40, torch.bfloat16, seed=1, init=True)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        y1, s1 = ssd_scan.ssd_chunked(x, dt, A, B, C, 32, s0, lib)
        torch.set_num_threads(threads)
        y, s = ssd_scan.ssd_chunked(x, dt, A, B, C, 32, s0, lib)
    finally:
        torch.set_num_threads(old)
    assert torch.equal(y, y1) and torch.equal(s, s1)  # each head's sums do not depend on the split
    y_ref, s_ref = ssd_ref.ssd_chunked(x, dt, A, B, C, 32, s0)
    close(y, y_ref)
    close(s, s_ref)


def test_contiguous_and_strided_inputs_give_the_same_scan(lib):
    x, dt, A, B, C, _ = inputs(2, 50, 4, 16, 2, 16, torch.float32, seed=2)
    y1, s1 = ssd_scan.ssd_chunked(x, dt, A, B, C, 32, None, lib)
    y2, s2 = ssd_scan.ssd_chunked(x.contiguous(), dt.contiguous(), A, B.contiguous(), C.contiguous(), 32, None, lib)
    assert torch.equal(y1, y2) and torch.equal(s1, s2)


def test_mismatched_shapes_are_refused(lib):
    x, dt, A, B, C, _ = inputs(1, 10, 4, 8, 2, 8, torch.float32)
    with pytest.raises(ValueError, match="shapes do not agree"):
        ssd_scan.ssd_chunked(x, dt[..., :3], A, B, C, 32, None, lib)
    with pytest.raises(ValueError, match="initial state"):
        ssd_scan.ssd_chunked(x, dt, A, B, C, 32, torch.zeros(1, 4, 8, 9), lib)


def _spy(monkeypatch):
    calls = []
    real = ssd_scan.ssd_chunked
    monkeypatch.setattr(ssd_scan, "ssd_chunked", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def test_the_mixer_uses_the_scan_only_without_autograd_and_not_under_override_ref(lib, monkeypatch):
    calls = _spy(monkeypatch)
    x, dt, A, B, C, _ = inputs(1, 40, 4, 16, 2, 16, torch.float32)
    with torch.no_grad():
        kernels.ssd_scan(x, dt, A, B, C, 128)
    assert len(calls) == 1
    with torch.no_grad(), kernels.override("ref"):
        kernels.ssd_scan(x, dt, A, B, C, 128)
    assert len(calls) == 1
    xg = x.detach().clone().requires_grad_(True)
    y, _ = kernels.ssd_scan(xg, dt, A, B, C, 128)  # a graph is recorded: the reference, whose backward exists
    assert len(calls) == 1 and y.requires_grad
    kernels.ssd_scan(x, dt, A, B, C, 128)  # grad mode on but nothing requires grad: no graph, the C++ scan
    assert len(calls) == 2
    with torch.no_grad():
        kernels.ssd_scan(x.half(), dt, A, B.half(), C.half(), 128)  # a dtype it does not take: the reference
    assert len(calls) == 2


def test_off_runs_the_reference_and_says_so(monkeypatch):
    calls = _spy(monkeypatch)
    with _mode(monkeypatch, "off"):
        assert ssd_scan.library() is None and "VL_SSD_KERNEL=off" in ssd_scan.status()
        x, dt, A, B, C, _ = inputs(1, 40, 4, 16, 2, 16, torch.float32)
        with torch.no_grad():
            y, s = kernels.ssd_scan(x, dt, A, B, C, 128)
    assert not calls
    y_ref, s_ref = ssd_ref.ssd_chunked(x, dt, A, B, C, kernels.REF_CHUNK)
    assert torch.equal(y, y_ref) and torch.equal(s, s_ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_chunked_prefill_through_the_scan_matches_the_reference(lib, dtype):
    """A model prefilled in two chunks (the second continues from the cache's state): logits and the SSM states of
    the C++ scan against the reference's. fp32 to summation-order noise; bf16 within what two exact chunkings of
    the reference itself differ by after every later layer's bf16 rounding."""
    cfg = LMConfig(vocab_size=301, hidden_size=40, pattern="M*-M-M", num_attention_heads=4, num_key_value_heads=2,
                   head_dim=12, intermediate_size=52, mamba_num_heads=6, mamba_head_dim=10, n_groups=2,
                   ssm_state_size=24, chunk_size=16)
    torch.manual_seed(0)
    lm = NemotronHForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in lm.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
    lm = lm.to(dtype)
    ids = torch.randint(3, cfg.vocab_size, (2, 75), generator=torch.Generator().manual_seed(1))

    def run():
        cache = HybridCache(cfg, 2, 128, dtype=dtype)
        with torch.no_grad():
            first = lm(ids[:, :40], cache=cache).logits
            second = lm(ids[:, 40:], cache=cache).logits
        return torch.cat([first, second], 1).float(), [s.ssm.clone() for s in cache.layers if hasattr(s, "ssm")]

    got, states = run()
    with kernels.override("ref"):
        want, want_states = run()
    scale = want.abs().max().item()
    tol = 1e-5 if dtype == torch.float32 else 0.05
    assert (got - want).abs().max().item() <= tol * scale
    for s, w in zip(states, want_states):
        assert (s - w).abs().max().item() <= tol * max(w.abs().max().item(), 1.0)


def test_loading_a_cpu_model_builds_the_scan_before_the_first_prefill(monkeypatch, tmp_path):
    """`runtime_passes` (what `vl.load_pretrained` ends with) builds the C++ scan for a CPU model with Mamba layers,
    so the first request does not wait for the compiler."""
    from vl.runtime.pretrained import runtime_passes

    monkeypatch.setenv("VL_KERNEL_CACHE", str(tmp_path))
    cfg = LMConfig(vocab_size=64, hidden_size=32, pattern="M-", num_attention_heads=2, num_key_value_heads=1,
                   head_dim=16, intermediate_size=32, mamba_num_heads=4, mamba_head_dim=8, n_groups=1,
                   ssm_state_size=16, chunk_size=16)
    with _mode(monkeypatch, "portable"):
        assert ssd_scan._load.cache_info().currsize == 0
        runtime_passes(NemotronHForCausalLM(cfg).eval())
        assert ssd_scan._load.cache_info().currsize == 1 and list(tmp_path.glob("ssd_scan-portable-*.so"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_fast_decays_whose_products_are_subnormal_equal_the_reference(lib, dtype):
    """The released models' decay rates (A = -1 .. -h, dt = softplus(~1)): decays between distant positions and
    exp(acs) of a 128-token chunk fall below float32's normal range, which the scan flushes to zero (MXCSR FTZ/DAZ,
    per task). The outputs and states still equal the reference, which keeps subnormals; and the calling thread's
    float mode is restored: a subnormal product still comes out subnormal after the call."""
    b, t, h, p, g, n = 1, 300, 8, 32, 2, 64
    x, _, _, B, C, s0 = inputs(b, t, h, p, g, n, dtype, seed=4, init=True)
    gen = torch.Generator().manual_seed(5)
    dt = torch.nn.functional.softplus(torch.randn(b, t, h, generator=gen) * 0.5 + 1.0)
    A = -torch.arange(1, h + 1, dtype=torch.float32)
    y_ref, s_ref = ssd_ref.ssd_chunked(x, dt, A, B, C, 128, s0)
    y, s = ssd_scan.ssd_chunked(x, dt, A, B, C, 128, s0, lib)
    close(y, y_ref)
    close(s, s_ref)
    tiny = torch.tensor([1e-30], dtype=torch.float32) * torch.tensor([1e-10], dtype=torch.float32)
    assert 0 < tiny.item() < 1.2e-38  # subnormal, not flushed: torch's float mode is as before the call
