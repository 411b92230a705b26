"""Feed-forward mixers of Nemotron-H: the dense `-` MLP, down(act(up(x))) with ReLU² (no gate), and the
`E` mixture of experts of the Nemotron 3 family (transformers `NemotronHMoE`): sigmoid router with a
score-correction bias, group-limited top-k, optional latent projection around the routed experts, and
one always-on shared expert."""

from __future__ import annotations

import torch
from torch import nn

from vl.config import LMConfig
from vl.kernels import gemm


def activation(name: str):
    """The MLP activation. ReLU² rectifies in place (its input is always the fresh up-projection output,
    which no backward needs): one full-size temporary fewer per MLP on long prefills; without autograd it
    squares in place too (a 12B prefill's 2048 x 20480 activations: 80 MiB of bf16)."""
    if name == "relu2":
        return lambda x: torch.relu_(x).square() if torch.is_grad_enabled() else torch.relu_(x).square_()
    return {"gelu": nn.functional.gelu, "silu": nn.functional.silu, "relu": torch.relu}[name]


class MLP(nn.Module):
    def __init__(self, cfg: LMConfig, hidden: int | None = None):
        super().__init__()
        hidden = hidden or cfg.intermediate_size
        self.up_proj = nn.Linear(cfg.hidden_size, hidden, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(hidden, cfg.hidden_size, bias=cfg.mlp_bias)
        self.act = activation(cfg.mlp_hidden_act)
        self.hidden_act = cfg.mlp_hidden_act

    def forward(self, x):
        return self.down_proj(self.act(self.up_proj(x)))


class Router(nn.Module):
    """DeepSeek-V3-style routing as Nemotron 3 uses it: choose with scores + bias, weight with raw scores."""

    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.top_k, self.n_group, self.topk_group = cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group
        self.norm_topk_prob, self.scale = cfg.norm_topk_prob, cfg.routed_scaling_factor
        self.weight = nn.Parameter(torch.zeros(cfg.n_routed_experts, cfg.hidden_size, dtype=torch.float32))
        self.register_buffer("e_score_correction_bias", torch.zeros(cfg.n_routed_experts, dtype=torch.float32))

    def forward(self, x):  # x (N, d) -> weights (N, k) fp32, experts (N, k)
        scores = nn.functional.linear(x.float(), self.weight.float()).sigmoid()  # (N, E)
        choice = scores + self.e_score_correction_bias
        if self.n_group > 1:
            n, e = choice.shape
            grouped = choice.view(n, self.n_group, e // self.n_group)
            group_score = grouped.topk(2, dim=-1).values.sum(-1)  # (N, G)
            keep = torch.zeros_like(group_score, dtype=torch.bool)
            keep.scatter_(1, group_score.topk(self.topk_group, dim=-1).indices, True)
            choice = choice.masked_fill(~keep.repeat_interleave(e // self.n_group, dim=1), -torch.inf)
        experts = choice.topk(self.top_k, dim=-1).indices
        weights = scores.gather(1, experts)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return weights * self.scale, experts


def _expert(w, e: int, x):
    """Routed expert e's projection of x: row e of a fused (E, out, in) tensor, or module e where the experts are
    held one Linear each (vl/quant/experts.py: packed FP8 / NVFP4 experts). Only expert e's weights are read. The
    row count differs per expert and per chunk, so the product goes through `gemm.linear` (rounded row counts on
    the CPU, vl/kernels/gemm.py), as the packed experts' many-row products do."""
    return w[e](x) if isinstance(w, nn.ModuleList) else gemm.linear(x, w[e])


def expert_count(w) -> int:
    """How many routed experts a fused (E, out, in) tensor or a list of per-expert modules holds."""
    return len(w) if isinstance(w, nn.ModuleList) else w.shape[0]


def _experts(w, ids: list[int], x):
    """Routed experts ids' projections: x (1, in) for every one of them, or (k, in) with row i for expert ids[i]
    -> (k, out). A list of per-expert modules that can (vl/quant/experts.py `ExpertList.project`) runs them in one
    call, with each expert's own bits."""
    if hasattr(w, "project"):
        return w.project(ids, x)
    return torch.cat([_expert(w, e, x if x.shape[0] == 1 else x[i:i + 1]) for i, e in enumerate(ids)])


class MoE(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        d_in = cfg.moe_latent_size or cfg.hidden_size
        self.gate = Router(cfg)
        # fused expert weights (E, out, in), as transformers holds them; the hub stores experts.{i}.*
        self.experts = nn.Module()
        self.experts.up_proj = nn.Parameter(torch.empty(cfg.n_routed_experts, cfg.moe_intermediate_size, d_in))
        self.experts.down_proj = nn.Parameter(torch.empty(cfg.n_routed_experts, d_in, cfg.moe_intermediate_size))
        nn.init.normal_(self.experts.up_proj, std=0.02)
        nn.init.normal_(self.experts.down_proj, std=0.02)
        self.shared_experts = MLP(cfg, cfg.moe_shared_expert_intermediate_size)
        if cfg.moe_latent_size:
            self.fc1_latent_proj = nn.Linear(cfg.hidden_size, cfg.moe_latent_size, bias=cfg.mlp_bias)
            self.fc2_latent_proj = nn.Linear(cfg.moe_latent_size, cfg.hidden_size, bias=cfg.mlp_bias)
        else:
            self.fc1_latent_proj = self.fc2_latent_proj = nn.Identity()
        self.act = activation(cfg.mlp_hidden_act)

    def forward(self, x):
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        weights, experts = self.gate(flat)  # (N, k)
        h = self.fc1_latent_proj(flat)
        out = torch.zeros(h.shape, dtype=torch.float32, device=h.device)
        up, down = self.experts.up_proj, self.experts.down_proj
        if flat.shape[0] == 1:  # one token (decode): its k experts in the same (ascending) order, no gather
            order = sorted(zip(experts[0].tolist(), weights[0].tolist()))
            ids = [e for e, _ in order]
            y = _experts(down, ids, self.act(_experts(up, ids, h)))  # (k, d): row i from expert ids[i]
            for i, (_, w) in enumerate(order):
                out[0] += y[i].float() * w
        else:  # the (token, slot) pairs sorted by expert once: each expert's tokens are one slice of the order
            k = experts.shape[1]
            chosen = experts.reshape(-1)
            order = torch.argsort(chosen, stable=True)  # within an expert, tokens in increasing order
            token = order // k
            slot_weight = weights.reshape(-1)[order]
            start = 0
            for e, n in enumerate(torch.bincount(chosen, minlength=expert_count(up)).tolist()):
                if n:
                    s = slice(start, start + n)
                    y = _expert(down, e, self.act(_expert(up, e, h.index_select(0, token[s]))))
                    # experts in increasing order, as a token's k terms are added (the decode branch's order)
                    out.index_add_(0, token[s], y.float().mul_(slot_weight[s, None]))
                    start += n
        out = self.fc2_latent_proj(out.to(x.dtype))
        return out.view(shape) + self.shared_experts(x)
