"""The fused CPU decode step (vl/runtime/cpu/decode.py, vl/kernels/csrc/decode_step.cpp) against its reference twin, the
modules' own one-token forward: logits and every cache tensor after several steps, in fp32 and bf16, on odd
shapes (vector tails everywhere), padded batches, and both builds (AVX512 where the CPU has it, the portable loops
everywhere). Also: the decode mode "fused" (the default) picks it, and everything it does not cover falls back to the
modules."""

import copy

import pytest
import torch

from vl.config import LMConfig
from vl.errors import ContextLengthError
from vl.modeling.nemotron_h import NemotronHForCausalLM
from vl.runtime.cpu import decode as cpu_decode
from vl.runtime.cache import HybridCache
from vl.runtime.cpu.matmul import gemv_decode_linears, transpose_relu2_down_proj, transposed
from vl.runtime.generate import generate_ids, left_pad


def _has_avx512() -> bool:
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return False
    return {"avx512f", "avx512bw", "avx512vl"} <= set(flags)


@pytest.fixture(params=["auto", "portable"])
def lib(request, tmp_path_factory, monkeypatch):
    """The library of one build; one cache directory for the whole module run, so each builds once."""
    monkeypatch.setenv("VL_KERNEL_CACHE", str(tmp_path_factory.getbasetemp() / "vl-kernels"))
    if request.param == "auto" and not _has_avx512():
        pytest.skip("this CPU lacks AVX512: the fused step's AVX512 build is not used here (portable is tested)")
    cpu_decode._load.cache_clear()
    with cpu_decode.override(request.param):
        got = cpu_decode.library()
        if got is None:
            pytest.skip(f"the fused decode step does not build here: {cpu_decode.status()}")
        yield got
    cpu_decode._load.cache_clear()


def odd_config(**changes) -> LMConfig:
    """Widths that are multiples of nothing the kernels vectorize over (16, 32), so every tail path runs."""
    base = dict(vocab_size=301, hidden_size=40, pattern="M*-M-*M", num_attention_heads=4, num_key_value_heads=2,
                head_dim=12, intermediate_size=52, mamba_num_heads=6, mamba_head_dim=10, n_groups=2,
                ssm_state_size=24, chunk_size=16)
    base.update(changes)
    return LMConfig(**base)


def model(cfg, dtype, seed=0, std=0.3):
    """Random weights large enough that every layer changes the residual stream visibly (std 0.3 on the odd
    widths); the 180m widths take the benchmark's std 0.02, which keeps activations at a realistic scale."""
    torch.manual_seed(seed)
    lm = NemotronHForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in lm.named_parameters():
            if p.dim() > 1:
                p.normal_(0, std)
            elif name.endswith(("dt_bias", "D", "conv1d.bias")):
                p.normal_(0, 0.5)
            elif name.endswith("weight"):  # norms
                p.uniform_(0.5, 1.5)
    return lm.to(dtype)


def _err(a, b):
    d = (a.float() - b.float()).abs()
    return d.max(), d.mean()


