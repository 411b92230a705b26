"""The Mamba-2 reference kernels against their plain definitions: the chunked SSD scan against the one-step
recurrence (values and gradients, inputs left untouched), the shifted-add causal conv against `conv1d`, the
mixer's long no-grad prefill against its autograd path; and the MLP's ReLU²."""

import pytest
import torch

from vl.modeling import kernels
from vl.modeling.ssd_ref import ssd_chunked


def _recurrence(x, dt, A, B, C, state=None):
    """S <- exp(dt·A)·S + dt·x⊗B ; y = S·C, one step at a time, out of place (differentiable)."""
    b, t, h, p = x.shape
    r = h // B.shape[2]
    Bh, Ch = B.repeat_interleave(r, dim=2), C.repeat_interleave(r, dim=2)  # (b, t, h, n)
    S = state if state is not None else x.new_zeros(b, h, p, B.shape[-1])
    ys = []
    for i in range(t):
        S = torch.exp(dt[:, i] * A)[..., None, None] * S + (dt[:, i, :, None] * x[:, i])[..., None] * Bh[:, i, :, None]
        ys.append((S * Ch[:, i, :, None]).sum(-1))
    return torch.stack(ys, 1), S


def _ssd_inputs(t, b=2, h=8, g=2, p=8, n=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(b, t, h, p, generator=gen)
    # real-model magnitudes: dt·A reaches -40 per step, so most within-chunk decays underflow (the clamp path)
    dt = torch.nn.functional.softplus(torch.randn(b, t, h, generator=gen) + 1.0)
    A = -torch.rand(h, generator=gen) * 16 - 0.5
    B = torch.randn(b, t, g, n, generator=gen)
    C = torch.randn(b, t, g, n, generator=gen)
    s0 = torch.randn(b, h, p, n, generator=gen)
    return x, dt, A, B, C, s0


@pytest.mark.parametrize("t,chunk", [(1, 8), (5, 8), (8, 8), (37, 8), (64, 32), (70, 32)])
@pytest.mark.parametrize("with_state", [False, True])
def test_chunked_scan_values_and_gradients_equal_the_recurrence(t, chunk, with_state):
    x, dt, A, B, C, s0 = _ssd_inputs(t)
    inputs = [x, dt, B, C] + ([s0] if with_state else [])
    results = []
    for scan in (lambda *a: _recurrence(*a), lambda *a: ssd_chunked(*a[:5], chunk, *a[5:])):
        leaves = [v.clone().requires_grad_() for v in inputs]
        kept = [v.detach().clone() for v in leaves]
        y, final = scan(leaves[0], leaves[1], A, *leaves[2:])
        (y.square().sum() + final.sin().sum()).backward()
        for v, k in zip(leaves, kept):
            assert torch.equal(v.detach(), k), "the scan changed one of its inputs"
        results.append((y.detach(), final.detach(), [v.grad for v in leaves]))
    (y0, f0, g0), (y1, f1, g1) = results
    torch.testing.assert_close(y1, y0, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(f1, f0, rtol=1e-4, atol=1e-4)
    for name, a, b in zip(["x", "dt", "B", "C", "state"], g1, g0):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3, msg=lambda m, name=name: f"grad {name}: {m}")


def _conv_reference(x, weight, bias, history):
    """conv1d over [history, x] in the channels-first layout, SiLU, the last t outputs."""
    k = weight.shape[-1]
    xc = torch.cat([history, x.transpose(1, 2)], dim=-1)
    out = torch.nn.functional.conv1d(xc, weight[:, None], bias, groups=x.shape[-1])
    return torch.nn.functional.silu(out[..., -x.shape[1]:]).transpose(1, 2), xc[..., xc.shape[-1] - (k - 1):]


@pytest.mark.parametrize("t,chunk", [(5, 8), (37, 8), (70, 32), (300, 32)])
@pytest.mark.parametrize("with_state", [False, True])
def test_chunked_scan_without_autograd_equals_the_recurrence(t, chunk, with_state):
    """The inference path (fp32 decay exponents, no autograd) against the recurrence, same tolerance."""
    x, dt, A, B, C, s0 = _ssd_inputs(t, seed=t)
    with torch.no_grad():
        y0, f0 = _recurrence(x, dt, A, B, C, s0 if with_state else None)
        y1, f1 = ssd_chunked(x, dt, A, B, C, chunk, s0 if with_state else None)
    torch.testing.assert_close(y1, y0, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(f1, f0, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("with_state", [False, True])
def test_mixer_prefill_in_group_blocks_equals_the_autograd_path(monkeypatch, with_state):
    """A long prefill without autograd runs scan, D skip and gated norm a block of whole groups at a time
    (one group, then 3 + 1 groups here); its output and final states equal the recording path's and the
    all-at-once no-grad path's, and its input is left untouched."""
    from vl.config import LMConfig
    from vl.modeling import mamba2
    from vl.runtime.cache import HybridCache

    torch.manual_seed(0)
    cfg = LMConfig(vocab_size=64, hidden_size=64, pattern="M", mamba_num_heads=8, mamba_head_dim=16, n_groups=4,
                   ssm_state_size=16, chunk_size=16, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                   intermediate_size=64)
    mixer = mamba2.Mamba2Mixer(cfg)
    with torch.no_grad():
        mixer.D.normal_()
        mixer.dt_bias.normal_()
        mixer.norm.weight.normal_()
    h = torch.randn(2, 40, 64)
    kept = h.clone()
    scans = []
    real_scan = mamba2.kernels.ssd_scan
    monkeypatch.setattr(mamba2.kernels, "ssd_scan", lambda x, *a: scans.append(x.shape[2]) or real_scan(x, *a))
    per_group = 2 * 40 * 2 * 16  # b * t * heads per group * head dim
    outs = []
    for grad, block, want in ((True, 1 << 22, [8]), (False, 1 << 22, [8]), (False, per_group, [2] * 4),
                              (False, 3 * per_group, [6, 2])):
        monkeypatch.setattr(mamba2, "BLOCK_ELEMENTS", block)
        cache = HybridCache(cfg, 2, 41) if with_state else None
        if cache is not None:  # a carried state from earlier tokens
            gen = torch.Generator().manual_seed(1)
            cache.layers[0].ssm.normal_(generator=gen)
            cache.layers[0].conv.normal_(generator=gen)
        scans.clear()
        with torch.set_grad_enabled(grad):
            out = mixer(h, cache.layers[0] if cache is not None else None)
        assert scans == want
        outs.append([out.detach()] + ([cache.layers[0].ssm.clone(), cache.layers[0].conv.clone()] if cache else []))
        assert torch.equal(h, kept)
    for got in outs[1:]:
        for a, b in zip(got, outs[0]):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("t", [1, 2, 3, 4, 9])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_shifted_causal_conv_equals_conv1d(t, with_state, with_bias):
    gen = torch.Generator().manual_seed(t)
    b, c, k = 2, 6, 4
    x = torch.randn(b, t, c, generator=gen, requires_grad=True)
    weight = torch.randn(c, k, generator=gen, requires_grad=True)
    bias = torch.randn(c, generator=gen, requires_grad=True) if with_bias else None
    state = torch.randn(b, c, k - 1, generator=gen) if with_state else None
    history = state.clone() if with_state else torch.zeros(b, c, k - 1)
    want, want_state = _conv_reference(x, weight, bias, history)
    got = kernels.causal_conv(x, weight, bias, state)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    if with_state:
        torch.testing.assert_close(state, want_state)
    leaves = [x, weight] + ([bias] if with_bias else [])
    g_want = torch.autograd.grad(want.sin().sum(), leaves)
    g_got = torch.autograd.grad(kernels.causal_conv(x, weight, bias, history.clone() if with_state else None)
                                .sin().sum(), leaves)
    for a, b_ in zip(g_got, g_want):
        torch.testing.assert_close(a, b_, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("t", [1, 3, 4, 5, 8, 9, 13])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_in_place_conv_equals_conv1d_across_blocks(t, with_state, with_bias):
    """Without autograd the conv overwrites its input block by block from the end (blocks of 4 steps here, so
    every t crosses block edges, and the first block is shorter than, equal to or longer than k-1); the
    result equals conv1d and the out-of-place path (to the last bit of SiLU's vectorized vs scalar exp), x
    becomes the output, the rest of the projection output is untouched, and the state is the last k-1 inputs."""
    gen = torch.Generator().manual_seed(100 + t)
    b, c, k = 2, 6, 4
    wide = torch.randn(b, t, 3 * c, generator=gen)  # x as a column slice of a wider projection output
    x = wide[..., c:2 * c]
    weight = torch.randn(c, k, generator=gen)
    bias = torch.randn(c, generator=gen) if with_bias else None
    history = torch.randn(b, c, k - 1, generator=gen) if with_state else torch.zeros(b, c, k - 1)
    want, want_state = _conv_reference(x, weight, bias, history)
    out_of_place = torch.nn.functional.silu(kernels._shifted_conv(torch.cat([history.transpose(1, 2), x], 1),
                                                                  weight.t().contiguous(), bias)[:, k - 1:])
    untouched = wide.clone()
    state = history.clone() if with_state else None
    with torch.no_grad():
        got = kernels._conv_in_place(x, weight.t().contiguous(), bias, history.transpose(1, 2) if with_state else None,
                                     block=4)
    assert got.data_ptr() == x.data_ptr()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, out_of_place, rtol=1e-6, atol=1e-7)
    assert torch.equal(wide[..., :c], untouched[..., :c]) and torch.equal(wide[..., 2 * c:], untouched[..., 2 * c:])
    x2 = untouched[..., c:2 * c].clone()
    with torch.no_grad():  # the public entry point takes the in-place path and updates the state first
        got2 = kernels.causal_conv(x2, weight, bias, state)
    torch.testing.assert_close(got2, want, rtol=1e-5, atol=1e-5)
    if with_state:
        torch.testing.assert_close(state, want_state)


def test_in_place_conv_long_sequence_matches_the_autograd_path():
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(1, 300, 16, generator=gen)
    weight, bias = torch.randn(16, 4, generator=gen), torch.randn(16, generator=gen)
    want = kernels.causal_conv(x.clone().requires_grad_(), weight, bias).detach()
    with torch.no_grad():
        got = kernels.causal_conv(x, weight, bias)
    assert torch.equal(got, want)


def test_gated_rms_norm_values_and_gradients_equal_its_definition():
    from vl.modeling.norms import GatedRMSNorm

    gen = torch.Generator().manual_seed(0)
    norm = GatedRMSNorm(32, n_groups=4, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(32, generator=gen))
    y = torch.randn(2, 5, 32, generator=gen, requires_grad=True)
    z = torch.randn(2, 5, 32, generator=gen, requires_grad=True)

    def definition(y, z, w):  # y·silu(z), RMS-normalised per group of 8 channels, then scaled
        g = (y * torch.nn.functional.silu(z)).view(2, 5, 4, 8)
        return (g / torch.sqrt(g.pow(2).mean(-1, keepdim=True) + 1e-5)).view(2, 5, 32) * w

    w = norm.weight.detach().clone().requires_grad_()
    want = definition(y, z, w)
    got = norm(y, z)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    g_want = torch.autograd.grad(want.sin().sum(), [y, z, w])
    g_got = torch.autograd.grad(got.sin().sum(), [y, z, norm.weight])
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("grad", [False, True])
def test_relu2_equals_its_definition_in_place_or_not(grad):
    """ReLU² squares in place without autograd (its input is the fresh up-projection output) and out of place
    when a backward needs the rectified values."""
    from vl.modeling.mlp import activation

    x = torch.randn(4, 64)
    want = torch.relu(x) ** 2
    leaf = x.clone().requires_grad_(grad)
    with torch.set_grad_enabled(grad):
        fresh = leaf * 1.0  # the activation's input is always a fresh tensor
        got = activation("relu2")(fresh)
    assert torch.equal(got.detach(), want)
    if grad:
        got.sum().backward()
        assert torch.equal(leaf.grad, 2 * torch.relu(x))
