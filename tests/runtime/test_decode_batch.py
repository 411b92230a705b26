"""vl/runtime/decode_batch.py at the token level: rows that join a running batch at different steps (with
prompts shorter and longer than the batch's running length, so the cache is re-padded both ways) and rows that
leave it produce exactly the tokens of their single runs, in the fused and the fixed-shape step, and the batch
never decodes a row that has ended."""

import pytest
import torch

import vl
from tiny_models import save_hf_nemotron
from vl.runtime.cache import HybridCache
from vl.runtime.decode_batch import DecodeBatch
from vl.runtime.generate import generate_steps
from vl.runtime.sampling import SamplingParams


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    path, _ = save_hf_nemotron(tmp_path_factory.mktemp("lm"), "hybrid")
    return vl.load_pretrained(path)


def single(lm, ids, n, decode="fused", **kw):
    return [ev.tokens[0] for ev in generate_steps(lm, input_ids=ids[None], max_new_tokens=n, decode=decode, **kw)]


@pytest.mark.parametrize("decode", ["fused", "static"])
def test_rows_joining_and_leaving_equal_single_runs(lm, decode):
    g = torch.Generator().manual_seed(0)
    prompts = {k: torch.randint(3, 128, (n,), generator=g) for k, n in
               {"a": 9, "b": 5, "c": 30, "d": 7, "e": 12}.items()}
    budgets = {"a": 14, "b": 4, "c": 9, "d": 6, "e": 3}
    joins = {0: ["a", "b"], 2: ["c"], 5: ["d", "e"]}  # c: longer than the running length; d, e: shorter
    batch = DecodeBatch(lm, decode=decode)
    got = {k: [] for k in prompts}
    rows_per_step, step = [], 0
    while True:
        if step in joins:
            keys = joins[step]
            ids = torch.nn.utils.rnn.pad_sequence([prompts[k].flip(0) for k in keys], batch_first=True).flip(1)
            mask = torch.zeros_like(ids)
            for r, k in enumerate(keys):
                mask[r, ids.shape[1] - len(prompts[k]):] = 1
            batch.join(keys, [budgets[k] for k in keys], input_ids=ids, attention_mask=mask)
        out = batch.step()
        if out is None:
            break
        rows_per_step.append((len(batch.seqs), len(out)))
        for k, tok in out.items():
            got[k].append(tok)
        step += 1
    for k in prompts:
        assert got[k] == single(lm, prompts[k], budgets[k], decode), k
    assert all(rows == live for rows, live in rows_per_step)  # no dead row is ever decoded
    assert max(rows for rows, _ in rows_per_step) == 4 and rows_per_step[-1][0] == 1


def test_a_row_ended_from_outside_leaves_and_the_others_go_on(lm):
    g = torch.Generator().manual_seed(1)
    a, b = torch.randint(3, 128, (6,), generator=g), torch.randint(3, 128, (11,), generator=g)
    batch = DecodeBatch(lm)
    batch.join(["a"], [10], input_ids=a[None])
    got = {"a": [], "b": []}
    for step in range(10):
        if step == 1:
            batch.join(["b"], [10], input_ids=b[None])
        if step == 3:
            batch.finish("a")
        out = batch.step()
        for k, tok in out.items():
            got[k].append(tok)
    assert len(got["a"]) == 3 and got["a"] == single(lm, a, 3)
    assert got["b"] == single(lm, b, 9) and batch.live() == ["b"] and len(batch.seqs) == 1


def test_repetition_penalty_counts_each_rows_own_tokens(lm):
    g = torch.Generator().manual_seed(2)
    a, b = torch.randint(3, 128, (8,), generator=g), torch.randint(3, 128, (4,), generator=g)
    params = SamplingParams(repetition_penalty=1.3)
    batch = DecodeBatch(lm, params=params)
    batch.join(["a"], [8], input_ids=a[None], contexts=[a.tolist()])
    got = {"a": [], "b": []}
    for step in range(9):
        if step == 2:
            batch.join(["b"], [6], input_ids=b[None], contexts=[b.tolist()])
        for k, tok in (batch.step() or {}).items():
            got[k].append(tok)
    assert got["a"] == single(lm, a, 8, params=params)
    assert got["b"] == single(lm, b, 6, params=params)


@pytest.mark.parametrize("decode", ["fused", "static"])
def test_each_row_keeps_its_own_end_rules(lm, decode):
    """vLLM's `ignore_eos` (no stop id ends the row) and `min_tokens` (stop ids masked out of the row's logits until
    then), per row: rows with different rules in one batch equal their runs alone."""
    a = torch.randint(3, 128, (7,), generator=torch.Generator().manual_seed(3))
    free = single(lm, a, 12, decode)  # no stop ids at all
    stop = free[2]  # make the token it takes at its third step a stop id
    first = free.index(stop)

    def run(**rules):  # key -> (ignore_eos, min_tokens)
        batch, keys = DecodeBatch(lm, stop_ids=[stop], decode=decode), list(rules)
        batch.join(keys, [12] * len(keys), input_ids=a[None].repeat(len(keys), 1),
                   ignore_eos=[rules[k][0] for k in keys], min_tokens=[rules[k][1] for k in keys])
        got = {k: [] for k in keys}
        while (out := batch.step()) is not None:
            for k, tok in out.items():
                got[k].append(tok)
        return got

    rules = {"plain": (False, 0), "ignore": (True, 0), "min": (False, 6), "both": (True, 6)}
    got = run(**rules)
    assert got["plain"] == free[:first + 1] == single(lm, a, 12, decode, stop_ids=[stop])
    assert got["ignore"] == free  # the stop id is a token like any other
    for key in ("min", "both"):  # masked for 6 tokens (with ignore_eos too, as vLLM does): another token instead
        assert got[key][:first] == free[:first] and got[key][first] != stop and stop not in got[key][:6]
    assert len(got["min"]) >= 6 and (got["min"][-1] == stop or len(got["min"]) == 12) and len(got["both"]) == 12
    for key, rule in rules.items():
        assert run(**{key: rule})[key] == got[key], key  # alone equals in the mixed batch