def compare_steps(lm, lib, ids, mask=None, steps=6, truth=None):
    """Prefill with the modules into two caches, then decode `steps` tokens through the modules and the fused
    step side by side. fp32: equal up to summation order. bf16 (`truth`: the same weights in fp32): each Linear
    output, conv sum and norm output is rounded to bf16 in both paths, and a float32 sum in another order can flip
    one such rounding, which the later layers carry on; so the fused step must be as close to the fp32 model as
    the bf16 modules are (logits and every cache tensor), and within a few bf16 ulps of the modules."""
    dtype = lm.backbone.embeddings.weight.dtype
    b, t = ids.shape
    runs = [(lm, dtype), (lm, dtype)] + ([(truth, torch.float32)] if truth is not None else [])
    caches = [HybridCache(m.config, b, t + steps + 1, dtype=d) for m, d in runs]
    with torch.no_grad():
        for (m, _), c in zip(runs, caches):
            m(ids, cache=c, attention_mask=mask, logits_to_keep=1)
        tok = ids[:, -1:]
        pairs = []
        for _ in range(steps):
            want = lm(tok, cache=caches[0]).logits[:, -1]
            got = cpu_decode.run_step(lm, lib, tok, caches[1])
            assert got.dtype == torch.float32 and got.shape == want.shape
            exact = truth(tok, cache=caches[2]).logits[:, -1] if truth is not None else None
            pairs.append((got, want, exact))
            tok = (exact if exact is not None else want).argmax(-1, keepdim=True)
    assert caches[1].length == caches[0].length
    for i, layer in enumerate(caches[0].layers):
        for name in vars(layer) if layer is not None else ():
            pairs.append(tuple(getattr(c.layers[i], name) for c in caches) + ((None,) if truth is None else ()))
    for got, want, exact in pairs:
        if dtype == torch.float32:
            torch.testing.assert_close(got.float(), want.float(), rtol=1e-4, atol=1e-4)
            continue
        ulp = 2.0 ** -8 * exact.abs().max().clamp_min(1e-3)  # one bf16 ulp at the tensor's scale
        (fmax, fmean), (mmax, mmean) = _err(got, exact), _err(want, exact)
        assert fmax <= 1.5 * mmax + 2 * ulp and fmean <= 1.5 * mmean + ulp / 4, (fmax, fmean, mmax, mmean, ulp)
        assert _err(got, want)[0] <= 1.5 * mmax + 4 * ulp


def models(cfg, dtype, seed=0, std=0.3):
    """The model in `dtype` and, for bf16, the same weights in fp32 (the truth both bf16 paths approximate)."""
    lm = model(cfg, dtype, seed, std)
    return lm, (model(cfg, torch.float32, seed, std) if dtype == torch.bfloat16 else None)


def down_by_rows(lm, on: bool = True):
    """The MLPs' down_proj weights stored (K, N), as `transpose_relu2_down_proj` leaves them on an AVX512 CPU (laid
    out here directly so that the portable build's loops are tested on any CPU); the step reads them through the
    kernel that skips zero inputs."""
    if on:
        with torch.no_grad():
            for block in lm.backbone.layers:
                if block.kind == "-":
                    w = block.mixer.down_proj.weight
                    w.data = w.t().contiguous().t()
                    assert transposed(block.mixer.down_proj.weight)
    return lm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("changes", [
    {},
    {"residual_in_fp32": True, "use_conv_bias": False},
    {"time_step_limit": (0.05, 0.4), "conv_kernel": 3, "num_key_value_heads": 4},
    {"pattern": "-*", "hidden_size": 64, "intermediate_size": 96, "head_dim": 16, "tie_word_embeddings": True},
    # query heads sharing a kv head four at a time (Omni has 16 per kv head), with a remainder; odd head widths
    {"num_attention_heads": 12, "head_dim": 16},
    {"num_attention_heads": 10, "num_key_value_heads": 1},
])
def test_fused_step_equals_the_modules(lib, dtype, changes):
    lm, truth = models(odd_config(**changes), dtype)
    assert cpu_decode.unsupported(lm) is None
    compare_steps(lm, lib, torch.randint(3, lm.config.vocab_size, (1, 9)), truth=truth)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", ["plain", "down_proj by rows"])
@pytest.mark.parametrize("heads", [{}, {"num_attention_heads": 12, "head_dim": 16}])
def test_fused_step_equals_the_modules_on_padded_batches(lib, dtype, rows, heads):
    lm, truth = models(odd_config(**heads), dtype, seed=1)
    down_by_rows(lm, rows != "plain")
    ids, mask = left_pad([torch.randint(3, 301, (n,)) for n in (4, 11, 7, 1, 9, 3, 6)])  # one GEMV group, 7 padded to 8
    compare_steps(lm, lib, ids, mask, truth=truth)


