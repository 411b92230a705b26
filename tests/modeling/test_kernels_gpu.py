"""The mamba-ssm fast path against the pure-PyTorch reference, on CUDA (skipped elsewhere, saying why)."""

import pytest
import torch

from vl.modeling import kernels, ssd_ref

needs_kernels = pytest.mark.skipif(not kernels.fast_available(),
                                   reason="needs CUDA and mamba-ssm (the [gpu] extra); this machine lacks one")


@needs_kernels
@pytest.mark.parametrize("t", [1, 127, 128, 129, 1000])
def test_fast_scan_matches_reference(t):
    g = torch.Generator(device="cuda").manual_seed(0)
    b, h, p, n, groups = 2, 16, 64, 128, 4
    x = torch.randn(b, t, h, p, device="cuda", generator=g)
    dt = torch.rand(b, t, h, device="cuda", generator=g) * 0.2
    A = -torch.rand(h, device="cuda", generator=g) * 4
    B, C = (torch.randn(b, t, groups, n, device="cuda", generator=g) for _ in range(2))
    s0 = torch.randn(b, h, p, n, device="cuda", generator=g)
    with kernels.override("fast"):
        y1, f1 = kernels.ssd_scan(x, dt, A, B, C, 128, s0)
    y2, f2 = ssd_ref.ssd_chunked(x, dt, A, B, C, 128, s0)
    scale = y2.abs().max()
    assert (y1 - y2).abs().max() <= 2e-3 * scale
    assert (f1 - f2).abs().max() <= 2e-3 * f2.abs().max()


@needs_kernels
def test_fast_model_forward_matches_reference(tmp_path):
    import vl
    from tiny_models import save_hf_nemotron

    path, _ = save_hf_nemotron(tmp_path, "hybrid")
    model = vl.load_pretrained(path, device_map="cuda")
    x = torch.randint(0, 128, (2, 300), device="cuda")
    with torch.no_grad(), kernels.override("fast"):
        fast = model(x).logits
    with torch.no_grad(), kernels.override("ref"):
        ref = model(x).logits
    assert (fast - ref).abs().max() <= 1e-3 * ref.abs().max()
