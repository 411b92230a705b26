"""Chunked prefill mixed into decode steps (vl/runtime/decode_batch.py): a prompt that joins while rows decode is
prefilled one chunk per step, so the running rows get a token at every step of its prefill; its chunked prefill
equals a whole prefill (logits and every cache tensor); every row's tokens equal its single run; a joiner ended
while it prefills is dropped alone; once no row decodes, the rest of a prompt runs at once. Through the front end
(`Engine.stream_batch`): a long request joining a running batch, next to a request that fails, twice."""

import pytest
import torch

import vl
from tiny_models import make_tiny_vl_dir, save_hf_nemotron
from vl.errors import VLError
from vl.runtime.batch import ChatRequest
from vl.runtime.cache import HybridCache, KVCache
from vl.runtime.decode_batch import DecodeBatch, _Prefill
from vl.runtime.engine import ChatResult, Engine
from vl.runtime.generate import generate_steps, left_pad
from vl.runtime.sampling import SamplingParams


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    path, _ = save_hf_nemotron(tmp_path_factory.mktemp("lm"), "hybrid")
    return vl.load_pretrained(path)


def single(lm, ids, n, decode="fused"):
    return [ev.tokens[0] for ev in generate_steps(lm, input_ids=ids[None], max_new_tokens=n, decode=decode)]


def run(batch, joins: dict) -> tuple[dict, list]:
    """Step the batch to its end, joining `joins[step]` = [(key, prompt, budget)] before that step; -> tokens per
    key and the keys that got a token at each step."""
    got, per_step, step = {}, [], 0
    while True:
        for key, prompt, budget in joins.get(step, []):
            batch.join([key], [budget], input_ids=prompt[None])
        out = batch.step()
        if out is None:
            return got, per_step
        per_step.append(set(out))
        for k, tok in out.items():
            got.setdefault(k, []).append(tok)
        step += 1


@pytest.mark.parametrize("decode", ["fused", "static"])
def test_a_long_prompt_joins_a_chunk_per_step_and_every_row_equals_its_single_run(lm, decode):
    g = torch.Generator().manual_seed(0)
    a, b, long = (torch.randint(3, 128, (n,), generator=g) for n in (6, 9, 45))
    batch = DecodeBatch(lm, decode=decode, mix_chunk=8)
    got, per_step = run(batch, {0: [("a", a, 20)], 1: [("b", b, 18)], 3: [("long", long, 7)]})
    assert got["a"] == single(lm, a, 20, decode) and got["b"] == single(lm, b, 18, decode)
    assert got["long"] == single(lm, long, 7, decode)
    # 45 tokens in chunks of 8: six steps of prefill, the running rows decoding at each, then its first token
    assert [s for s in per_step[3:9]] == [{"a", "b"}] * 5 + [{"a", "b", "long"}]
    assert set(batch.prefill_s) == {"a", "b", "long"} and min(batch.prefill_s.values()) > 0


def test_a_prompt_no_longer_than_a_chunk_joins_at_once(lm):
    g = torch.Generator().manual_seed(1)
    a, short = torch.randint(3, 128, (6,), generator=g), torch.randint(3, 128, (8,), generator=g)
    got, per_step = run(DecodeBatch(lm, mix_chunk=8), {0: [("a", a, 6)], 2: [("short", short, 3)]})
    assert per_step[2] == {"a", "short"} and got["short"] == single(lm, short, 3)