def test_fixed_shape_compiled_batches_take_no_joiners(lm):
    batch = DecodeBatch(lm, decode="compiled")
    batch.join(["a"], [4], input_ids=torch.randint(3, 128, (1, 5)))
    assert not batch.elastic and not batch.fits([3], [2])


def test_fits_bounds_the_padded_length(lm):
    ctx = lm.config.max_position_embeddings
    batch = DecodeBatch(lm, context_length=64)
    assert batch.fits([40], [24]) and not batch.fits([40], [25])
    batch.join(["a"], [20], input_ids=torch.randint(3, 128, (1, 40)))
    assert batch.fits([10], [24]) and not batch.fits([10], [25])  # 40 + 24 with the running row's length
    assert ctx >= 64


def test_repack_right_aligns_rows_and_drops_shared_padding(lm):
    cfg = lm.config
    a = HybridCache(cfg, 2, 10)
    a.valid[0, :4] = False  # row 0 holds 6 tokens, row 1 holds 10... after it leaves, 4 columns are padding
    a.length, a.padded = 10, True
    for layer in a.layers:
        for t in (vars(layer).values() if layer is not None else ()):
            t.copy_(torch.randn_like(t.float()).to(t.dtype))
    b = HybridCache(cfg, 1, 3)
    b.length = 3
    out = HybridCache.repack([(a, [0]), (b, [0])], room=5)
    assert out.length == 6 and out.max_len == 11 and out.batch_size == 2
    assert out.valid[0, :6].all() and out.valid[1, :3].logical_not().all() and out.valid[1, 3:6].all()
    kv = next(i for i, c in enumerate(cfg.pattern) if c == "*")
    assert torch.equal(out.layers[kv].k[0, :, :6], a.layers[kv].k[0, :, 4:10])
    assert torch.equal(out.layers[kv].k[1, :, 3:6], b.layers[kv].k[0, :, :3])
    m = next(i for i, c in enumerate(cfg.pattern) if c == "M")
    assert torch.equal(out.layers[m].ssm[0], a.layers[m].ssm[0]) and torch.equal(out.layers[m].conv[1], b.layers[m].conv[0])


class _ForceAt:
    """A controller (the reasoning budget's interface) that forces token `tok` as the row's `at`-th new token."""

    def __init__(self, at: int, tok: int):
        self.at, self.tok, self.seen = at, tok, []

    def next_forced(self, history):
        return self.tok if len(history) == self.at else None

    def observe(self, token_id):
        self.seen.append(token_id)


@pytest.mark.parametrize("decode", ["fused", "static"])
def test_a_forced_token_is_what_the_row_is_fed_next(lm, decode):
    """A token forced by a controller (the reasoning budget closing the think block) is reported, recorded and fed
    to the model at the next step, so the row continues exactly as a run whose prompt ended with that token; the
    other row of the batch is untouched."""
    g = torch.Generator().manual_seed(3)
    a, b = torch.randint(3, 128, (7,), generator=g), torch.randint(3, 128, (7,), generator=g)
    free = single(lm, a, 3, decode)
    forced = next(t for t in range(3, 128) if t != free[2])  # differs from what the model would pick
    control = _ForceAt(2, forced)
    batch = DecodeBatch(lm, decode=decode)
    batch.join(["a", "b"], [8, 8], input_ids=torch.stack([a, b]), controllers=[control, None])
    got = {"a": [], "b": []}
    while (out := batch.step()) is not None:
        for k, tok in out.items():
            got[k].append(tok)
    assert got["a"][:3] == free[:2] + [forced] and control.seen == got["a"]
    resumed = torch.cat([a, torch.tensor(got["a"][:3])])
    assert got["a"][3:] == single(lm, resumed, 5, decode)
    assert got["b"] == single(lm, b, 8, decode)


@pytest.mark.parametrize("variant,rows,chunk", [("hybrid", 1, 2048), ("moe", 1, 4096), ("moe", 2, 2048)])
def test_a_long_prompt_is_prefilled_in_the_default_chunks_and_equals_one_call(tmp_path, variant, rows, chunk):
    """On the CPU a prompt goes through the model in calls of 2048 positions, 4096 for a lone prompt of a mixture of
    experts (each expert's packed weights are rebuilt once per call: vl/runtime/decode_step.py
    `default_prefill_chunk`; batched prompts keep 2048), and the chunked prefill's first token equals one call over
    the whole prompt."""
    path, _ = save_hf_nemotron(tmp_path, variant)
    lm = vl.load_pretrained(path)
    calls = []
    hook = lm.register_forward_pre_hook(lambda m, a, kw: calls.append((kw.get("input_ids") if kw.get(
        "input_ids") is not None else a[0]).shape[1]), with_kwargs=True)
    ids = torch.randint(3, 128, (rows, 4100), generator=torch.Generator().manual_seed(0))
    keys = [f"r{i}" for i in range(rows)]
    batch = DecodeBatch(lm)
    batch.join(keys, [1] * rows, input_ids=ids)
    first = batch.step()
    hook.remove()
    want = [chunk] * (4100 // chunk) + [4100 % chunk]
    assert calls[:len(want)] == want
    with torch.no_grad():
        cache = HybridCache(lm.config, rows, 4101, dtype=torch.float32)
        whole = lm(input_ids=ids, cache=cache, logits_to_keep=1).logits[:, -1]
    assert [first[k] for k in keys] == whole.argmax(-1).tolist()
