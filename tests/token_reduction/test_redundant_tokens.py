"""Redundant-token pruning: only background / duplicate tokens go, at most `rate` of them, thumbnail untouched;
the default criterion also finds blank tokens that carry their place in the tile."""

import pytest
import torch

from token_reduction import RedundantTokenPruner, ReductionError, TokenLayout, prune_redundant_tokens

DIM = 32


def _page(tiles: int = 5, content_fraction: float = 0.25, seed: int = 0):
    """Projector-like outputs: background positions = one vector + small noise, content = random."""
    gen = torch.Generator().manual_seed(seed)
    n = tiles * 16
    background = torch.randn(DIM, generator=gen) * 3
    tokens = background + 0.05 * torch.randn(n, DIM, generator=gen)
    content = torch.rand(n, generator=gen) < content_fraction
    tokens[content] = torch.randn(int(content.sum()), DIM, generator=gen) * 3
    return tokens, content, TokenLayout.page(tiles, 4, 4)


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9, 1.0])
def test_background_criterion_drops_only_background(rate):
    tokens, content, layout = _page()
    out = prune_redundant_tokens(tokens, layout, rate, min_similarity=0.95, criterion="background")
    thumbnail = torch.zeros(layout.num_tokens, dtype=torch.bool)
    thumbnail[layout.thumbnail * 16 :] = True
    removed = ~out.keep
    assert not removed[content].any(), "a content token was pruned"
    assert not removed[thumbnail].any(), "the thumbnail was pruned"
    prunable_background = int((~content & ~thumbnail).sum())
    assert int(removed.sum()) == min(int(rate * 64), prunable_background)
    assert out.info["candidates"] == prunable_background
    assert torch.equal(out.tokens, tokens[out.keep])
    assert out.counts.tolist() == out.keep.view(5, 16).sum(-1).tolist()
    assert out.info["removed_per_tile"] == (16 - out.counts).tolist()


def _placed_page(tiles: int = 9, content_fraction: float = 0.2, seed: int = 0):
    """As `_page`, but every token also carries its place in the tile (a strong per-place offset), as the tokens
    of a tower with a position embedding or a position loss do: blank tokens at two places then differ."""
    tokens, content, layout = _page(tiles, content_fraction, seed)
    place = torch.randn(16, DIM, generator=torch.Generator().manual_seed(seed + 1)) * 3
    return tokens + place.repeat(tiles, 1), content, layout


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9, 1.0])
def test_position_criterion_drops_only_background_that_carries_its_place(rate):
    tokens, content, layout = _placed_page()
    assert prune_redundant_tokens(tokens, layout, rate, criterion="background").info["candidates"] == 0
    out = prune_redundant_tokens(tokens, layout, rate)  # the default criterion
    thumbnail = torch.zeros(layout.num_tokens, dtype=torch.bool)
    thumbnail[layout.thumbnail * 16:] = True
    removed, background = ~out.keep, ~content & ~thumbnail
    assert out.info["criterion"] == "position" and out.info["candidates"] == int(background.sum())
    assert not removed[content | thumbnail].any()
    assert int(removed.sum()) == min(int(rate * 8 * 16), int(background.sum()))


def test_position_criterion_with_too_few_tiles_scores_the_page_as_a_whole():
    tokens, _, layout = _page(tiles=3)  # two prunable tiles and the thumbnail: no majority at a place
    for rate in (0.5, 1.0):
        a = prune_redundant_tokens(tokens, layout, rate, criterion="position")
        b = prune_redundant_tokens(tokens, layout, rate, criterion="background")
        assert torch.equal(a.keep, b.keep) and a.info["candidates"] == b.info["candidates"] > 0


def test_dense_page_is_left_alone():
    tokens = torch.randn(5 * 16, DIM)
    for criterion in ("position", "background"):
        out = prune_redundant_tokens(tokens, TokenLayout.page(5, 4, 4), rate=0.9, min_similarity=0.9,
                                     criterion=criterion)
        assert out.keep.all() and out.info["candidates"] == 0


def test_neighbour_criterion_keeps_the_head_of_each_run():
    row_values = torch.randn(4, DIM)  # tile rows of 4: [a a a b]
    tile = torch.stack([row_values[0], row_values[0], row_values[0], row_values[1]])
    tile = torch.cat([tile, torch.randn(12, DIM)])  # rows 1..3 random
    tokens = torch.cat([tile, tile])  # two tiles, no thumbnail
    layout = TokenLayout.page(2, 4, 4, has_thumbnail=False)
    out = prune_redundant_tokens(tokens, layout, rate=1.0, min_similarity=0.999, criterion="neighbour")
    removed = (~out.keep).nonzero().flatten().tolist()
    assert removed == [1, 2, 17, 18]  # the second and third "a" of each tile; the first of a tile never goes


def test_tie_order_is_by_position_and_deterministic():
    tokens = torch.ones(3 * 16, DIM)  # every token identical: all scores tie at 1.0
    layout = TokenLayout.page(3, 4, 4)
    out = prune_redundant_tokens(tokens, layout, rate=0.25, min_similarity=0.5)
    removed = (~out.keep).nonzero().flatten().tolist()
    assert removed == list(range(8))  # int(0.25 * 32 prunable) earliest positions
    again = prune_redundant_tokens(tokens, layout, rate=0.25, min_similarity=0.5)
    assert torch.equal(out.keep, again.keep)


def test_thumbnail_protection_can_be_switched_off():
    tokens = torch.ones(2 * 16, DIM)
    layout = TokenLayout.page(2, 4, 4)
    protected = prune_redundant_tokens(tokens, layout, rate=1.0, min_similarity=0.5)
    assert protected.counts.tolist() == [0, 16]
    unprotected = prune_redundant_tokens(tokens, layout, rate=1.0, min_similarity=0.5, protect_thumbnail=False)
    assert unprotected.counts.tolist() == [0, 0]