def test_fused_step_with_the_gemv_pass_and_the_180m_widths(lib):
    """The 180m layer widths (multiples of 16/32/64: the vector loops without tails; Mamba heads and MLP narrowed to
    keep the test fast) at one layer of each kind."""
    from vl.config import bench_180m_lm

    if lib.isa == "portable":
        pytest.skip("the portable build has no vector loops whose full-width path this would add to the odd widths")
    cfg = bench_180m_lm(pattern="M*-", vocab_size=1000, mamba_num_heads=16, intermediate_size=1024)
    lm, truth = models(cfg, torch.bfloat16, std=0.02)
    gemv_decode_linears(lm)  # as vl.load_pretrained does: the plan reads the weights under the routed forward
    assert transpose_relu2_down_proj(lm) == 1  # and this CPU has AVX512 (the portable build skipped above)
    compare_steps(lm, lib, torch.randint(3, 1000, (1, 5)), steps=3, truth=truth)


def assert_fused_uses_the_step_with_the_modules_tokens(lm, lib, monkeypatch):
    """`generate_ids` in the default mode ("fused") runs every decode step through the fused step, and its greedy
    tokens equal those of the modules (VL_CPU_DECODE=off) on a padded batch."""
    ids, mask = left_pad([torch.randint(3, 301, (n,)) for n in (6, 10)])
    with cpu_decode.override("off"):
        want = generate_ids(lm, ids, attention_mask=mask, max_new_tokens=8)
    calls = []
    real = cpu_decode.run_step
    monkeypatch.setattr(cpu_decode, "run_step", lambda *a: calls.append(1) or real(*a))
    with cpu_decode.override(lib.isa if lib.isa == "portable" else "auto"):
        got = generate_ids(lm, ids, attention_mask=mask, max_new_tokens=8)
    assert len(calls) == 7  # every step after the first token, which comes from the prefill
    assert torch.equal(got, want)


def test_the_fused_mode_uses_the_fused_step_and_gives_the_modules_tokens(lib, monkeypatch):
    assert_fused_uses_the_step_with_the_modules_tokens(model(odd_config(), torch.float32, seed=2), lib, monkeypatch)


def test_changed_weights_are_seen(lib):
    lm = model(odd_config(), torch.float32)
    ids = torch.randint(3, 301, (1, 5))
    compare_steps(lm, lib, ids, steps=1)
    with torch.no_grad():
        lm.backbone.layers[0].mixer.A_log.add_(0.5)  # a small vector the plan copies
        lm.lm_head.weight.mul_(2.0)
    compare_steps(lm, lib, ids, steps=2)


def test_an_id_outside_the_vocabulary_is_never_read(lib):
    """The kernel checks every row's id before anything else: a bad id in any row leaves the whole cache (its
    tensors and `valid`) as it was, and the caller runs the modules, which raise; so do more rows than the cache
    holds, or more than one id per row (the kernel would write past the cache)."""
    lm = model(odd_config(), torch.float32)
    cache = HybridCache(lm.config, 2, 8)
    with torch.no_grad():
        lm(torch.randint(3, 301, (2, 4)), cache=cache)
        cache.valid[:, 4] = False  # a column a reused cache may hold: the step would mark it
        before = [t.clone() for t in cache.tensors()] + [cache.valid.clone()]
        for bad in ([[301], [5]], [[5], [-1]], [[5], [6], [7]], [[5, 6], [7, 8]]):  # ids; rows or columns too many
            assert cpu_decode.run_step(lm, lib, torch.tensor(bad), cache) is None  # the modules raise
        assert cache.length == 4
        assert all(torch.equal(a, b) for a, b in zip(before, [*cache.tensors(), cache.valid]))


