"""A joining prompt's chunk riding along with the fused CPU decode step (`run_step(..., chunk=...)`, the
`VlSegment` of vl/kernels/csrc/decode_step.cpp): the decode rows' logits and cache are bit for bit those of the
step without the chunk (a row's sums never depend on the other rows), and the chunk fills its cache as the modules'
prefill of the same tokens does (fp32: up to summation order; bf16: as close to the fp32 model as the bf16 modules
are), its last token's logits included. Hybrid and MoE stacks, padded decode rows, both builds, 1 and 2 threads."""

import pytest
import torch

from test_cpu_decode import (_err, _rows, down_by_rows, lib, model, models, moe_config, odd_config,  # noqa: F401
                             packed_linears, thirteen_rows_alone)
from vl.runtime.cache import HybridCache
from vl.runtime.cpu import decode as cpu_decode
from vl.runtime.generate import left_pad


def _config(stack: str):
    if stack == "moe":
        return moe_config()
    return odd_config(**({"head_dim": 32} if "32-wide" in stack else {}))


def _copy(cache):
    memo = cache.__dict__.pop("_vl_step_pointers", None)  # (ctypes pointers: not deep-copied, and not the copy's)
    try:
        return _rows(cache, slice(None))
    finally:
        if memo is not None:
            cache._vl_step_pointers = memo


def _tensors(cache):
    return [t.clone() for t in cache.tensors()]


def _close(got, want, exact, dtype, what):
    if dtype == torch.float32:
        torch.testing.assert_close(got.float(), want.float(), rtol=1e-4, atol=1e-4, msg=what)
        return
    ulp = 2.0 ** -8 * exact.abs().max().clamp_min(1e-3)  # one bf16 ulp at the tensor's scale
    (fmax, fmean), (mmax, mmean) = _err(got, exact), _err(want, exact)
    assert fmax <= 1.5 * mmax + 4 * ulp and fmean <= 1.5 * mmean + ulp, (what, fmax, fmean, mmax, mmean, ulp)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("stack", ["hybrid", "hybrid, down_proj by rows", "moe", "hybrid, 32-wide heads"])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_chunk_rides_along_without_touching_the_decode_rows(lib, dtype, stack, threads):
    """(32-wide heads: a bf16 chunk's attention as tile products on AMX, vl_decode_step's attend_segment_tiles.)"""
    cfg = _config(stack)
    lm, truth = models(cfg, dtype, seed=5)
    lm = down_by_rows(lm, "rows" in stack)
    g = torch.Generator().manual_seed(7)
    ids, mask = left_pad([torch.randint(3, 301, (n,), generator=g) for n in (5, 8, 3, 7, 6)])
    prompt = torch.randint(3, 301, (1, 40), generator=g)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.no_grad():
            rows = HybridCache(lm.config, ids.shape[0], 16, dtype=dtype)
            lm(ids, cache=rows, attention_mask=mask, logits_to_keep=1)
            tok = ids[:, -1:]
            mine, ref = HybridCache(lm.config, 1, 40, dtype=dtype), HybridCache(lm.config, 1, 40, dtype=dtype)
            exact = HybridCache(lm.config, 1, 40) if truth is not None else None
            for part in (slice(0, 9), slice(9, 30), slice(30, 40)):  # 14, 26 and 15 rows in all
                last = part.stop == 40
                alone = _copy(rows)
                want = cpu_decode.run_step(lm, lib, tok, alone)
                got = cpu_decode.run_step(lm, lib, tok, rows, chunk=(lm.embed(prompt[0, part]), mine, last))
                assert got.shape == (ids.shape[0] + last, lm.config.vocab_size)
                assert torch.equal(got[:ids.shape[0]], want)  # the decode rows: the same bits as without the chunk
                for a, b in zip(rows.tensors(), alone.tensors()):
                    assert torch.equal(a, b)
                out = lm(prompt[:, part], cache=ref, logits_to_keep=1)
                assert mine.length == ref.length == part.stop and torch.equal(mine.valid, ref.valid)
                if truth is not None:
                    full = truth(prompt[:, part], cache=exact, logits_to_keep=1)
                if last:
                    _close(got[-1], out.logits[0, -1], full.logits[0, -1] if truth is not None else None, dtype,
                           "the chunk's last logits")
                tok = want.argmax(-1, keepdim=True)
            truths = list(exact.tensors())[1:] if truth is not None else [None] * len(_tensors(ref))
            for i, (a, b, c) in enumerate(zip(_tensors(mine)[1:], _tensors(ref)[1:], truths)):  # (after `valid`)
                _close(a, b, c, dtype, f"chunk cache tensor {i}")
    finally:
        torch.set_num_threads(old)


