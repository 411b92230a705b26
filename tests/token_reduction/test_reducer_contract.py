"""One contract over every reducer (docs/design.md §4: contract tests parametrised over every variant).

Each entry: a factory `strength -> reducer` (strength 0 must be the identity) and an input maker
returning `(rows, layout)` on which a non-zero strength does remove something, so every check
below can fail.
"""

import json

import pytest
import torch

from token_reduction import EVS, BlankTileSkipper, Reducer, RedundantTokenPruner, TokenLayout


def _video():
    frames = torch.randn(1, 16, 8).repeat(6, 1, 1)  # static scene ...
    frames[:, 5] = torch.randn(6, 8)  # ... with one changing position
    return frames.reshape(-1, 8), TokenLayout.video(6, 4, 4)


def _page_tokens():
    tokens = torch.randn(8).expand(4 * 16, 8).clone()  # background page ...
    tokens[torch.arange(0, 64, 5)] = torch.randn(13, 8)  # ... with some content
    return tokens, TokenLayout.page(4, 4, 4)


def _document_tokens():
    tokens, _ = _page_tokens()  # 4 tiles read as pages of 2 tiles (thumbnail last), 1 tile, 1 tile
    return tokens, TokenLayout.document([2, 1, 1], 4, 4)


def _page_tiles():
    tiles = torch.ones(4, 3, 32, 32)
    tiles[1, :, 8:12, 4:28] = 0.0  # a line of "text" on tile 1; tiles 0 and 2 blank; 3 = thumbnail
    return tiles, TokenLayout.page(4, 16, 16)


REDUCERS = {
    "evs": (lambda s: EVS(q=0.9 * s), _video),
    "blank_tiles": (lambda s: BlankTileSkipper(max_ink_fraction=0.01 * s), _page_tiles),
    "redundant_position": (lambda s: RedundantTokenPruner(rate=s, criterion="position"), _page_tokens),
    "redundant_background": (lambda s: RedundantTokenPruner(rate=s, criterion="background"), _page_tokens),
    "redundant_neighbour": (lambda s: RedundantTokenPruner(rate=s, criterion="neighbour"), _page_tokens),
    "redundant_document": (lambda s: RedundantTokenPruner(rate=s), _document_tokens),
}


@pytest.fixture(params=sorted(REDUCERS))
def case(request):
    make, inputs = REDUCERS[request.param]
    rows, layout = inputs()
    return make, rows, layout


def test_is_a_reducer(case):
    make, _, _ = case
    reducer = make(1.0)
    assert isinstance(reducer, Reducer)
    assert reducer.stage in ("pre_encoder", "post_projector") and reducer.name


@pytest.mark.parametrize("strength", [0.0, 0.5, 1.0])
def test_shapes_order_and_mask(case, strength):
    make, rows, layout = case
    before = rows.clone()
    reducer = make(strength)
    out = reducer(rows, layout)
    assert torch.equal(rows, before), "the input was modified"
    assert out.keep.dtype == torch.bool and out.keep.shape == (rows.shape[0],)
    assert out.counts.dtype == torch.long and out.counts.shape == (layout.groups,)
    assert torch.equal(out.tokens, rows[out.keep])  # kept rows, in original order
    assert out.tokens.shape == (int(out.keep.sum()), *rows.shape[1:])
    per_row = 1 if reducer.stage == "post_projector" else layout.tokens_per_group
    assert out.num_kept == int(out.keep.sum()) * per_row
    assert out.num_kept + out.num_removed == layout.num_tokens
    assert ((out.counts >= 0) & (out.counts <= layout.tokens_per_group)).all()
    json.dumps(out.info)  # plain values only (stats, UI)
    assert out.info["method"] == reducer.name


def test_strength_zero_is_identity(case):
    make, rows, layout = case
    out = make(0.0)(rows, layout)
    assert out.keep.all() and torch.equal(out.tokens, rows) and out.num_removed == 0


def test_nonzero_strength_removes_something(case):
    make, rows, layout = case
    out = make(1.0)(rows, layout)
    assert out.num_removed > 0
    if layout.thumbnail is not None:
        assert out.counts[layout.thumbnail] == layout.tokens_per_group, "the thumbnail was reduced"


def test_deterministic(case):
    make, rows, layout = case
    first, second = make(0.5)(rows, layout), make(0.5)(rows, layout)
    assert torch.equal(first.keep, second.keep) and torch.equal(first.counts, second.counts)
    assert first.info == second.info


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; CPU-only machine")
def test_cuda_matches_cpu(case):
    make, rows, layout = case
    on_cpu = make(0.5)(rows, layout)
    on_gpu = make(0.5)(rows.cuda(), layout)
    assert on_gpu.keep.is_cuda and on_gpu.counts.is_cuda
    assert torch.equal(on_gpu.keep.cpu(), on_cpu.keep) and torch.equal(on_gpu.counts.cpu(), on_cpu.counts)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; CPU-only machine")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_evs_cuda_matches_transformers_reference(dtype):
    from transformers.models.nemotron_h_omni.modeling_nemotron_h_omni import compute_retention_mask

    from token_reduction import evs

    tokens = torch.randn(32 * 256, 64, device="cuda").to(dtype)
    tokens[256:512] = tokens[:256]  # a duplicate frame: ties
    for q in (0.0, 0.5, 0.75, 0.9, 0.99):
        ours = evs(tokens, TokenLayout.video(32), q)
        assert torch.equal(ours.keep, compute_retention_mask(tokens, 32, q))
