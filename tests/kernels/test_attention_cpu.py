"""The vision towers' attention on AMX tiles (vl/kernels/attention.py, csrc/attention.cpp) against its twin, torch's
`scaled_dot_product_attention` on the same bf16 tensors, both measured against the float32 attention of those
tensors: odd lengths and channel counts (padded keys and channels), rows of one chunk of keys and of several (the
online maximum), batches, the strided q / k / v views of one qkv projection, scales, both thread counts giving the same bits, repeated and interleaved calls. Also: where it does
not apply it says so (None) and the switch turns it off."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vl.kernels import attention


@pytest.fixture
def lib():
    got = attention.library()
    if got is None:
        pytest.skip(f"the tile attention does not run here: {attention.status()}")
    return got


def qkv_views(b, length, h, d, seed=0, scale=1.0):
    """q, k, v as the tower passes them: one (B, L, 3, H, D) projection output, split without a copy."""
    g = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(b, length, 3, h, d, generator=g) * scale).bfloat16()
    return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]


def sdpa(q, k, v, scale=None):  # (B, L, H, D) views -> (B, L, H, D)
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          scale=scale).transpose(1, 2)


@pytest.mark.parametrize("shape", [(1, 1032, 16, 80), (2, 37, 3, 64), (1, 5, 2, 128), (3, 17, 1, 2), (1, 33, 2, 96),
                                   (1, 64, 2, 80), (1, 1, 1, 16), (2, 100, 4, 6), (1, 200, 2, 130),
                                   # past 2048 keys: chunks of keys with the online maximum; past 512 queries:
                                   # several query super-blocks over one packed K and V
                                   (1, 2049, 2, 16), (1, 2100, 1, 80), (1, 4200, 2, 80)])
def test_equals_torch_within_bf16_rounding(lib, shape):
    q, k, v = qkv_views(*shape, seed=sum(shape), scale=2.0)
    got = attention.attention(q, k, v)
    assert got is not None and got.shape == q.shape and got.dtype == torch.bfloat16 and got.is_contiguous()
    want = sdpa(q.float(), k.float(), v.float())
    theirs = sdpa(q, k, v).float()
    ours_err, theirs_err = (got.float() - want).abs(), (theirs - want).abs()
    # both round the probabilities and the output to bf16; ours may not be further from the float32 answer
    assert ours_err.max() <= 1.25 * theirs_err.max() + 1e-3, (ours_err.max(), theirs_err.max())
    assert ours_err.mean() <= 1.1 * theirs_err.mean() + 1e-5, (ours_err.mean(), theirs_err.mean())
    assert ours_err.max() <= 0.02 * want.abs().max()


@pytest.mark.parametrize("scale", [0.05, 1.0, 3.0])
def test_scales_and_peaked_rows(lib, scale):
    """A scale other than 1/sqrt(D), and rows whose softmax is nearly one-hot (large scores)."""
    q, k, v = qkv_views(2, 70, 2, 32, seed=3, scale=3.0)
    got = attention.attention(q, k, v, scale=scale).float()
    want = sdpa(q.float(), k.float(), v.float(), scale=scale)
    theirs = sdpa(q, k, v, scale=scale).float()
    assert (got - want).abs().max() <= 1.25 * (theirs - want).abs().max() + 1e-3


def test_same_bits_at_any_thread_count_and_call_order(lib):
    """Each head is one thread's work: the bits do not depend on the thread count, on repeating the call, or on
    another shape's call between two calls."""
    q, k, v = qkv_views(2, 300, 4, 80, seed=5)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = attention.attention(q, k, v)
        torch.set_num_threads(2)
        two = attention.attention(q, k, v)
        attention.attention(*qkv_views(1, 9, 3, 64, seed=6))
        again = attention.attention(q, k, v)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two) and torch.equal(one, again)


def test_batch_rows_and_heads_are_independent(lib):
    """A batch gives each row what that row alone gives (no state shared between heads or rows)."""
    q, k, v = qkv_views(3, 45, 2, 48, seed=7)
    whole = attention.attention(q, k, v)
    for i in range(3):
        assert torch.equal(attention.attention(q[i:i + 1], k[i:i + 1], v[i:i + 1])[0], whole[i])


