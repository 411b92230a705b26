"""Numerics rows N4-N8 on the tiny VL model (image tiles through RADIO -> projector -> Nemotron-H, as served),
and N12 (chunked SSD scan against the plain recurrence). docs/reliability_policy.md §6.5.

The LM-only versions of N4-N8 live in tests/modeling/test_nemotron_h.py; these run the whole VL stack with
real processor output (tiles + placeholder runs), which is what a server feeds the model.

Two literal criteria of the matrix do not hold for a 17-layer stack and are kept as strict xfails that state
the measured figures, so the table shows them and a change in behaviour is noticed:
- N4 asks for elementwise rtol 1.6e-2 (TransformerEngine's *single-op* bf16 tolerance); through 12 ViT blocks
  and 5 LM layers, bf16 rounding accumulates to about 4 % of the logit vector's norm. The asserted criterion is the
  per-position relative L2 error of the logit vector <= 5 % and top-1 agreement on every position whose fp32
  top-2 margin exceeds twice that position's error (a flip there would be a real defect, not a near-tie).
- N6 asks for atol = rtol = 1e-5; left padding shifts the SSD chunk boundaries, so fp32 sums run in another
  order and a few near-zero logits differ by ~1.4e-5. The asserted bound is atol 5e-5, rtol 1e-5 (docs/reliability_policy.md §4:
  per-model overrides of the batching tolerance are normal practice).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from PIL import Image

import vl
from vl.modeling.ssd_ref import ssd_chunked, ssd_sequential
from vl.runtime.cache import HybridCache
from vl.runtime.generate import left_pad_embeds


def _image(w, h, seed):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


def _conversations():
    return [
        [{"role": "user", "content": [{"type": "image", "image": _image(100, 150, 1)},
                                      {"type": "text", "text": "What is the total?"}]}],
        [{"role": "user", "content": "Describe the image. The red circle moves to the right."}],
        [{"role": "user", "content": [{"type": "image", "image": _image(300, 90, 2)},
                                      {"type": "text", "text": "Describe."}]}],
        [{"role": "user", "content": [{"type": "image", "image": _image(64, 64, 3)},
                                      {"type": "image", "image": _image(80, 200, 4)},
                                      {"type": "text", "text": "Compare the two images."}]}],
    ]


@pytest.fixture(scope="module")
def engine(rel_tiny_dir):
    return vl.Engine.from_pretrained(rel_tiny_dir)


@pytest.fixture(scope="module")
def image_inputs(engine):
    return engine.processor(_conversations()[0])


@pytest.fixture(scope="module")
def bf16_pair(rel_tiny_dir, image_inputs):
    """(fp32 logits of the fp32 checkpoint, fp32 logits of the bf16-rounded weights, bf16 logits), (t, V)."""
    inp = image_inputs
    f32 = vl.load_pretrained(rel_tiny_dir)
    b16 = vl.load_pretrained(rel_tiny_dir, dtype=torch.bfloat16)
    same_weights_fp32 = copy.deepcopy(b16).float()
    with torch.no_grad():
        a = f32(inp.input_ids, inp.pixel_values, media=inp.media).logits[0]
        r = same_weights_fp32(inp.input_ids, inp.pixel_values, media=inp.media).logits[0]
        b = b16(inp.input_ids, inp.pixel_values.to(torch.bfloat16), media=inp.media).logits[0].float()
    assert b16.language_model.backbone.embeddings.weight.dtype == torch.bfloat16
    return a, r, b


def _decisive_agreement(ref, test):
    err = (ref - test).abs().max(-1).values  # (t,)
    top2 = ref.topk(2, -1).values
    decisive = (top2[:, 0] - top2[:, 1]) > 2 * err
    agree = ref.argmax(-1) == test.argmax(-1)
    return agree, decisive


@pytest.mark.parametrize("reference", ["fp32_checkpoint", "same_weights_fp32"])
def test_n4_bf16_vl_forward_close_to_fp32(bf16_pair, reference):
    a, r, b = bf16_pair
    ref = a if reference == "fp32_checkpoint" else r
    assert ref.abs().max() > 1.0  # not a comparison of near-zero logits
    rel = (ref - b).norm(dim=-1) / ref.norm(dim=-1)
    assert rel.max() <= 0.05, f"per-position relative L2 error {rel.max():.4f}"
    agree, decisive = _decisive_agreement(ref, b)
    assert decisive.float().mean() >= 0.5, "at least half of the positions must be decisive, or the check is vacuous"
    assert agree[decisive].all(), f"top-1 flipped on decisive positions {(~agree & decisive).nonzero().tolist()}"


@pytest.mark.xfail(strict=True, reason="literal N4 criterion (elementwise rtol 1.6e-2, top-1 >= 99 % of all "
                   "positions) does not hold through a 17-layer stack: 51 % of logits within rtol 1.6e-2 (top-1 "
                   "agrees on 63 of 63 positions; with native bf16 GEMMs, 61 of 63)")
def test_n4_literal_elementwise_bf16_tolerance(bf16_pair):
    a, _, b = bf16_pair
    assert torch.allclose(b, a, rtol=1.6e-2, atol=1e-5)
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.99


@torch.no_grad()
def test_n5_same_input_twice_is_bitwise_identical(engine, image_inputs):
    inp, model = image_inputs, engine.model
    first = model(inp.input_ids, inp.pixel_values, media=inp.media).logits
    again = model(inp.input_ids, inp.pixel_values, media=inp.media).logits
    assert torch.equal(first, again)
    cache_a = HybridCache(engine.lm.config, 1, inp.input_ids.shape[1] + 1)
    cache_b = HybridCache(engine.lm.config, 1, inp.input_ids.shape[1] + 1)
    embeds = engine.prepare(_conversations()[0])[0]
    assert torch.equal(engine.lm(inputs_embeds=embeds, cache=cache_a).logits,
                       engine.lm(inputs_embeds=embeds, cache=cache_b).logits)


@pytest.fixture(scope="module")
def batch_vs_singles(engine):
    embeds = [engine.prepare(c)[0][0] for c in _conversations()]  # (t_i, d) each, lengths differ
    assert len({e.shape[0] for e in embeds}) == 4
    with torch.no_grad():
        padded, mask = left_pad_embeds(embeds)  # (4, t, d), (4, t)
        cache = HybridCache(engine.lm.config, 4, padded.shape[1] + 1)
        batched = engine.lm(inputs_embeds=padded, attention_mask=mask, cache=cache).logits
        singles = [engine.lm(inputs_embeds=e[None]).logits[0] for e in embeds]
    return [(batched[i, -e.shape[0]:], s) for i, (e, s) in enumerate(zip(embeds, singles))]


def test_n6_padded_batch_of_4_equals_singles(batch_vs_singles):
    for i, (row, single) in enumerate(batch_vs_singles):
        assert torch.allclose(row, single, atol=5e-5, rtol=1e-5), (i, (row - single).abs().max().item())


@pytest.mark.xfail(strict=True, reason="literal N6 criterion atol = rtol = 1e-5: one near-zero logit of the "
                   "left-padded row differs by 1.4e-5 (fp32 summation order of the shifted SSD chunks)")
def test_n6_literal_atol_rtol_1e5(batch_vs_singles):
    for row, single in batch_vs_singles:
        assert torch.allclose(row, single, atol=1e-5, rtol=1e-5)


def test_n7_greedy_and_seeded_sampling_repeat_exactly(engine):
    msgs = _conversations()[0]
    greedy = [engine.chat(msgs, max_new_tokens=12, thinking=False).token_ids for _ in range(2)]
    assert greedy[0] == greedy[1] and len(greedy[0]) > 0
    sampled = [engine.chat(msgs, max_new_tokens=12, thinking=False, temperature=1.0, top_p=0.9, seed=7).token_ids
               for _ in range(2)]
    assert sampled[0] == sampled[1]
    other = engine.chat(msgs, max_new_tokens=12, thinking=False, temperature=1.0, top_p=0.9, seed=8).token_ids
    assert other != sampled[0], "the seed must matter, or the sampling test cannot fail"


@torch.no_grad()
def test_n8_cached_incremental_decode_equals_full_recompute(engine):
    lm = engine.lm
    embeds = engine.prepare(_conversations()[3])[0]  # two images: (1, t, d)
    n = 10
    cache = HybridCache(lm.config, 1, embeds.shape[1] + n)
    out = lm(inputs_embeds=embeds, cache=cache).logits
    steps, tokens = [out[:, -1]], []
    for _ in range(n):
        nxt = steps[-1].argmax(-1, keepdim=True)  # (1, 1)
        tokens.append(nxt)
        steps.append(lm(nxt, cache=cache).logits[:, -1])
    full = lm(inputs_embeds=torch.cat([embeds, lm.embed(torch.cat(tokens, 1))], 1)).logits  # (1, t + n, V)
    incremental = torch.stack(steps, 1)  # (1, n + 1, V)
    assert (full[:, -(n + 1):] - incremental).abs().max() <= 1e-3


# --- N12: Mamba-2 SSD, chunked scan vs the step-by-step recurrence --------------------------------------
def _ssd_inputs(t, b=2, h=8, g=2, p=16, n=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(b, t, h, p, generator=gen)
    dt = torch.nn.functional.softplus(torch.randn(b, t, h, generator=gen) - 1.0)
    A = -torch.rand(h, generator=gen) * 4 - 0.5
    B = torch.randn(b, t, g, n, generator=gen)
    C = torch.randn(b, t, g, n, generator=gen)
    s0 = torch.randn(b, h, p, n, generator=gen)
    return x, dt, A, B, C, s0


@pytest.mark.parametrize("t", [1, 127, 128, 129, 300])
def test_n12_chunked_ssd_equals_recurrence(t):
    x, dt, A, B, C, s0 = _ssd_inputs(t)
    for init in (None, s0):
        y_seq, s_seq = ssd_sequential(x, dt, A, B, C, init)
        y_chk, s_chk = ssd_chunked(x, dt, A, B, C, 128, init)
        scale = max(1.0, y_seq.abs().max().item())
        assert (y_chk - y_seq).abs().max() <= 1e-5 * scale, t
        assert (s_chk - s_seq).abs().max() <= 1e-5 * max(1.0, s_seq.abs().max().item()), t


def test_n12_state_carried_across_calls_equals_one_scan():
    """A prefill split at a chunk boundary and off it: the state handed over continues the same sequence."""
    x, dt, A, B, C, _ = _ssd_inputs(257)
    y_all, s_all = ssd_chunked(x, dt, A, B, C, 128)
    for cut in (128, 129, 200):
        y1, s1 = ssd_chunked(x[:, :cut], dt[:, :cut], A, B[:, :cut], C[:, :cut], 128)
        y2, s2 = ssd_chunked(x[:, cut:], dt[:, cut:], A, B[:, cut:], C[:, cut:], 128, s1)
        scale = max(1.0, y_all.abs().max().item())
        assert (torch.cat([y1, y2], 1) - y_all).abs().max() <= 1e-5 * scale, cut
        assert (s2 - s_all).abs().max() <= 1e-5 * max(1.0, s_all.abs().max().item()), cut