def test_the_step_marks_its_column_and_follows_replaced_cache_tensors(lib):
    """The step writes `valid` at the new position itself (as `HybridCache.mark` does), and the cache pointers it
    remembers per cache are re-read when a tensor of the cache is replaced."""
    lm = model(odd_config(), torch.float32)
    ids = torch.randint(3, 301, (1, 4))
    caches = [HybridCache(lm.config, 1, 8) for _ in range(2)]
    with torch.no_grad():
        for c in caches:
            lm(ids, cache=c)
            c.valid[:, 4:] = False
        tok = torch.tensor([[7]])
        want = lm(tok, cache=caches[0]).logits[:, -1]
        got = cpu_decode.run_step(lm, lib, tok, caches[1])
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert caches[1].valid[0, :5].all() and not caches[1].valid[0, 5:].any()
        for c in caches:  # the same states in new tensors
            c.layers[0].ssm = c.layers[0].ssm.clone()
            c.layers[1].k = c.layers[1].k.clone()
        want = lm(tok, cache=caches[0]).logits[:, -1]
        got = cpu_decode.run_step(lm, lib, tok, caches[1])
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        for a, b in zip(caches[0].tensors(), caches[1].tensors()):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_weights_changed_between_batches_are_seen(lib, monkeypatch):
    """`step_fn` checks the weights once per batch (not per token): a change between two generations is used by
    the second, through the fused step."""
    lm = model(odd_config(), torch.float32, seed=3)
    ids = torch.randint(3, 301, (1, 6))
    calls = []
    real = cpu_decode.run_step
    monkeypatch.setattr(cpu_decode, "run_step", lambda *a: calls.append(1) or real(*a))
    with cpu_decode.override(lib.isa if lib.isa == "portable" else "auto"):
        first = generate_ids(lm, ids, max_new_tokens=6)
        with torch.no_grad():
            lm.lm_head.weight.mul_(-1.0)  # every greedy choice changes
        second = generate_ids(lm, ids, max_new_tokens=6)
    with cpu_decode.override("off"):
        want = generate_ids(lm, ids, max_new_tokens=6)
    assert len(calls) == 10 and torch.equal(second, want) and not torch.equal(first, second)


def test_a_full_cache_raises_as_the_modules_do(lib):
    lm = model(odd_config(), torch.float32)
    cache = HybridCache(lm.config, 1, 4)
    with torch.no_grad():
        lm(torch.randint(3, 301, (1, 4)), cache=cache)
        with pytest.raises(ContextLengthError):
            cpu_decode.run_step(lm, lib, torch.tensor([[5]]), cache)


class _OtherLinear(torch.nn.Linear):
    """Any Linear with its own forward (the quantized layers of vl/quant/linear.py are such modules)."""


@pytest.mark.parametrize("what", ["moe-groups", "other-linear", "gelu", "bias", "off"])
def test_what_the_step_does_not_cover_keeps_the_modules(lib, what):
    cfg = odd_config()
    if what == "moe-groups":
        cfg = odd_config(pattern="ME", n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=8,
                         moe_shared_expert_intermediate_size=8, n_group=2, topk_group=1)
    elif what == "gelu":
        cfg = odd_config(mlp_hidden_act="gelu")
    elif what == "bias":
        cfg = odd_config(mlp_bias=True)
    lm = model(cfg, torch.float32)
    if what == "other-linear":
        lm.backbone.layers[1].mixer.k_proj = _OtherLinear(40, 24, bias=False)
    with cpu_decode.override("off" if what == "off" else lib.isa if lib.isa == "portable" else "auto"):
        reason = cpu_decode.unsupported(lm) if what != "off" else cpu_decode.status()
        assert reason is not None
        assert cpu_decode.step_fn(lm) is None
        ids = torch.randint(3, 301, (1, 5))
        with cpu_decode.override("off"):
            want = generate_ids(lm, ids, max_new_tokens=3)
        assert torch.equal(generate_ids(lm, ids, max_new_tokens=3), want)  # the modules' own decode



def test_a_forward_hook_sends_the_step_through_the_modules(lib, monkeypatch):
    """A hook on the model (a probe, a step counter) must see every decode step: the fused step would skip it.
    The tokens stay those of the modules."""
    lm = model(odd_config(), torch.float32, seed=2)
    ids, mask = left_pad([torch.randint(3, 301, (n,)) for n in (6, 10)])
    with cpu_decode.override("off"):
        want = generate_ids(lm, ids, attention_mask=mask, max_new_tokens=8)
    fused, seen = [], []
    real = cpu_decode.run_step
    monkeypatch.setattr(cpu_decode, "run_step", lambda *a: fused.append(1) or real(*a))
    handle = lm.register_forward_hook(lambda *_: seen.append(1))
    try:
        with cpu_decode.override(lib.isa if lib.isa == "portable" else "auto"):
            got = generate_ids(lm, ids, attention_mask=mask, max_new_tokens=8)
    finally:
        handle.remove()
    assert not fused and len(seen) == 8  # the prefill and every decode step went through the hooked modules
    assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", ["plain", "down_proj by rows"])