@torch.no_grad()
@pytest.mark.parametrize("chunk", [1, 5, 16])
def test_a_chunked_prefill_equals_a_whole_prefill(lm, chunk):
    """The twin: a left-padded group prefilled `chunk` tokens at a time (as joiners are) against one call."""
    g = torch.Generator().manual_seed(2)
    ids, mask = left_pad([torch.randint(3, 128, (n,), generator=g) for n in (23, 31)])
    whole = HybridCache(lm.config, 2, 31)
    want = lm(input_ids=ids, attention_mask=mask, cache=whole, logits_to_keep=1).logits[:, -1]
    batch = DecodeBatch(lm, mix_chunk=chunk)
    job = _Prefill(HybridCache(lm.config, 2, 31), ids, None, mask, [])
    calls = 0
    while job.done < job.length:
        batch._prefill(job, chunk)
        calls += 1
    assert calls == -(-31 // chunk) and job.cache.length == whole.length == 31
    assert (job.logits - want).abs().max() <= 1e-4 * want.abs().max()
    assert torch.equal(job.cache.valid, whole.valid)
    for mine, ref in zip(job.cache.layers, whole.layers):
        for name in (() if mine is None else vars(mine)):
            a, b = getattr(mine, name), getattr(ref, name)
            if isinstance(mine, KVCache):  # padded columns hold whatever the padding tokens made: unread
                a, b = a * whole.valid[:, None, :, None], b * whole.valid[:, None, :, None]
            assert (a - b).abs().max() <= 1e-4 * max(1.0, b.abs().max()), name


@torch.no_grad()
def test_only_the_prompt_last_chunk_runs_the_tail_and_the_head(lm):
    """A chunk that only fills the cache stops after the last Mamba / attention layer: one LM head call per prompt
    (the head is a whole read of the vocabulary's rows), and the cache equals a full call's bit for bit."""
    seen = []
    hooks = [lm.lm_head.register_forward_hook(lambda *_: seen.append("head"))]
    tail = lm.backbone.layers[lm.stateless_tail:]
    hooks += [m.register_forward_hook(lambda *_: seen.append("tail")) for m in tail]
    try:
        ids = torch.randint(3, 128, (1, 31), generator=torch.Generator().manual_seed(3))
        job = _Prefill(HybridCache(lm.config, 1, 31), ids, None, None, [])
        batch = DecodeBatch(lm, mix_chunk=5)
        while job.done < job.length:
            batch._prefill(job, 5)
        assert seen == ["tail"] * len(tail) + ["head"]
        full, only = HybridCache(lm.config, 1, 31), HybridCache(lm.config, 1, 31)
        lm(input_ids=ids[:, :20], cache=full, logits_to_keep=1)
        assert lm(input_ids=ids[:, :20], cache=only, cache_only=True) is None and only.length == full.length == 20
        for mine, ref in zip(only.layers, full.layers):
            for name in (() if mine is None else vars(mine)):
                assert torch.equal(getattr(mine, name), getattr(ref, name)), name
        with pytest.raises(ValueError, match="cache_only needs a cache"):
            lm(input_ids=ids, cache_only=True)
    finally:
        for h in hooks:
            h.remove()


def test_a_joiner_ended_while_it_prefills_is_dropped_and_the_others_go_on(lm):
    g = torch.Generator().manual_seed(3)
    a, long = torch.randint(3, 128, (6,), generator=g), torch.randint(3, 128, (40,), generator=g)
    batch = DecodeBatch(lm, mix_chunk=4)
    batch.join(["a"], [12], input_ids=a[None])
    got = [batch.step()["a"]]
    batch.join(["long"], [5], input_ids=long[None])
    got.append(batch.step()["a"])
    assert len(batch.prefilling) == 1 and batch.states() == {"a": None, "long": None}
    batch.finish("long")
    assert batch.ended("long") == "caller"
    while (out := batch.step()) is not None:
        assert set(out) == {"a"}
        got.append(out["a"])
    assert got == single(lm, a, 12) and not batch.prefilling and "long" not in batch.states()  # gone, as rows that leave


def test_once_no_row_decodes_the_rest_of_a_prompt_runs_at_once(lm):
    g = torch.Generator().manual_seed(4)
    a, long = torch.randint(3, 128, (6,), generator=g), torch.randint(3, 128, (40,), generator=g)
    got, per_step = run(DecodeBatch(lm, mix_chunk=4), {0: [("a", a, 3)], 1: [("long", long, 4)]})
    # a decodes at steps 0-2 while long runs two chunks (steps 1, 2); a has ended by step 3: the rest runs there
    assert per_step == [{"a"}, {"a"}, {"a"}, {"long"}, {"long"}, {"long"}, {"long"}]
    assert got["long"] == single(lm, long, 4)


def test_mix_chunk_zero_prefills_a_joiner_at_once_and_a_negative_one_is_refused(lm):
    g = torch.Generator().manual_seed(5)
    a, long = torch.randint(3, 128, (6,), generator=g), torch.randint(3, 128, (40,), generator=g)
    got, per_step = run(DecodeBatch(lm, mix_chunk=0), {0: [("a", a, 4)], 1: [("long", long, 2)]})
    assert per_step[1] == {"a", "long"} and got["long"] == single(lm, long, 2)
    with pytest.raises(VLError, match="mix_chunk"):
        DecodeBatch(lm, mix_chunk=-1)


def _watch(batch, monkeypatch):
    """Record the tokens of each chunk offered to the fused step (`mix`, and whether it took them) and of each
    prefill call made apart from a step."""
    rides, prefills = [], []
    mix, prefill = batch.step_fn.mix, batch._prefill

    def watched_mix(tok, cache, x, chunk_cache, last):
        out = mix(tok, cache, x, chunk_cache, last)
        rides.append((x.shape[0], out is not None))
        return out

    batch.step_fn.mix = watched_mix
    monkeypatch.setattr(batch, "_prefill", lambda job, n: prefills.append(min(n, job.length - job.done))
                        or prefill(job, n))
    return rides, prefills


def test_a_one_row_joiner_rides_inside_the_fused_steps(lm, monkeypatch):
    """A joiner's chunks go inside the running rows' fused step (one call per step, no prefill call of their own),
    and every row still equals its single run; a forward hook on the model sends the chunks back to calls of their
    own (the step then runs through the modules), with the same tokens."""
    g = torch.Generator().manual_seed(4)
    a, b, long = (torch.randint(3, 128, (n,), generator=g) for n in (6, 9, 45))
    joins = {0: [("a", a, 20)], 1: [("b", b, 18)], 3: [("long", long, 7)]}
    want = {"a": single(lm, a, 20), "b": single(lm, b, 18), "long": single(lm, long, 7)}
    batch = DecodeBatch(lm, mix_chunk=8)
    rides, prefills = _watch(batch, monkeypatch)
    got, per_step = run(batch, joins)
    assert got == want
    assert rides == [(8, True), (1, True)] + [(8, True)] * 5 + [(5, True)] and prefills == [6]
    assert [s for s in per_step[3:9]] == [{"a", "b"}] * 5 + [{"a", "b", "long"}]
    hook = lm.backbone.layers[0].register_forward_hook(lambda *_: None)
    try:
        batch = DecodeBatch(lm, mix_chunk=8)
        rides, prefills = _watch(batch, monkeypatch)
        got, _ = run(batch, joins)
    finally:
        hook.remove()
    assert got == want and all(not took for _, took in rides) and prefills == [6, 8, 1, 8, 8, 8, 8, 8, 5]


def test_the_default_ride_follows_the_measured_steps_and_rows_equal_their_single_runs(lm, monkeypatch):
    """With the default chunk, how many tokens ride follows the running rows' step time and what a chunk token
    adds to it (measured as the batch goes), within the rows one step takes; the rows still equal their single
    runs, and the joiner's whole prompt went inside the steps."""
    from vl.runtime.decode_batch import RIDE_SHARE
    from vl.runtime.decode_step import default_ride_chunk

    g = torch.Generator().manual_seed(6)
    a, long = torch.randint(3, 128, (6,), generator=g), torch.randint(3, 128, (150,), generator=g)
    batch = DecodeBatch(lm)
    rides, prefills = _watch(batch, monkeypatch)
    got, _ = run(batch, {0: [("a", a, 160)], 2: [("long", long, 5)]})  # "a" outlasts the join, even 1 token a step
    assert got == {"a": single(lm, a, 160), "long": single(lm, long, 5)}
    most = default_ride_chunk(1, batch.step_fn.ride_rows)
    assert prefills == [6] and sum(n for n, _ in rides) == 150 and all(took and n <= most for n, took in rides)
    batch._usual_s, batch._token_s = 0.040, 0.004  # a step of 40 ms, 4 ms more per chunk token
    assert batch._ride_tokens() == min(most, int(RIDE_SHARE * 10))
    batch._token_s = 1.0  # a token dearer than the whole budget: one at a time, still moving
    assert batch._ride_tokens() == 1


def test_a_padded_group_joins_in_calls_of_its_own(lm, monkeypatch):
    """Two prompts joining together (left-padded) do not ride: their chunks are prefill calls between steps."""
    g = torch.Generator().manual_seed(5)
    a, x, y = (torch.randint(3, 128, (n,), generator=g) for n in (6, 20, 13))
    batch = DecodeBatch(lm, mix_chunk=8)
    rides, prefills = _watch(batch, monkeypatch)
    got = {}
    batch.join(["a"], [12], input_ids=a[None])
    for step in range(12):
        if step == 2:
            ids, mask = left_pad([x, y])
            batch.join(["x", "y"], [5, 5], input_ids=ids, attention_mask=mask)
        for k, tok in (batch.step() or {}).items():
            got.setdefault(k, []).append(tok)
    assert rides == [] and prefills == [6, 8, 8, 4]
    assert got["a"] == single(lm, a, 12) and got["x"] == single(lm, x, 5) and got["y"] == single(lm, y, 5)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return Engine.from_pretrained(make_tiny_vl_dir(tmp_path_factory.mktemp("tiny_vl")))


def test_a_long_request_joins_a_running_batch_through_the_engine_next_to_a_bad_one(engine, monkeypatch):
    """Twice: a running request, then a long text request (prefilled in chunks of 8 while the first decodes) and
    a request whose image cannot be read join; the bad one fails alone, the others equal their single runs and the
    joiner's statistics count its prefill."""
    monkeypatch.setattr(engine, "mix_chunk", 8, raising=False)
    long_text = "left right up down red green blue yellow " * 12
    first = ChatRequest([{"role": "user", "content": "What is the total?"}], max_new_tokens=24, thinking=False)
    joiners = [ChatRequest([{"role": "user", "content": long_text}], max_new_tokens=6, thinking=False),
               ChatRequest([{"role": "user", "content": [{"type": "image", "image": "/nonexistent/page.png"},
                                                         {"type": "text", "text": "What is this?"}]}],
                           max_new_tokens=4)]
    for _ in range(2):
        calls = []

        def more(running):
            calls.append(running)
            return joiners if len(calls) == 2 else []

        results, first_tokens, step = {}, {}, 0
        for i, item in engine.stream_batch([first], SamplingParams(), raise_errors=False, more=more):
            if isinstance(item, (ChatResult, VLError)):
                results[i] = item
            else:
                first_tokens.setdefault(i, len(calls))
        assert isinstance(results[2], VLError)
        for i, r in ((0, first), (1, joiners[0])):
            want = engine.chat(r.messages, max_new_tokens=r.max_new_tokens, thinking=False)
            assert (results[i].token_ids, results[i].text) == (want.token_ids, want.text), i
        prompt = results[1].stats.prompt_tokens
        assert prompt > 8 * 4 and results[1].stats.stages_s["prefill"] > 0
        # the first request went on decoding while the joiner's chunks ran: it ended first or had many tokens
        assert len(results[0].token_ids) == 24


def test_nvfp4_rows_on_tiles_join_ride_and_leave_with_the_tokens_of_their_single_runs(tmp_path, monkeypatch):
    """A bf16 model with NVFP4 Linears and `VL_NVFP4_TILES=on` (every NVFP4 product on AMX tiles, whatever the row
    count): six rows joining and leaving (steps of 1 to 6 rows) and a long prompt riding in as chunks each get the
    tokens of their single run, and a second batch after the first gives them again."""
    from vl.kernels import gemv
    from vl.quant.linear import swap_quantized_linears
    from vl.quant.nvfp4 import quantize_nvfp4
    from vl.runtime.cpu import decode as cpu_decode

    k = gemv.kernel()
    if k is None or not (k.packed_tiles and k.bf16_dot) or cpu_decode.library() is None:
        pytest.skip("no AMX tiles for NVFP4 rows here (or no fused step): the loop's batches are tested elsewhere")
    monkeypatch.setenv("VL_NVFP4_TILES", "on")
    path, _ = save_hf_nemotron(tmp_path, "hybrid", seed=4)
    lm = vl.load_pretrained(path, dtype=torch.bfloat16)
    sd = {}
    for name, mod in lm.named_modules():
        if isinstance(mod, torch.nn.Linear) and name != "lm_head":
            p, bs, gs = quantize_nvfp4(mod.weight.float())
            sd.update({f"{name}.weight": p, f"{name}.weight_scale": bs, f"{name}.weight_scale_2": gs})
    swap_quantized_linears(lm, sd, "weight-only", compute_dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(3)
    prompts = {key: torch.randint(3, 128, (n,), generator=g) for key, n in
               zip("abcdef", (6, 9, 5, 7, 8, 4))}
    long = torch.randint(3, 128, (40,), generator=g)
    budgets = dict(zip("abcdef", (12, 9, 14, 6, 10, 8)))
    joins = {0: [(key, prompts[key], budgets[key]) for key in "abc"], 1: [("d", prompts["d"], budgets["d"])],
             2: [(key, prompts[key], budgets[key]) for key in "ef"], 3: [("long", long, 5)]}
    want = {key: single(lm, prompts[key], budgets[key]) for key in prompts} | {"long": single(lm, long, 5)}
    for _ in range(2):
        got, per_step = run(DecodeBatch(lm, mix_chunk=8), joins)
        assert got == want
        assert max(map(len, per_step)) == 6 and min(map(len, per_step)) == 1