def test_document_layout_protects_every_thumbnail():
    layout = TokenLayout.document([3, 1, 2], 4, 4)  # pages of 3 tiles (thumb 2), 1 (none), 2 (thumb 5)
    assert (layout.groups, layout.thumbnail, layout.protected, layout.protected_groups) == (6, None, (2, 5), (2, 5))
    assert TokenLayout.document([3, 2], 4, 4, has_thumbnail=False).protected_groups == ()
    assert TokenLayout.page(3, 4, 4).protected_groups == (2,)
    out = prune_redundant_tokens(torch.ones(6 * 16, DIM), layout, rate=1.0, min_similarity=0.5)
    assert out.counts.tolist() == [0, 0, 16, 0, 0, 16]
    with pytest.raises(ReductionError, match="tile counts >= 1"):
        TokenLayout.document([2, 0])
    with pytest.raises(ReductionError, match="protected"):
        TokenLayout(2, 4, 4, None, (2,))


def test_document_budget_goes_to_the_filler_pages():
    """One budget over the document: empty pages give up all their tokens, the dense page none; page by page
    the same rate leaves a quarter of every empty page."""
    gen = torch.Generator().manual_seed(0)
    background = torch.randn(DIM, generator=gen) * 3
    filler = background + 0.05 * torch.randn(4 * 16, DIM, generator=gen)  # 4 one-tile pages of background
    dense = torch.randn(16, DIM, generator=gen) * 3
    tokens = torch.cat([filler[:32], dense, filler[32:]])  # dense page third
    out = prune_redundant_tokens(tokens, TokenLayout.document([1] * 5, 4, 4), rate=0.8, min_similarity=0.95)
    assert out.counts.tolist() == [0, 0, 16, 0, 0]
    placed = tokens + (torch.randn(16, DIM, generator=gen) * 3).repeat(5, 1)  # blank tokens carry their place
    out = prune_redundant_tokens(placed, TokenLayout.document([1] * 5, 4, 4), rate=0.8, min_similarity=0.95)
    assert out.counts.tolist() == [0, 0, 16, 0, 0]
    per_page = [prune_redundant_tokens(tokens[16 * g:16 * (g + 1)], TokenLayout.page(1, 4, 4), rate=0.8,
                                       min_similarity=0.95).num_kept for g in range(5)]
    assert per_page[2] == 16 and sum(per_page) == 16 + 4 * 4


def test_rate_zero_is_identity_even_on_a_blank_page():
    tokens = torch.ones(3 * 16, DIM)
    out = RedundantTokenPruner(rate=0.0, min_similarity=0.0)(tokens, TokenLayout.page(3, 4, 4))
    assert out.keep.all() and torch.equal(out.tokens, tokens)


def test_bad_settings_are_typed_errors():
    tokens, _, layout = _page()
    with pytest.raises(ReductionError, match=r"\[0, 1\]"):
        prune_redundant_tokens(tokens, layout, rate=-0.5)
    with pytest.raises(ReductionError, match="min_similarity"):
        RedundantTokenPruner(rate=0.5, min_similarity=1.5)
    with pytest.raises(ReductionError, match="criterion"):
        RedundantTokenPruner(rate=0.5, criterion="attention")
    with pytest.raises(ReductionError, match="expected 80 tokens"):
        prune_redundant_tokens(tokens[:-1], layout, rate=0.5)
    with pytest.raises(ReductionError, match="floating-point"):
        prune_redundant_tokens(tokens.long(), layout, rate=0.5)
    bad = tokens.clone()
    bad[3, 3] = float("inf")
    with pytest.raises(ReductionError, match="NaN or Inf"):
        prune_redundant_tokens(bad, layout, rate=0.5)


def test_a_floor_that_stops_the_rate_is_named_in_the_note():
    """A dense page at rate 0.6: the budget is 38 tokens but none reaches the floor, so nothing goes; the
    reduction's note gives the numbers and names the floor (the stats and `vl chat --json` carry it)."""
    tokens = torch.randn(5 * 16, DIM, generator=torch.Generator().manual_seed(3))
    out = prune_redundant_tokens(tokens, TokenLayout.page(5, 4, 4), rate=0.6, min_similarity=0.9,
                                 criterion="background")
    assert out.keep.all() and out.info["candidates"] == 0
    assert out.info["note"] == ("redundant-token pruning 0.6 kept 80 of 80 tokens: the rate allows dropping 38 of "
                                "the 64 prunable ones, but only 0 reach the similarity floor 0.9 (cosine to the "
                                "page's background); the floor keeps tokens that differ from the background")


def test_the_note_counts_a_partly_stopped_rate_and_is_none_when_the_rate_is_met():
    tokens, content, layout = _placed_page()
    background = int((~content).view(9, 16)[:8].sum())  # prunable background tokens (the thumbnail is tile 8)
    stopped = prune_redundant_tokens(tokens, layout, 1.0)
    assert int((~stopped.keep).sum()) == background < 8 * 16
    assert stopped.info["note"].startswith(f"redundant-token pruning 1 kept {9 * 16 - background} of {9 * 16} "
                                           f"tokens: the rate allows dropping 128 of the 128 prunable ones, but only "
                                           f"{background} reach the similarity floor 0.95 (cosine to the background "
                                           "at their place in the tile)")
    met = prune_redundant_tokens(tokens, layout, 0.1)
    assert int((~met.keep).sum()) == int(0.1 * 128) and met.info["note"] is None
    assert prune_redundant_tokens(tokens, layout, 0.0).info["note"] is None
