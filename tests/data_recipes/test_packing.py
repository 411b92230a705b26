"""Packing under a padded-token budget and right-padded collation (data_recipes/packing.py)."""

import random

import pytest
import torch

from data_recipes.formatting import IGNORE, Example
from data_recipes.packing import SequenceTooLongError, collate, efficiency, pack
from vl.modeling.vlm import MediaSpan


def test_pack_respects_the_budget_and_places_every_index_once():
    rng = random.Random(0)
    lengths = [rng.randint(10, 300) for _ in range(200)]
    groups = pack(lengths, 1024)
    assert sorted(i for g in groups for i in g) == list(range(200))
    for g in groups:
        assert len(g) * max(lengths[i] for i in g) <= 1024
        assert lengths[g[0]] == max(lengths[i] for i in g)  # first placed is the longest (decreasing order)
    assert pack(lengths, 1024) == groups  # a pure function of its inputs
    assert 0.5 < efficiency(lengths, groups) <= 1.0


def test_pack_groups_similar_lengths_so_little_is_padding():
    lengths = [200] * 10 + [20] * 50
    groups = pack(lengths, 1000)
    assert efficiency(lengths, groups) == 1.0  # long rows together, short rows together
    assert efficiency(lengths, [list(range(60))]) < 0.3  # one naive batch would be mostly padding


def test_an_example_over_the_budget_gets_its_own_group_and_over_max_seq_len_is_an_error():
    assert pack([50, 900, 40], 500) == [[1], [0, 2]]
    with pytest.raises(SequenceTooLongError, match="max_seq_len"):
        pack([50, 900], 4096, max_seq_len=512)


def _example(n_text: int, n_tiles: int, tpt: int, image_id: int, seed: int, tile: int = 64) -> Example:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(20, 250, (n_text,), generator=g)
    run = torch.full((n_tiles * tpt,), image_id)
    input_ids = torch.cat([ids[:3], run, ids[3:]])
    labels = torch.full_like(input_ids, IGNORE)
    labels[-4:] = input_ids[-4:]
    pixels = torch.randn(n_tiles, 3, tile, tile, generator=g) if n_tiles else None
    return Example(input_ids, labels, pixels, [MediaSpan("image", n_tiles)] if n_tiles else [], f"s{seed}",
                   "doc_total", False)


def test_collate_right_pads_and_keeps_tiles_in_row_order():
    a, b = _example(9, 1, 4, 299, 0), _example(5, 2, 4, 299, 1)
    batch = collate([a, b], pad_id=3)
    assert batch.input_ids.shape == (2, 13) and batch.lengths == [13, 13]
    c = _example(4, 0, 4, 299, 2)
    batch = collate([a, c], pad_id=3)
    assert batch.input_ids[1, 4:].eq(3).all() and batch.labels[1, 4:].eq(IGNORE).all()
    assert torch.equal(batch.input_ids[0], a.input_ids) and batch.num_tokens == 13 + 4
    batch = collate([b, a], pad_id=3)
    assert torch.equal(batch.pixel_values, torch.cat([b.pixel_values, a.pixel_values]))
    assert [m.num_tiles for m in batch.media] == [2, 1]
    assert batch.num_target_tokens == 8


def test_right_padding_changes_nothing_at_real_positions():
    """The reason packing needs no attention mask: the hybrid LM is causal (attention and Mamba)."""
    from vl.config import tiny_vl
    from vl.modeling.vlm import NemotronVL

    torch.manual_seed(0)
    cfg = tiny_vl()
    model = NemotronVL(cfg).eval()
    tpt, image_id = cfg.tokens_per_tile, cfg.tokens.img_context_id
    long, short = _example(30, 2, tpt, image_id, 5), _example(6, 1, tpt, image_id, 6)
    batch = collate([long, short], pad_id=0)
    with torch.no_grad():
        both = model(batch.input_ids, batch.pixel_values, media=batch.media).logits
        alone = model(short.input_ids[None], short.pixel_values, media=short.media).logits
    n = len(short)
    assert torch.allclose(both[1, :n], alone[0], atol=1e-5, rtol=1e-4)