def test_a_chunk_the_step_cannot_take_is_refused_with_nothing_done(lib):
    """A padded or several-row chunk cache, or embeddings in another dtype: None, and neither cache moved."""
    lm = models(odd_config(), torch.float32)[0]
    rows = HybridCache(lm.config, 2, 8)
    with torch.no_grad():
        lm(torch.randint(3, 301, (2, 4)), cache=rows, logits_to_keep=1)
    tok = torch.randint(3, 301, (2, 1))
    x = lm.embed(torch.randint(3, 301, (5,)))
    padded = HybridCache(lm.config, 1, 8)
    padded.padded = True
    for chunk in ((x, HybridCache(lm.config, 2, 8), False), (x, padded, False),
                  (x.to(torch.bfloat16), HybridCache(lm.config, 1, 8), False)):
        before = _tensors(rows)
        assert cpu_decode.run_step(lm, lib, tok, rows, chunk=chunk) is None
        assert rows.length == 4 and chunk[1].length == 0
        assert all(torch.equal(a, b) for a, b in zip(before, rows.tensors()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("stack", ["hybrid", "moe", "hybrid, 32-wide heads"])
def test_a_chunk_fills_its_cache_with_the_same_bits_in_one_step_or_token_by_token(lib, dtype, stack):
    """Every per-row sum keeps its order whatever the rows beside it (products, the recurrence, attention over the
    chunk's keys read once for all its tokens), so 19 tokens riding in one step leave the chunk's cache and last
    logits bit for bit as 19 steps of one token each do."""
    cfg = _config(stack)
    lm = models(cfg, dtype, seed=6)[0]
    g = torch.Generator().manual_seed(8)
    ids = torch.randint(3, 301, (3, 6), generator=g)
    prompt = torch.randint(3, 301, (1, 30), generator=g)
    with torch.no_grad():
        rows = HybridCache(lm.config, 3, 40, dtype=dtype)
        lm(ids, cache=rows, logits_to_keep=1)
        together, apart = HybridCache(lm.config, 1, 30, dtype=dtype), HybridCache(lm.config, 1, 30, dtype=dtype)
        for c in (together, apart):
            lm(prompt[:, :11], cache=c, cache_only=True)  # the chunk's keys start after 11 cached ones
        tok = ids[:, -1:]
        one = cpu_decode.run_step(lm, lib, tok, _copy(rows), chunk=(lm.embed(prompt[0, 11:]), together, True))
        for t in range(11, 30):
            last = cpu_decode.run_step(lm, lib, tok, _copy(rows), chunk=(lm.embed(prompt[0, t:t + 1]), apart, t == 29))
    assert torch.equal(one[-1], last[-1])
    for a, b in zip(together.tensors(), apart.tensors()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("rule", ["auto", "on"])
def test_nvfp4_rows_on_tiles_keep_their_bits_in_batches_and_beside_a_chunk(lib, monkeypatch, rule):
    """A bf16 NVFP4 model on AMX tiles (`VL_NVFP4_TILES`, read when the step's plan is built). on: every row in
    every batch size has the bits of the row decoded alone. auto: batches below `gemv.TILE_FROM_ROWS` rows keep the
    float32 loop (a row has its bits alone) and larger ones take tiles (a row has the same bits in all of them); a
    riding chunk's tokens take tiles beside the decode rows' own path, so the decode rows keep the bits of their
    step without the chunk, whatever the batch size."""
    from vl.kernels import gemv

    if not lib.lib.vl_packed_tiles():
        pytest.skip("no AMX tiles in this build or on this CPU: NVFP4 rows keep their loops (tested elsewhere)")
    monkeypatch.setenv("VL_NVFP4_TILES", rule)
    cfg = odd_config(hidden_size=64, intermediate_size=64, mamba_num_heads=4, mamba_head_dim=16, head_dim=16,
                     ssm_state_size=16)
    lm = packed_linears(model(cfg, torch.bfloat16, seed=5, std=0.1), "nvfp4")
    ids, mask, tok, prefilled, alone = thirteen_rows_alone(lm, lib, torch.bfloat16)
    batch13 = cpu_decode.run_step(lm, lib, tok, _copy(prefilled))
    small = gemv.TILE_FROM_ROWS if rule == "auto" else 1
    for b in (2, small - 1, small, 9, 13):
        logits = cpu_decode.run_step(lm, lib, tok[:b], _rows(prefilled, slice(0, b)))
        for i in range(b):
            assert torch.equal(logits[i:i + 1], batch13[i:i + 1] if b >= small else alone[i][0]), (b, i)
            if rule == "on":
                assert torch.equal(logits[i:i + 1], alone[i][0]), (b, i)
    prompt = torch.randint(3, 301, (1, 12), generator=torch.Generator().manual_seed(9))
    for b in (1, 3, 6):
        rows = _rows(prefilled, slice(0, b))
        want = cpu_decode.run_step(lm, lib, tok[:b], _copy(rows))
        chunk = HybridCache(lm.config, 1, 12, dtype=torch.bfloat16)
        got = cpu_decode.run_step(lm, lib, tok[:b], rows, chunk=(lm.embed(prompt[0]), chunk, True))
        assert torch.equal(got[:b], want), b
