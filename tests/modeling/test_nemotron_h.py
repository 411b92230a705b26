"""Nemotron-H LM: parity with transformers' NemotronHForCausalLM and the cache invariants."""

import pytest
import torch

import vl
from tiny_models import LM_VARIANTS, save_hf_nemotron
from vl.runtime.cache import HybridCache

LENGTHS = [1, 7, 16, 17, 40]  # chunk_size is 16: below, at, across, and over two chunk boundaries


@pytest.fixture(scope="module", params=sorted(LM_VARIANTS))
def pair(request, tmp_path_factory):
    path, ref = save_hf_nemotron(tmp_path_factory.mktemp("lm"), request.param)
    return ref, vl.load_pretrained(path)


@torch.no_grad()
def test_fp32_logits_match_transformers(pair):
    ref, ours = pair
    for t in LENGTHS:
        x = torch.randint(0, 128, (2, t))
        a, b = ref(x).logits, ours(x).logits
        assert a.abs().max() > 1.0  # the comparison is not between near-zero logits
        assert (a - b).abs().max().item() <= 1e-4, t


@torch.no_grad()
def test_bf16_logits_within_bf16_tolerance(tmp_path):
    path, ref = save_hf_nemotron(tmp_path, "hybrid")
    ours = vl.load_pretrained(path, dtype=torch.bfloat16)
    ref = ref.to(torch.bfloat16)
    x = torch.randint(0, 128, (2, 33))
    a, b = ref(x).logits.float(), ours(x).logits.float()
    scale = a.abs().max()
    assert (a - b).abs().max() <= 0.05 * scale
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.9


def greedy(model, prompt, n):
    cache = HybridCache(model.config, prompt.shape[0], prompt.shape[1] + n)
    logits = model(prompt, cache=cache, logits_to_keep=1).logits
    out = []
    for _ in range(n):
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        out.append(nxt)
        logits = model(nxt, cache=cache).logits
    return torch.cat(out, 1)


@torch.no_grad()
def test_greedy_continuation_equals_transformers_generate(pair):
    ref, ours = pair
    prompt = torch.randint(3, 128, (1, 12))
    theirs = ref.generate(prompt, max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0,
                          min_new_tokens=32)[:, 12:]
    assert torch.equal(greedy(ours, prompt, 32), theirs)


@torch.no_grad()
def test_cached_decode_equals_full_forward(pair):
    _, ours = pair
    x = torch.randint(0, 128, (2, 21))  # crosses the chunk size (16) of the prefill it is compared with
    full = ours(x).logits
    cache = HybridCache(ours.config, 2, 21)
    steps = torch.cat([ours(x[:, i:i + 1], cache=cache).logits for i in range(21)], 1)
    assert (full - steps).abs().max() <= 1e-4


@torch.no_grad()
def test_a_bf16_ssm_cache_decodes_close_to_the_float32_one(pair):
    """`mamba_ssm_cache_dtype: bfloat16` (a config value transformers takes): the recurrent states are kept in bf16
    and a step's read-out is computed in float32; decode runs and stays near the float32-state logits."""
    import dataclasses

    _, ours = pair
    if "M" not in ours.config.pattern:
        pytest.skip("no Mamba layer in this variant")
    x = torch.randint(0, 128, (2, 9))
    want = torch.cat([ours(x[:, i:i + 1], cache=cache).logits for cache in [HybridCache(ours.config, 2, 9)]
                      for i in range(9)], 1)
    cache = HybridCache(dataclasses.replace(ours.config, mamba_ssm_cache_dtype="bfloat16"), 2, 9)
    got = torch.cat([ours(x[:, :5], cache=cache).logits[:, -1:]] + [ours(x[:, i:i + 1], cache=cache).logits
                                                                     for i in range(5, 9)], 1)
    assert cache.layers[ours.config.pattern.index("M")].ssm.dtype == torch.bfloat16
    torch.testing.assert_close(got, want[:, 4:], atol=0.05 * want.abs().max().item(), rtol=0)