@pytest.mark.parametrize("heads", [{}, {"num_attention_heads": 12, "head_dim": 16}])
def test_one_thread_and_several_give_the_same_bits(lib, dtype, rows, heads):
    """The step splits output rows and heads between OpenMP threads, each computed whole by one thread, and runs a
    plain loop for one thread: from one prefilled cache, logits and caches are bit for bit the same at 1 and 3
    threads (the prefill runs once: torch's own products need not give the same bits at another thread count)."""
    lm = down_by_rows(models(odd_config(**heads), dtype, seed=2)[0], rows != "plain")
    ids, mask = left_pad([torch.randint(3, 301, (n,)) for n in (5, 8, 2)])
    prefilled = HybridCache(lm.config, 3, 16, dtype=dtype)
    with torch.no_grad():
        lm(ids, cache=prefilled, attention_mask=mask, logits_to_keep=1)
    out = []
    threads = torch.get_num_threads()
    try:
        for n in (1, 3):
            torch.set_num_threads(n)
            cache = copy.deepcopy(prefilled)
            logits = [cpu_decode.run_step(lm, lib, ids[:, -1:] + i, cache) for i in range(3)]
            out.append(logits + list(cache.tensors()))
    finally:
        torch.set_num_threads(threads)
    assert len(out[0]) == len(out[1]) > 3
    for a, b in zip(*out):
        assert torch.equal(a, b)


def _rows(cache: HybridCache, rows: slice) -> HybridCache:
    """Some rows of a cache as a cache of their own (the values copied)."""
    out = copy.deepcopy(cache)
    out.valid = cache.valid[rows].clone()
    out.batch_size = out.valid.shape[0]
    for layer in out.layers:
        for name, t in vars(layer).items() if layer is not None else ():
            setattr(layer, name, t[rows].clone())
    return out


def thirteen_rows_alone(lm, lib, dtype, lengths=(5, 8, 2, 7, 3, 6, 4, 8, 1, 5, 6, 2, 7)):
    """13 (or len(lengths)) left-padded prompts prefilled into one cache, and each row's next step decoded alone from
    its copy -> (ids, mask, last tokens, the prefilled cache, [(logits, cache tensors)] per row)."""
    ids, mask = left_pad([torch.randint(3, 301, (n,)) for n in lengths])
    prefilled = HybridCache(lm.config, ids.shape[0], 16, dtype=dtype)
    with torch.no_grad():
        lm(ids, cache=prefilled, attention_mask=mask, logits_to_keep=1)
    tok = ids[:, -1:]
    alone = []
    for i in range(ids.shape[0]):
        cache = _rows(prefilled, slice(i, i + 1))
        alone.append((cpu_decode.run_step(lm, lib, tok[i:i + 1], cache), list(cache.tensors())))
    return ids, mask, tok, prefilled, alone


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", ["plain", "down_proj by rows"])
@pytest.mark.parametrize("widths", ["odd", "multiples of 32"])
def test_a_row_gets_the_same_bits_in_every_batch_size(lib, dtype, rows, widths):
    """Dense rows go through the weights 1, 4 or 8 at a time (2-3 padded to 4, 5-7 to 8, more in groups of 8; on
    AMX bf16 up to 32: 9-15 padded to 16, 17-23 to 24, 25-31 to 32): each row keeps its own accumulators in the same order, so from the same
    cache a row's logits and cache are bit for bit those of the row decoded alone, whatever the batch size and its
    row's place in the group. Input widths that are multiples of 32 take the tiles' gathered output, odd ones the
    scalar tail loop."""
    changes = {} if widths == "odd" else {"hidden_size": 64, "intermediate_size": 96, "mamba_head_dim": 16}
    lm = down_by_rows(models(odd_config(**changes), dtype, seed=3)[0], rows != "plain")
    lengths = (5, 8, 2, 7, 3, 6, 4, 8, 1, 5, 6, 2, 7, 3, 8, 4) * 2
    ids, mask, tok, prefilled, alone = thirteen_rows_alone(lm, lib, dtype, lengths)
    for b in (2, 3, 4, 5, 7, 8, 9, 13, 16, 17, 24, 27, 32):
        cache = _rows(prefilled, slice(0, b))
        logits = cpu_decode.run_step(lm, lib, tok[:b], cache)
        for i in range(b):
            want_logits, want_tensors = alone[i]
            assert torch.equal(logits[i:i + 1], want_logits), (b, i)
            for k, (mine, one) in enumerate(zip(cache.tensors(), want_tensors)):
                assert torch.equal(mine[i:i + 1], one), (b, i, k)