def test_where_it_does_not_apply_it_answers_none(lib, monkeypatch):
    q, k, v = qkv_views(1, 20, 2, 16, seed=8)
    assert attention.attention(q.float(), k.float(), v.float()) is None  # float32: torch's
    assert attention.attention(q[..., :15], k[..., :15], v[..., :15]) is None  # odd channel count
    assert attention.attention(q, k[:, :10], v[:, :10]) is None  # keys of another length (cross-attention)
    assert attention.attention(q.transpose(2, 3)[..., :2, :], k.transpose(2, 3)[..., :2, :],
                               v.transpose(2, 3)[..., :2, :]) is None  # channels not contiguous
    qg = q.detach().clone().requires_grad_(True)
    assert attention.attention(qg, k, v) is None  # a graph is being recorded
    monkeypatch.setenv("VL_ATTENTION_KERNEL", "off")
    attention._load.cache_clear()
    try:
        assert attention.library() is None and "VL_ATTENTION_KERNEL=off" in attention.status()
        assert attention.attention(q, k, v) is None
    finally:
        monkeypatch.delenv("VL_ATTENTION_KERNEL")
        attention._load.cache_clear()
    assert attention.attention(q, k, v) is not None


def test_status_names_the_path():
    line = attention.status()
    assert line.startswith("C++ AMX attention") or line.startswith("torch's sdpa (")


# --- relative positions (Parakeet, Omni's audio encoder) ---------------------------------------------------------