@torch.no_grad()
def test_chunked_prefill_equals_one_shot(pair):
    _, ours = pair
    x = torch.randint(0, 128, (1, 45))
    one = ours(x).logits
    nxt = torch.randint(0, 128, (1, 1))
    after_one_shot = HybridCache(ours.config, 1, 46)
    ours(x, cache=after_one_shot)
    expected_next = ours(nxt, cache=after_one_shot).logits
    # chunk 1 is the decode path token by token; MoE variants take it in test_cached_decode_equals_full_forward
    for chunk in ([1, 5, 16, 23] if len(ours.config.pattern.replace("E", "")) == len(ours.config.pattern)
                  else [5, 16, 23]):
        cache = HybridCache(ours.config, 1, 46)
        parts = [ours(x[:, i:i + chunk], cache=cache).logits for i in range(0, 45, chunk)]
        assert (one - torch.cat(parts, 1)).abs().max() <= 1e-4, chunk
        # decoding after a chunked prefill continues the same sequence
        assert (ours(nxt, cache=cache).logits - expected_next).abs().max() <= 1e-4, chunk


@torch.no_grad()
def test_left_padded_batch_equals_singles(pair):
    _, ours = pair
    seqs = [torch.randint(3, 128, (n,)) for n in (5, 19, 12)]
    t = max(len(s) for s in seqs)
    ids = torch.zeros(3, t, dtype=torch.long)
    mask = torch.zeros(3, t, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, t - len(s):], mask[i, t - len(s):] = s, 1
    cache = HybridCache(ours.config, 3, t + 4)
    batched = ours(ids, cache=cache, attention_mask=mask).logits
    step_in = torch.randint(3, 128, (3, 1))
    batched_next = ours(step_in, cache=cache).logits
    for i, s in enumerate(seqs):
        c = HybridCache(ours.config, 1, len(s) + 4)
        single = ours(s[None], cache=c).logits
        assert (batched[i, t - len(s):] - single[0]).abs().max() <= 1e-4
        assert (batched_next[i] - ours(step_in[i:i + 1], cache=c).logits[0]).abs().max() <= 1e-4


@torch.no_grad()
def test_logits_to_keep_and_determinism(pair):
    _, ours = pair
    x = torch.randint(0, 128, (2, 20))
    full = ours(x).logits
    assert torch.equal(ours(x).logits, full)  # same input twice: bitwise identical (N5)
    assert torch.allclose(ours(x, logits_to_keep=1).logits[:, 0], full[:, -1], atol=1e-6)
    assert torch.allclose(ours(x, logits_to_keep=3).logits, full[:, -3:], atol=1e-6)


@torch.no_grad()
def test_stateless_tail_runs_only_at_kept_positions(pair):
    """The MLP / MoE layers after the last Mamba / attention layer see only the kept positions; every other
    layer sees all of them, and the cache they leave behind gives the same next step as a full forward's."""
    _, ours = pair
    pattern = ours.config.pattern
    tail = max(i for i, c in enumerate(pattern) if c in "M*") + 1
    assert ours.stateless_tail == tail and tail < len(pattern)  # every test variant ends in MLP / MoE layers
    seen = {}
    hooks = [blk.register_forward_pre_hook(lambda m, a, i=i: seen.__setitem__(i, a[0].shape[1]))
             for i, blk in enumerate(ours.backbone.layers)]
    try:
        x = torch.randint(0, 128, (2, 20))
        c_keep, c_full = HybridCache(ours.config, 2, 24), HybridCache(ours.config, 2, 24)
        out = ours(x, cache=c_keep, logits_to_keep=2)
    finally:
        for hk in hooks:
            hk.remove()
    assert seen == {i: (2 if i >= tail else 20) for i in range(len(pattern))}
    assert out.last_hidden_state.shape[1] == 2
    full = ours(x, cache=c_full).logits
    torch.testing.assert_close(out.logits, full[:, -2:], rtol=1e-5, atol=1e-5)
    step = torch.randint(0, 128, (2, 1))
    torch.testing.assert_close(ours(step, cache=c_keep).logits, ours(step, cache=c_full).logits)


def test_every_parameter_gets_a_gradient(tmp_path):
    from vl.config import LMConfig
    from vl.modeling.nemotron_h import NemotronHForCausalLM

    cfg = LMConfig(pattern="M*-E", n_routed_experts=4, num_experts_per_tok=4, moe_intermediate_size=16,
                   moe_shared_expert_intermediate_size=16, chunk_size=8)
    model = NemotronHForCausalLM(cfg)
    out = model(torch.randint(0, 256, (2, 11))).logits
    assert torch.isfinite(out).all()
    out.square().mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