def moe_config(**changes) -> LMConfig:
    """A MoE stack on odd widths: 8 routed experts, 3 per token, a shared expert, next to the other layer kinds."""
    base = dict(pattern="ME*E-M", n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=24,
                moe_shared_expert_intermediate_size=20, routed_scaling_factor=2.5)
    return odd_config(**{**base, **changes})


def split_experts(lm):
    from vl.quant.experts import split_fused_experts

    split_fused_experts(lm)
    return lm


def follow_the_modules(lm, lib, ids, mask=None, steps=6):
    """Decode `steps` tokens through the modules and the fused step from two caches, both fed the modules' greedy
    token. MoE routing is discontinuous, so a bf16 model is held to the modules it mirrors (not to the fp32 model,
    from which a near-tied router choice may flip in both bf16 paths at once): logits within 1e-4 of their scale in
    fp32 and 2 bf16 steps in bf16, the same greedy tokens, and the caches alike."""
    dtype = lm.backbone.embeddings.weight.dtype
    tol = 1e-4 if dtype == torch.float32 else 2 * 2.0 ** -8
    caches = [HybridCache(lm.config, ids.shape[0], ids.shape[1] + steps + 1, dtype=dtype) for _ in range(2)]
    with torch.no_grad():
        for c in caches:
            lm(ids, cache=c, attention_mask=mask, logits_to_keep=1)
        tok = ids[:, -1:]
        for _ in range(steps):
            want = lm(tok, cache=caches[0]).logits[:, -1]
            got = cpu_decode.run_step(lm, lib, tok, caches[1])
            assert got is not None and got.dtype == torch.float32 and got.shape == want.shape
            assert (got - want).abs().max() <= tol * want.abs().max()
            assert torch.equal(got.argmax(-1), want.argmax(-1))
            tok = want.argmax(-1, keepdim=True)
    for mine, theirs in zip(caches[1].layers, caches[0].layers):
        for name in vars(theirs) if theirs is not None else ():
            a, b = getattr(mine, name).float(), getattr(theirs, name).float()
            assert (a - b).abs().max() <= 8 * tol * b.abs().max().clamp_min(1e-3), name


def moe_pattern(dtype) -> str:
    """Every layer kind in fp32; in bf16 MoE layers alone. Routing is discontinuous: the other kinds' fused loops
    round a bf16 output one step off the modules now and then (tested above), and a router fed that input can pick
    another expert where two scores nearly tie, in one path and not the other."""
    return "ME*E-M" if dtype == torch.float32 else "EE"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["fused", "split"])
@pytest.mark.parametrize("norm_topk", [True, False])
def test_fused_step_equals_the_modules_with_moe_layers(lib, dtype, layout, norm_topk):
    """MoE layers (router, routed experts held fused (E, out, in) or one Linear each, shared expert) in the step:
    one row, then a padded batch whose rows route to different experts."""
    lm = model(moe_config(norm_topk_prob=norm_topk, pattern=moe_pattern(dtype)), dtype, seed=2)
    if layout == "split":
        split_experts(lm)
    assert cpu_decode.unsupported(lm) is None
    follow_the_modules(lm, lib, torch.randint(3, lm.config.vocab_size, (1, 9)))
    ids, mask = left_pad([torch.randint(3, 301, (n,)) for n in (4, 11, 7)])
    follow_the_modules(lm, lib, ids, mask)