def rel_inputs(b, length, h, d, seed=0, scale=1.0):
    """qu, qv, k, v (B, L, H, D) as strided views of one projection-like tensor, and r (2L - 1, H, D) as a view with
    a row stride wider than its heads' channels (the kernel takes any strides with contiguous channels)."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(b, length, 4, h, d, generator=g) * scale).bfloat16()
    r = (torch.randn(2 * length - 1, h, d + 2, generator=g) * scale).bfloat16()[..., :d]
    return x[:, :, 0], x[:, :, 1], x[:, :, 2], x[:, :, 3], r


def rel_reference(qu, qv, k, v, r, scale=None, rounded=False, keys=None):
    """The plain maths: query i and key j take r row (L - 1) - (i - j). `rounded`: the module's torch path in bf16
    (each term and their sum rounded to bf16 before the float32 softmax, as transformers does); else float32.
    `keys`: per batch row, the keys every query attends to (the rest masked out)."""
    b, length, h, d = qu.shape
    scale = d**-0.5 if scale is None else scale
    dt = torch.bfloat16 if rounded else torch.float32
    qu, qv, k, v, r = (t.to(dt) for t in (qu, qv, k, v, r))
    content = torch.einsum("blhd,bmhd->bhlm", qu, k) * scale
    i = torch.arange(length)
    rows = (length - 1) - i[:, None] + i[None, :]
    position = torch.einsum("blhd,phd->bhlp", qv, r).gather(-1, rows.expand(b, h, length, length)) * scale
    scores = (content + position).float()
    if keys is not None:
        valid = i[None, :] < torch.tensor(keys)[:, None]  # (B, L) keys
        scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    weights = torch.softmax(scores, dim=-1).to(dt)
    return torch.einsum("bhlm,bmhd->blhd", weights, v).float()


@pytest.mark.parametrize("shape", [(1, 1, 1, 16), (1, 5, 2, 16), (2, 37, 3, 64), (1, 100, 8, 128), (1, 33, 1, 6),
                                   (2, 70, 2, 130),
                                   # past 2048 keys: chunks of keys (online maximum) and a window per chunk; past
                                   # 512 queries: several query super-blocks
                                   (1, 2049, 2, 16), (1, 2100, 2, 128)])
def test_relative_equals_the_module_within_bf16_rounding(lib, shape):
    inputs = rel_inputs(*shape, seed=sum(shape), scale=1.5)
    got = attention.relative_attention(*inputs)
    assert got is not None and got.shape == inputs[0].shape and got.dtype == torch.bfloat16 and got.is_contiguous()
    want = rel_reference(*inputs)
    theirs = rel_reference(*inputs, rounded=True)
    ours_err, theirs_err = (got.float() - want).abs(), (theirs - want).abs()
    # the module's path rounds the scores to bf16 too; ours keeps them float32: never further from the float32 answer
    assert ours_err.max() <= 1.25 * theirs_err.max() + 1e-3, (ours_err.max(), theirs_err.max())
    assert ours_err.mean() <= 1.1 * theirs_err.mean() + 1e-5, (ours_err.mean(), theirs_err.mean())
    assert ours_err.max() <= 0.02 * want.abs().max()


def test_relative_positions_are_read_at_their_distance(lib):
    """A position table that is zero except one distance: every query then favours the key at that distance (the
    kernel reads r at row (L - 1) - (i - j), not a neighbour, in every block and chunk)."""
    length, h, d = 2100, 1, 32
    qu = torch.zeros(1, length, h, d, dtype=torch.bfloat16)
    qv = torch.ones(1, length, h, d, dtype=torch.bfloat16)
    k = torch.zeros_like(qu)
    v = torch.arange(length, dtype=torch.float32).view(1, length, 1, 1).expand(1, length, h, d).bfloat16()
    r = torch.zeros(2 * length - 1, h, d, dtype=torch.bfloat16)
    r[(length - 1) - 3] = 4.0  # distance i - j = 3: key i - 3
    got = attention.relative_attention(qu, qv, k, v, r)[0, :, 0, 0].float()
    want = rel_reference(qu, qv, k, v, r)[0, :, 0, 0]
    assert (got - want).abs().max() <= 2.0  # bf16 of values up to 2100: a step of 8 above 1024
    assert (got[3:] - (torch.arange(3, length) - 3)).abs().max() <= 8.0  # the key 3 back takes nearly all weight


def test_relative_same_bits_at_any_thread_count_and_rows_alone(lib):
    inputs = rel_inputs(2, 300, 4, 64, seed=9)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = attention.relative_attention(*inputs)
        torch.set_num_threads(2)
        two = attention.relative_attention(*inputs)
        attention.relative_attention(*rel_inputs(1, 9, 3, 64, seed=10))
        again = attention.relative_attention(*inputs)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two) and torch.equal(one, again)
    qu, qv, k, v, r = inputs
    assert torch.equal(attention.relative_attention(qu[1:], qv[1:], k[1:], v[1:], r)[0], one[1])


def test_relative_where_it_does_not_apply_it_answers_none(lib):
    qu, qv, k, v, r = rel_inputs(1, 20, 2, 16, seed=11)
    assert attention.relative_attention(qu.float(), qv.float(), k.float(), v.float(), r.float()) is None
    assert attention.relative_attention(qu, qv, k, v, r[1:]) is None  # not 2L - 1 positions
    assert attention.relative_attention(qu[..., :15], qv[..., :15], k[..., :15], v[..., :15], r[..., :15]) is None
    assert attention.relative_attention(qu, qv, k[:, :10], v[:, :10], r) is None


@pytest.mark.parametrize("shape,keys", [((3, 70, 2, 64), [70, 1, 33]), ((2, 2100, 1, 128), [2100, 1500]),
                                        ((1, 600, 2, 32), [599])])
def test_relative_keys_per_row_mask_the_rest(lib, shape, keys):
    """Each batch row's queries attend to its first keys[b] keys only (a clip's real positions), in one chunk of keys
    and past it; the kernel ignores what the masked keys hold."""
    qu, qv, k, v, r = rel_inputs(*shape, seed=12)
    got = attention.relative_attention(qu, qv, k, v, r, keys=keys)
    want = rel_reference(qu, qv, k, v, r, keys=keys)
    theirs = rel_reference(qu, qv, k, v, r, keys=keys, rounded=True)
    assert (got.float() - want).abs().max() <= 1.25 * (theirs - want).abs().max() + 1e-3
    k2, v2 = k.clone(), v.clone()
    for i, n in enumerate(keys):
        k2[i, n:], v2[i, n:] = 7.0, -5.0
    assert torch.equal(attention.relative_attention(qu, qv, k2, v2, r, keys=keys), got)
    assert attention.relative_attention(qu, qv, k, v, r, keys=[0] + keys[1:]) is None  # a row with no key
    assert attention.relative_attention(qu, qv, k, v, r, keys=keys[:-1] + [shape[1] + 1]) is None


@pytest.mark.parametrize("length,keys", [(300, 170), (2100, 1500), (4200, 2500)])
def test_relative_a_clip_in_a_padded_batch_equals_the_clip_alone(lib, length, keys):
    """A clip of `keys` positions in a batch padded to `length` gives its real positions the bits it gets alone: the
    same distances read the same rows of the position table (the alone call's table is the middle 2 keys - 1 rows of
    the batch's), and past 2048 positions both go in chunks of 512 keys."""
    qu, qv, k, v, r = rel_inputs(2, length, 2, 64, seed=13)
    batch = attention.relative_attention(qu, qv, k, v, r, keys=[length, keys])
    lo = (length - 1) - (keys - 1)  # the row of distance keys - 1 in the batch's table
    alone = attention.relative_attention(qu[1:, :keys], qv[1:, :keys], k[1:, :keys], v[1:, :keys],
                                         r[lo:lo + 2 * keys - 1])
    if (length > 2048) != (keys > 2048):
        # chunks of 512 in the batch, the whole row alone: the same sums in another order
        assert (alone[0].float() - batch[1, :keys].float()).abs().max() <= 0.02
    else:
        assert torch.equal(alone[0], batch[1, :keys])
