"""The MoE forward reads only the routed experts' weights, and its three ways of holding them agree: fused (E, out,
in) tensors (the library's load), one Linear per expert (vl/quant/experts.py `split_fused_experts`), and one packed
NVFP4 / FP8 Linear per expert (the 30B geometry's load, vl/bench/omni_geometry.py). The reference is the MoE loop as
it was before the one-token path and the per-expert modules (transformers' loop over the hit experts)."""

import copy
import math

import pytest
import torch

from vl.config import nano3_30b_a3b_lm
from vl.modeling.mlp import MoE
from vl.quant.experts import hub_to_split_name, routed_expert_bytes, split_fused_experts


def small(**changes):
    base = dict(hidden_size=64, moe_intermediate_size=32, moe_shared_expert_intermediate_size=48, n_routed_experts=8,
                num_experts_per_tok=3, vocab_size=256)
    return nano3_30b_a3b_lm(**{**base, **changes})


def reference(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """The fused-tensor loop the MoE ran before: every hit expert, its tokens gathered, added back in fp32."""
    flat = x.reshape(-1, x.shape[-1])
    weights, experts = moe.gate(flat)
    out = torch.zeros(flat.shape, dtype=torch.float32)
    for e in experts.unique().tolist():
        token, slot = torch.where(experts == e)
        y = moe.act(flat[token] @ moe.experts.up_proj[e].t()) @ moe.experts.down_proj[e].t()
        out.index_add_(0, token, y.float() * weights[token, slot, None])
    return out.to(x.dtype).view(x.shape) + moe.shared_experts(x)


def make_moe(seed=0, **changes):
    torch.manual_seed(seed)
    moe = MoE(small(**changes)).to(torch.bfloat16)
    with torch.no_grad():
        moe.gate.weight.normal_(std=0.5)  # routing that differs between tokens
        moe.gate.e_score_correction_bias.normal_(std=0.1)
    return moe.eval()


@pytest.mark.parametrize("tokens", [1, 7, 300])
@torch.no_grad()
def test_fused_forward_equals_the_reference_loop(tokens):
    """Bit for bit, up to prompt-sized calls (300 tokens: ~110 rows per expert), so a token's k terms are added in
    the reference's order (experts in increasing order)."""
    moe = make_moe()
    x = torch.randn(1, tokens, 64, dtype=torch.bfloat16)
    torch.testing.assert_close(moe(x), reference(moe, x), rtol=0, atol=0)


@torch.no_grad()
def test_one_token_equals_its_row_of_a_batch():
    """The one-token (decode) path adds the same experts in the same order as the gather path of a longer call."""
    moe = make_moe(seed=1)
    x = torch.randn(1, 5, 64, dtype=torch.bfloat16)
    batch = moe(x)
    for t in range(5):
        torch.testing.assert_close(moe(x[:, t:t + 1]), batch[:, t:t + 1], rtol=1.6e-2, atol=1e-3)


@pytest.mark.parametrize("tokens", [1, 6])
@torch.no_grad()
def test_split_experts_hold_the_same_rows_and_give_the_same_output(tokens):
    fused = make_moe(seed=2)
    split = copy.deepcopy(fused)
    assert split_fused_experts(split) == ["experts.up_proj", "experts.down_proj"]
    ups = split.experts.up_proj
    assert isinstance(ups, torch.nn.ModuleList) and len(ups) == 8
    assert torch.equal(ups[3].weight, fused.experts.up_proj[3]) and ups[3].bias is None
    assert routed_expert_bytes(split) == routed_expert_bytes(fused) == 2 * 8 * 32 * 64 * 2
    x = torch.randn(1, tokens, 64, dtype=torch.bfloat16)
    torch.testing.assert_close(split(x), fused(x), rtol=0, atol=0)
    assert set(split.state_dict()) >= {"experts.up_proj.0.weight", "experts.down_proj.7.weight"}


@torch.no_grad()
def test_decode_reads_only_the_routed_experts():
    """Every expert the router did not choose for the token is NaN: a forward that read any of them would be NaN."""
    for layout in ("fused", "split"):
        moe = make_moe(seed=3)
        if layout == "split":
            split_fused_experts(moe)
        x = torch.randn(1, 1, 64, dtype=torch.bfloat16)
        want = moe(x)
        chosen = set(moe.gate(x.reshape(1, -1))[1][0].tolist())
        assert len(chosen) == 3
        for e in set(range(8)) - chosen:
            for proj in ("up_proj", "down_proj"):
                held = getattr(moe.experts, proj)
                (held[e] if layout == "fused" else held[e].weight).fill_(math.nan)
        got = moe(x)
        assert torch.isfinite(got).all(), layout
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        two = torch.randn(1, 2, 64, dtype=torch.bfloat16)  # a poisoned expert that another token routes to shows
        if set(moe.gate(two.reshape(2, -1))[1].flatten().tolist()) - chosen:
            assert not torch.isfinite(moe(two)).all()


def test_hub_names_map_onto_split_names():
    assert (hub_to_split_name("backbone.layers.1.mixer.experts.17.down_proj.weight_scale_2")
            == "backbone.layers.1.mixer.experts.down_proj.17.weight_scale_2")
    for same in ("backbone.layers.1.mixer.shared_experts.up_proj.weight", "backbone.layers.1.mixer.gate.weight",
                 "backbone.layers.1.mixer.experts.up_proj"):
        assert hub_to_split_name(same) == same


def packed_moe(seed=4, fmt="nvfp4", **changes):
    """`make_moe` with its experts split and swapped for weight-only NVFP4 (the 30B geometry's load) or per-channel
    FP8 Linears."""
    from vl.quant.fp8 import quantize_fp8_per_channel
    from vl.quant.linear import swap_quantized_linears
    from vl.quant.nvfp4 import quantize_nvfp4

    moe = make_moe(seed, **changes)
    split_fused_experts(moe)
    sd = {}
    for proj in ("up_proj", "down_proj"):
        for e, lin in enumerate(getattr(moe.experts, proj)):
            w = lin.weight.float() * (1 + e % 3)  # scales differ between experts
            name = f"experts.{proj}.{e}"
            if fmt == "nvfp4":
                p, bs, gs = quantize_nvfp4(w)
                sd.update({f"{name}.weight": p, f"{name}.weight_scale": bs, f"{name}.weight_scale_2": gs})
            else:
                w8, scale = quantize_fp8_per_channel(w)
                sd.update({f"{name}.weight": w8, f"{name}.weight_scale": scale})
    swap_quantized_linears(moe, sd, "weight-only", compute_dtype=torch.bfloat16)
    return moe


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@torch.no_grad()
def test_packed_experts_of_one_token_run_as_one_call_with_each_experts_bits(monkeypatch, dtype, fmt):
    """Decode through packed NVFP4 / FP8 experts: the grouped kernel call (vl/quant/experts.py `ExpertList.project`) gives
    the bits of calling each expert's module, twice in a row, and again after an expert's weights change in place
    and after they are replaced by a new tensor (the bound pointers re-bind: a stale one would read the old bytes)."""
    from vl.kernels import gemv
    from vl.quant.experts import ExpertList

    if gemv.kernel() is None:
        pytest.skip("the fused CPU kernel does not build here: the experts run one by one (tested above)")
    moe = packed_moe(fmt=fmt).to(dtype) if dtype == torch.float32 else packed_moe(fmt=fmt)
    assert isinstance(moe.experts.up_proj, ExpertList)
    calls = []
    real = getattr(gemv.Kernel, f"{fmt}_group")
    monkeypatch.setattr(gemv.Kernel, f"{fmt}_group", lambda self, *a: calls.append(1) or real(self, *a))
    grouped = ExpertList._grouped

    def both(x):
        ExpertList._grouped = grouped
        fast = moe(x)
        ExpertList._grouped = lambda self, ids, x: None
        try:
            return fast, moe(x)
        finally:
            ExpertList._grouped = grouped

    for seed in (0, 1):
        x = torch.randn(1, 1, 64, generator=torch.Generator().manual_seed(seed)).to(dtype)
        fast, slow = both(x)
        assert torch.equal(fast, slow)
    assert len(calls) == 4  # up and down, two tokens: one kernel call each
    e = moe.gate(x.reshape(1, -1))[1][0, 0].item()  # an expert this token uses
    down = moe.experts.down_proj
    before = moe(x)
    down[e].weight.copy_(down[(e + 1) % 8].weight)
    fast, slow = both(x)
    assert torch.equal(fast, slow) and not torch.equal(fast, before)
    old = down[e].weight
    down[e].weight = down[(e + 2) % 8].weight.clone()
    old.fill_(0)  # what a stale pointer would read
    fast, slow = both(x)
    assert torch.equal(fast, slow) and not torch.equal(fast, before)
