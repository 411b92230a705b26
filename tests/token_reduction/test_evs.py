"""EVS against docs/format.md §10.1 and transformers' `nemotron_h_omni.compute_retention_mask` (frames = tubelets of one)."""

import subprocess
import sys

import pytest
import torch
from transformers.models.nemotron_h_omni.modeling_nemotron_h_omni import compute_retention_mask

from token_reduction import EVS, ReductionError, TokenLayout, evs, retained_count

RATES = [0.0, 0.3, 0.5, 0.7, 0.75, 0.9, 0.99]


def _video(kind: str, frames: int, height: int, width: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 * frames + 10 * height + width)
    shape = (frames, height * width, dim)
    if kind == "random":
        x = torch.randn(shape, generator=gen)
    elif kind == "duplicate_frames":  # consecutive equal frames: many zero (or rounding-level) dissimilarities
        base = torch.randn((frames + 1) // 2, height * width, dim, generator=gen)
        x = base.repeat_interleave(2, dim=0)[:frames]
    elif kind == "one_hot":  # cosines are exactly 0 or 1: massive exact ties, broken only by position
        x = torch.nn.functional.one_hot(torch.randint(0, 3, shape[:2], generator=gen), dim).float()
    elif kind == "scaled":  # frames are positive multiples of each other: equal cosines everywhere
        x = torch.randn(1, height * width, dim, generator=gen) * torch.rand(frames, 1, 1, generator=gen).add(0.5)
    else:
        raise AssertionError(kind)
    return x.reshape(-1, dim).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["random", "duplicate_frames", "one_hot", "scaled"])
@pytest.mark.parametrize("frames,height,width", [(1, 4, 4), (2, 2, 3), (5, 4, 4), (9, 16, 16)])
def test_mask_equals_transformers_reference(kind, frames, height, width, dtype):
    tokens = _video(kind, frames, height, width, dim=8, dtype=dtype)
    layout = TokenLayout.video(frames, height, width)
    for q in RATES:
        ours = evs(tokens, layout, q)
        ref = compute_retention_mask(tokens, frames, q)
        assert torch.equal(ours.keep, ref), (kind, frames, q)
        assert torch.equal(ours.tokens, tokens[ref])
        assert ours.num_kept == int(ref.sum()) == retained_count(frames, height * width, q)


def test_retained_count_formula():
    assert retained_count(128, 256, 0.75) == 8192  # docs/format.md §1.2 token budget example
    assert retained_count(128, 256, 0.0) == 32768
    assert retained_count(128, 256, 0.7) == int(32768 * (1 - 0.7)) == 9830
    assert retained_count(4, 256, 0.99) == 256  # floor of one frame's worth
    assert retained_count(1, 256, 0.9) == 256
    assert EVS(0.5).retained_count(10) == 1280


def _static_video_with_moving_patch(frames: int, height: int = 16, width: int = 16, dim: int = 16):
    """Every frame is the same uniform background except one patch that moves one step right per frame."""
    background = torch.ones(dim)
    patch = torch.zeros(dim)
    patch[0] = -1.0
    patch[1] = 3.0
    video = background.expand(frames, height * width, dim).clone()
    positions = [(3 + t) % (height * width) for t in range(frames)]
    for t, p in enumerate(positions):
        video[t, p] = patch
    return video.reshape(-1, dim), positions


@pytest.mark.parametrize("q", [0.0, 0.5, 0.75, 0.99])
def test_reliability_n14_static_frames_one_moving_patch(q):
    frames, tpf = 6, 256
    tokens, positions = _static_video_with_moving_patch(frames)
    out = evs(tokens, TokenLayout.video(frames), q)
    keep = out.keep.view(frames, tpf)
    k = max(tpf, int(tpf * frames * (1 - q)))
    assert keep[0].all(), "frame 0 is kept whole"
    assert out.num_kept == int(out.counts.sum()) == k
    assert torch.equal(out.counts, keep.sum(-1))
    assert torch.equal(out.keep, compute_retention_mask(tokens, frames, q))
    # The moving patch changes two positions per frame (where it left, where it arrived): the only
    # non-zero dissimilarities after frame 0, so they are the first ones kept.
    moving = torch.zeros(frames, tpf, dtype=torch.bool)
    for t in range(1, frames):
        moving[t, positions[t]] = moving[t, positions[t - 1]] = True
    budget_after_first = k - tpf
    if budget_after_first >= int(moving.sum()):
        assert keep[moving].all()
    # Static tokens all tie exactly; the stable sort keeps them in (t, h, w) order: a prefix.
    static = ~moving
    static[0] = False
    kept_static = keep[static]
    n = int(kept_static.sum())
    assert kept_static[:n].all() and not kept_static[n:].any()
    if q == 0.99:
        assert out.counts.tolist() == [tpf] + [0] * (frames - 1)
        assert out.info["frames_emptied"] == frames - 1


def test_one_frame_keeps_everything():
    tokens = torch.randn(256, 32)
    for q in RATES:
        out = evs(tokens, TokenLayout.video(1), q)
        assert out.keep.all() and torch.equal(out.tokens, tokens) and out.counts.tolist() == [256]


def test_rate_zero_is_identity():
    tokens = torch.randn(7 * 256, 12)
    out = evs(tokens, TokenLayout.video(7), 0.0)
    assert out.keep.all() and torch.equal(out.tokens, tokens) and out.num_removed == 0


@pytest.mark.parametrize("q", [-0.1, 1.0, 1.5, float("nan"), float("inf"), True, "0.5", None])
def test_bad_rate_is_a_typed_error(q):
    tokens = torch.randn(2 * 256, 4)
    with pytest.raises(ReductionError, match=r"\[0, 1\)"):
        evs(tokens, TokenLayout.video(2), q)
    with pytest.raises(ReductionError):
        EVS(q)
    with pytest.raises(ReductionError):
        retained_count(2, 256, q)


def test_empty_video_and_shape_errors():
    with pytest.raises(ReductionError, match="at least one frame"):
        evs(torch.randn(0, 4), TokenLayout.video(0), 0.5)
    with pytest.raises(ReductionError, match="at least one frame"):
        retained_count(0, 256, 0.5)
    with pytest.raises(ReductionError, match="expected 512 tokens"):
        evs(torch.randn(500, 4), TokenLayout.video(2), 0.5)
    with pytest.raises(ReductionError, match=r"\(N, D\)"):
        evs(torch.randn(2, 256, 4), TokenLayout.video(2), 0.5)
    with pytest.raises(ReductionError, match="thumbnail"):
        evs(torch.randn(3 * 256, 4), TokenLayout.page(3), 0.5)
    bad = torch.randn(2 * 256, 4)
    bad[300, 1] = float("nan")
    with pytest.raises(ReductionError, match="NaN"):
        evs(bad, TokenLayout.video(2), 0.5)
    assert issubclass(ReductionError, ValueError)


def test_package_does_not_import_vl():
    code = "import sys, token_reduction; bad = [m for m in sys.modules if m == 'vl' or m.startswith('vl.')]; print(bad)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