def packed(lm, fmt: str, which):
    """The Linears whose names `which` accepts swapped for weight-only NVFP4 or (per-channel) FP8 ones, as a packed
    checkpoint loads them."""
    from vl.quant.fp8 import quantize_fp8_per_channel
    from vl.quant.linear import swap_quantized_linears
    from vl.quant.nvfp4 import quantize_nvfp4

    sd = {}
    for name, mod in lm.named_modules():
        if isinstance(mod, torch.nn.Linear) and which(name):
            if fmt == "nvfp4":
                p, bs, gs = quantize_nvfp4(mod.weight.float())
                sd.update({f"{name}.weight": p, f"{name}.weight_scale": bs, f"{name}.weight_scale_2": gs})
            else:
                w8, scale = quantize_fp8_per_channel(mod.weight.float())
                sd.update({f"{name}.weight": w8, f"{name}.weight_scale": scale})
    swap_quantized_linears(lm, sd, "weight-only", compute_dtype=lm.backbone.embeddings.weight.dtype)
    return lm


def packed_experts(lm, fmt: str):
    """The routed experts split and packed."""
    split_experts(lm)
    return packed(lm, fmt, lambda name: ".experts.up_proj." in name + "." or ".experts.down_proj." in name + ".")


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_step_equals_the_modules_with_packed_experts(lib, dtype, fmt):
    """Packed NVFP4 (the 30B-A3B geometry's load) or FP8 routed experts: the step runs each projection's experts of
    all rows as one kernel group; the modules run them through ExpertList.project. Same weights and roundings: fp32
    to summation order, bf16 within a few bf16 steps, and the same greedy tokens."""
    from vl.kernels import gemv

    if gemv.kernel() is None:
        pytest.skip("the packed kernel does not build here, so packed experts keep the modules (tested elsewhere)")
    cfg = moe_config(hidden_size=64, moe_intermediate_size=48, moe_shared_expert_intermediate_size=32,
                     intermediate_size=64, pattern=moe_pattern(dtype))
    lm = packed_experts(model(cfg, dtype, seed=3, std=0.1), fmt)
    assert cpu_decode.unsupported(lm) is None
    ids, mask = left_pad([torch.randint(3, 301, (n,)) for n in (5, 9)])
    follow_the_modules(lm, lib, ids, mask)
    follow_the_modules(lm, lib, ids[1:])


def packed_linears(lm, fmt: str):
    """Every Linear but the LM head packed."""
    return packed(lm, fmt, lambda name: name != "lm_head")


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_packed_row_gets_the_same_bits_in_every_batch_size(lib, dtype, fmt):
    """Packed rows go through the weights four at a time, each row with its own accumulators in one order: a row's
    logits and cache are bit for bit those of the row decoded alone, whatever the batch size (and a row alone is
    held to the reference by the kernel twins); in fp32 the step also follows the modules on a batch of 9."""
    from vl.kernels import gemv

    if gemv.kernel() is None:
        pytest.skip("the packed kernel does not build here, so packed layers keep the modules (tested elsewhere)")
    cfg = odd_config(hidden_size=64, intermediate_size=64, mamba_num_heads=4, mamba_head_dim=16, head_dim=16,
                     ssm_state_size=16)
    lm = packed_linears(model(cfg, dtype, seed=5, std=0.1), fmt)
    assert cpu_decode.unsupported(lm) is None
    ids, mask, tok, prefilled, alone = thirteen_rows_alone(lm, lib, dtype)
    for b in (2, 4, 5, 8, 9, 13):
        cache = _rows(prefilled, slice(0, b))
        logits = cpu_decode.run_step(lm, lib, tok[:b], cache)
        for i in range(b):
            assert torch.equal(logits[i:i + 1], alone[i][0]), (b, i)
            for k, (mine, one) in enumerate(zip(cache.tensors(), alone[i][1])):
                assert torch.equal(mine[i:i + 1], one), (b, i, k)
    if dtype == torch.float32:
        follow_the_modules(lm, lib, ids[:9], mask[:9])
