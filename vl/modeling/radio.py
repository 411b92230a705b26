"""RADIO vision encoder (C-RADIOv2-H, the vision tower of Nemotron Nano V2 VL).

A plain timm ViT (timm `Block` = pre-norm LayerNorm(eps 1e-6) -> `Attention` (qkv bias, SDPA) ->
`Mlp` (exact GELU)) behind RADIO's patch generator (NVlabs/RADIO `vit_patch_generator.py`):
a bias-free linear patch embedding over patches flattened in (channel, row, col) order, a "cropped
position embedding" (CPE) resized from a `cpe_max_size / patch` square grid, and K cls + register
tokens prepended without position embedding. There is no final norm (RADIO replaces it with
Identity) and every prefix token is dropped from the output: the VLM only consumes patch tokens.
Reference facts: docs/format.md §5; numerics are tested against
transformers' `RadioModel`.

Parameter names equal the checkpoint keys under `vision_model.radio_model.model.` (docs/format.md §3.1), so a
loader strips that prefix and loads strictly. K is `patch_generator.cls_token.token.shape[0]` of the
checkpoint; the caller reads it and passes `num_prefix_tokens`.

Nemotron 3 Nano Omni's tower adds two things (transformers `RadioPatchEmbeddings.embed_video`, docs/format.md
§3.7): a second, bias-free patch embedding `patch_generator.video_embedder` for tubelets, T consecutive frames
stacked on the channel axis (T*3 channels, each patch flattened (t, c, row, col)), chosen by the channel count;
and native-resolution images arriving as already-flattened patches with their grid (`forward_patches`).
transformers' RADIO also carries LayerScale (`layer_scale{1,2}.lambda1`, 1.0 in C-RADIO); `layer_scale=True`
builds timm's `LayerScale` (`ls1.gamma`, `ls2.gamma`) for checkpoints that store it.

In bf16 on a CPU with native bf16 GEMM, inference runs each block through `fused_block` (`encoder.fused_cpu`, on by
default): oneDNN products with bias, GELU and the residual add as post-ops, and the attention on AMX tiles where the
CPU has them (vl/kernels/attention.py, else torch's SDPA): the same maths as timm's modules, one bf16 rounding fewer
per fused step. oneDNN reorders each weight into its blocked layout per call; `encoder.pack_weights = True` keeps
the reordered weights instead (a second copy of the tower's matrices, 1.26 GB for ViT-H, for 2-7% of the tower's
time: docs/benchmarks.md, "The vision tower on the CPU"). `fused_cpu_off` names why the path does not apply (off,
fp32, autograd, other devices); there timm's modules run.
"""

from __future__ import annotations

import functools
import logging
import weakref
from functools import partial

import timm
import torch
import torch.nn.functional as F
from timm.models.vision_transformer import Attention, Block, Mlp
from torch import nn
from torch.nn.modules import module as nn_module

from vl.errors import ConfigError, InputError
from vl.kernels import attention
from vl.kernels.gemm import native_16bit

log = logging.getLogger(__name__)

# ViT names that RADIO registers into timm itself (NVlabs/RADIO `radio/extra_timm_models.py`), so
# they are absent from a plain timm install. vit_huge_patch16_224 is the Nano V2 VL tower; the same
# table is vLLM's `VIT_TIMM_DIM_BY_NAME`. Variants with extra parts (`vit_bigG_patch14_224` has
# LayerScale, `*_mlpnorm` an MLP norm) are deliberately left out: this encoder does not build them.
RADIO_EXTRA_VITS: dict[str, tuple[int, int, int, int]] = {
    "vit_tiny_patch14_224": (192, 12, 3, 768),
    "vit_small_patch14_224": (384, 12, 6, 1536),
    "vit_base_patch14_224": (768, 12, 12, 3072),
    "vit_huge_patch16_224": (1280, 32, 16, 5120),
    "vit_giant_patch16_224": (1536, 40, 24, 6144),
}

LAYER_NORM_EPS = 1e-6  # timm ViT / RADIO


class TileShapeError(InputError):
    """Pixel tiles whose shape the encoder cannot take (wrong rank, channels, or not patch-aligned)."""

    code = "bad_tile_shape"


@functools.lru_cache(maxsize=None)
def vit_dims(name: str) -> tuple[int, int, int, int]:
    """(dim, depth, heads, mlp_dim) of a timm ViT name as used in `vision_config.args.model`.

    Names RADIO registers itself come from `RADIO_EXTRA_VITS`; every other name is built by timm's
    own registry on the meta device (no memory, no weights), so its default args are timm's, and
    refused if its blocks hold parts this encoder lacks (LayerScale, qk-norm, MLP norm, other MLPs).
    """
    if name in RADIO_EXTRA_VITS:
        return RADIO_EXTRA_VITS[name]

    if not timm.is_model(name):
        raise ConfigError(
            f"vision_config.args.model: expected a timm ViT name (or one of RADIO's "
            f"{sorted(RADIO_EXTRA_VITS)}), found {name!r}; check the checkpoint's config.json"
        )
    model = timm.create_model(name, pretrained=False, device="meta")
    blocks = getattr(model, "blocks", None)
    if not blocks or not all(type(b) is Block for b in blocks):
        raise ConfigError(f"timm model {name!r} is not a plain ViT of timm `Block`s; RADIO towers are")
    block = blocks[0]
    plain = (
        type(block.attn) is Attention
        and block.attn.qkv.bias is not None
        and isinstance(block.attn.q_norm, nn.Identity)
        and isinstance(block.attn.norm, nn.Identity)
        and isinstance(block.ls1, nn.Identity)
        and type(block.mlp) is Mlp
        and isinstance(block.mlp.norm, nn.Identity)
        and isinstance(block.mlp.act, nn.GELU)
        and block.mlp.act.approximate == "none"
    )
    if not plain:
        raise ConfigError(
            f"timm model {name!r} uses block parts this RADIO encoder does not build "
            "(expected qkv bias, no qk-norm, no LayerScale, Mlp with exact GELU); "
            "use a plain ViT name such as vit_huge_patch16_224"
        )
    return (model.embed_dim, len(blocks), block.attn.num_heads, block.mlp.fc1.out_features)


def image_to_patches(pixels: torch.Tensor, patch_size: int) -> torch.Tensor:
    """(B, C, H, W) -> (B, h*w, C*p*p): patches row-major, features in (channel, row, col) order.

    RADIO `Im2Patches`: rearrange 'b c (py yy) (px xx) -> b (py px) (c yy xx)'.
    """
    b, c, height, width = pixels.shape
    h, w, p = height // patch_size, width // patch_size, patch_size
    x = pixels.reshape(b, c, h, p, w, p)  # (B, C, h, yy, w, xx)
    return x.permute(0, 2, 4, 1, 3, 5).reshape(b, h * w, c * p * p)  # (B, h*w, C*p*p)


def cropped_pos_embed(pos_embed: torch.Tensor, grid_hw: tuple[int, int], align_corners: bool = False) -> torch.Tensor:
    """RADIO's inference-time CPE: (1, G*G, D) table -> (1, h*w, D) for an h x w patch grid.

    Resize the G x G grid to the square max(h, w) (bilinear, align_corners=False as in RADIO since
    cb07f55, Megatron training and vLLM; the llama.cpp bake and the C-RADIOv2-H remote code use True and
    diverge: `align_corners=True` gives theirs, for the benchmark that measures the difference), crop the
    top-left h x w, resize to (h, w) if that still differs. Computed in fp32.
    """
    _, n, d = pos_embed.shape
    g = int(round(n**0.5))
    if g * g != n:
        raise ConfigError(f"pos_embed: expected a square grid of positions, found {n} rows")
    h, w = grid_hw
    grid = pos_embed.reshape(1, g, g, d).permute(0, 3, 1, 2).float()  # (1, D, G, G)
    side = max(h, w)
    grid = F.interpolate(grid, size=(side, side), mode="bilinear", align_corners=align_corners)
    grid = grid[:, :, :h, :w]  # (1, D, h, w) top-left window
    if grid.shape[-2:] != (h, w):
        grid = F.interpolate(grid, size=(h, w), mode="bilinear", align_corners=align_corners)
    return grid.flatten(2).transpose(1, 2).to(pos_embed.dtype)  # (1, h*w, D)


class ClsToken(nn.Module):
    """K learned cls + register rows (RADIO `cls_token.py`); K is whatever the checkpoint holds."""

    def __init__(self, num_tokens: int, dim: int):
        super().__init__()
        self.token = nn.Parameter(torch.empty(num_tokens, dim))
        nn.init.trunc_normal_(self.token, std=0.02)


class PatchGenerator(nn.Module):
    """Patch embedding + CPE + prefix tokens (RADIO `ViTPatchGenerator`, eval path).

    With `video_temporal_patch_size` T, a second embedding (`video_embedder`) takes tubelets of T frames stacked
    on the channel axis; the channel count of the input picks the embedding, as transformers' RADIO does.
    """

    def __init__(self, dim: int, patch_size: int, cpe_max_size: int, num_prefix_tokens: int, in_chans: int = 3,
                 video_temporal_patch_size: int | None = None):
        super().__init__()
        if patch_size < 1 or cpe_max_size % patch_size:
            raise ConfigError(
                f"cpe_max_size must be a multiple of patch_size; found {cpe_max_size} and {patch_size}"
            )
        if video_temporal_patch_size is not None and video_temporal_patch_size < 2:
            raise ConfigError(f"video_temporal_patch_size: expected None or at least 2 frames per tubelet, found "
                              f"{video_temporal_patch_size} (tubelets are told from images by their channel count)")
        self.patch_size = patch_size
        self.in_chans = in_chans
        self.video_chans = None if video_temporal_patch_size is None else video_temporal_patch_size * in_chans
        self.max_grid = cpe_max_size // patch_size
        self.embedder = nn.Linear(in_chans * patch_size * patch_size, dim, bias=False)
        if self.video_chans is not None:
            self.video_embedder = nn.Linear(self.video_chans * patch_size * patch_size, dim, bias=False)
        self.pos_embed = nn.Parameter(torch.empty(1, self.max_grid * self.max_grid, dim))
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        self.cls_token = ClsToken(num_prefix_tokens, dim)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) images (C = in_chans) or tubelets (C = T * in_chans) -> (B, K + h*w, D)."""
        embedder = self.video_embedder if pixels.shape[1] == self.video_chans else self.embedder
        grid = (pixels.shape[-2] // self.patch_size, pixels.shape[-1] // self.patch_size)
        return self.embed(embedder(image_to_patches(pixels, self.patch_size)), grid)  # (B, K + h*w, D)

    def embed(self, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """Embedded patches (B, h*w, D) of an h x w grid -> CPE added, the K prefix rows in front (B, K + h*w, D)."""
        x = x + cropped_pos_embed(self.pos_embed, grid).to(x.dtype)  # position BEFORE the prefix
        prefix = self.cls_token.token.to(x.dtype).unsqueeze(0).expand(x.shape[0], -1, -1)  # (B, K, D)
        return torch.cat([prefix, x], dim=1)  # (B, K + h*w, D)


def _fixed_width_mlp(mlp_dim: int):
    """timm `Block` sizes its Mlp as int(dim * mlp_ratio); pin the exact checkpoint width instead."""

    def make(in_features: int, hidden_features: int | None = None, **kwargs) -> Mlp:
        return Mlp(in_features, hidden_features=mlp_dim, **kwargs)

    return make


class RadioEncoder(nn.Module):
    """RADIO ViT: pixels (B, 3, H, W) -> patch tokens (B, (H/p)*(W/p), D), prefix tokens dropped.

    Uniform with timm towers: `forward_features`, `num_prefix_tokens`, `embed_dim`, `patch_size`.
    H and W must be multiples of the patch size; non-square tiles are fine (CPE handles any grid).
    """

    def __init__(
        self,
        dim: int,
        depth: int,
        heads: int,
        mlp_dim: int,
        patch_size: int = 16,
        cpe_max_size: int = 2048,
        num_prefix_tokens: int = 8,
        video_temporal_patch_size: int | None = None,
        layer_scale: bool = False,
    ):
        super().__init__()
        if dim % heads:
            raise ConfigError(f"vision width must be divisible by heads; found dim={dim}, heads={heads}")
        if num_prefix_tokens < 0:
            raise ConfigError(f"num_prefix_tokens must be >= 0; found {num_prefix_tokens}")
        self.embed_dim = dim
        self.patch_size = patch_size
        self.num_prefix_tokens = num_prefix_tokens
        self.patch_generator = PatchGenerator(dim, patch_size, cpe_max_size, num_prefix_tokens,
                                              video_temporal_patch_size=video_temporal_patch_size)
        norm = partial(nn.LayerNorm, eps=LAYER_NORM_EPS)
        self.blocks = nn.ModuleList(
            Block(dim, heads, qkv_bias=True, norm_layer=norm, act_layer=nn.GELU, mlp_layer=_fixed_width_mlp(mlp_dim),
                  init_values=1.0 if layer_scale else None)
            for _ in range(depth)
        )
        for block in self.blocks:
            block.attn.fused_attn = True  # SDPA whatever TIMM_FUSED_ATTN says; tests may flip it
        self.fused_cpu = True  # the oneDNN block path on CPUs where it applies (`fused_cpu_off`); False: timm's
        self.pack_weights = False  # True: fused_block keeps each weight packed for oneDNN (a second copy)

    @classmethod
    def from_timm_name(cls, name: str, **kwargs) -> "RadioEncoder":
        """Build from `vision_config.args.model` (e.g. "vit_huge_patch16_224") plus patch/CPE/K kwargs."""
        dim, depth, heads, mlp_dim = vit_dims(name)
        return cls(dim, depth, heads, mlp_dim, **kwargs)

    def grid_size(self, height: int, width: int) -> tuple[int, int]:
        return height // self.patch_size, width // self.patch_size

    def forward_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) tiles, or tubelets of T frames (C = T*3) when the tower has a video embedder -> (B, N, D)."""
        self._check_pixels(pixels)
        return self._blocks(self.patch_generator(pixels.to(self.patch_generator.embedder.weight.dtype)))

    forward = forward_features

    def forward_patches(self, patches: torch.Tensor, grid_hw: tuple[int, int]) -> torch.Tensor:
        """One image as flattened patches (h*w, 3*p*p), each in (channel, row, col) order, row-major over its
        h x w grid (transformers' Omni image processor output) -> (h*w, D). Same maths as `forward_features`
        on the image the patches came from."""
        h, w = grid_hw
        want = self.patch_generator.in_chans * self.patch_size**2
        if patches.ndim != 2 or patches.shape != (h * w, want):
            raise TileShapeError(f"vision tower input: expected ({h * w}, {want}) patches for a {h}x{w} grid, found "
                                 f"shape {tuple(patches.shape)}")
        x = self.patch_generator.embedder(patches.to(self.patch_generator.embedder.weight.dtype))  # (h*w, D)
        return self._blocks(self.patch_generator.embed(x[None], (h, w)))[0]  # (h*w, D)

    def _blocks(self, x: torch.Tensor) -> torch.Tensor:
        if fused_cpu_off(self, x) is None:
            for block in self.blocks:  # each block's own forward hooks run around it, as `block(x)` runs them
                x = _hooked(block, x, lambda h, b=block: fused_block(b, h, self.pack_weights))  # (B, K+N, D)
        else:
            for block in self.blocks:
                x = block(x)  # (B, K+N, D)
        return x[:, self.num_prefix_tokens :]  # (B, N, D): no final norm, all prefix rows dropped

    def _check_pixels(self, pixels: torch.Tensor) -> None:
        in_chans, p = self.patch_generator.in_chans, self.patch_size
        video = self.patch_generator.video_chans
        if pixels.ndim != 4 or pixels.shape[1] not in (in_chans, video):
            also = "" if video is None else f" or (B, {video}, H, W) tubelets"
            raise TileShapeError(
                f"vision tower input: expected (B, {in_chans}, H, W) tiles{also}, found shape {tuple(pixels.shape)}"
            )
        height, width = pixels.shape[-2:]
        if height < p or width < p or height % p or width % p:
            raise TileShapeError(
                f"vision tower input: H and W must be positive multiples of the patch size {p}; "
                f"found {height}x{width}. Resize tiles in the processor (force_image_size)"
            )


# --- the CPU block path ---------------------------------------------------------------------------------------------
# timm's Block in bf16 on the CPU spends a tenth of a ViT-H tile outside its products and their attention
# (docs/benchmarks.md, "The vision tower on the CPU"): `F.linear` with a bias first copies the broadcast bias into
# the output (addmm), and GELU and both residual adds are passes of their own; and torch's CPU attention runs at a
# third of the products' rate. `fused_block` runs the same block through `torch.ops.mkldnn._linear_pointwise`: bias,
# GELU (erf, the exact one) and the residual add become post-ops of the product, applied to its fp32 accumulator
# before the one rounding of the output (one bf16 rounding fewer per fused step), and the attention through
# vl/kernels/attention.py where the CPU has AMX. It serves bf16 only: in fp32 it measured no faster than the modules
# (MKL), which keep transformers' bits.


def fused_cpu_off(encoder: "RadioEncoder", x: torch.Tensor) -> str | None:
    """Why `encoder`'s blocks run timm's modules for `x` rather than `fused_block` (None: the fused path runs)."""
    if not encoder.fused_cpu:
        return "off (encoder.fused_cpu = False)"
    if x.device.type != "cpu":
        return f"input on {x.device.type}"
    if x.dtype != torch.bfloat16:
        return f"dtype {x.dtype} (the fused path serves bf16; in fp32 it measured no faster than the modules)"
    if torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in encoder.blocks.parameters())):
        return "autograd is recording (oneDNN's fused products have no backward)"
    if torch.compiler.is_compiling():
        return "compiling"
    if not _onednn():
        return "torch was built without oneDNN"
    if not native_16bit(torch.bfloat16):
        return "no native bf16 GEMM on this CPU (AVX512-BF16 / AMX)"
    if _global_hooks():
        return "global module hooks are registered (the fused path calls no module of a block)"
    for block in encoder.blocks:
        linears = (block.attn.qkv, block.attn.proj, block.mlp.fc1, block.mlp.fc2)
        if not block.attn.fused_attn:
            return "timm's unfused attention was asked for"
        if block._forward_pre_hooks_with_kwargs or block._forward_hooks_with_kwargs or any(
                m._forward_pre_hooks or m._forward_hooks for m in block.modules() if m is not block):
            return "forward hooks on a block's layers (the fused path runs a block whole: hook the block)"
        if any(type(m) is not nn.Linear or m.weight.dtype != x.dtype or m.weight.device.type != "cpu" for m in linears):
            return "a block's linear layers are not plain CPU nn.Linear of the input's dtype"
    return None


def runs_whole(module: nn.Module) -> bool:
    """Whether the fused path runs `module` as one unit, calling none of its layers (a timm `Block`): hooks meant to
    run around its work (vl/runtime/cpu/encoder_pages.py) go on it, not on its layers."""
    return isinstance(module, Block)


def _global_hooks() -> bool:
    return bool(nn_module._global_forward_pre_hooks or nn_module._global_forward_hooks)


def _hooked(block: nn.Module, x: torch.Tensor, run) -> torch.Tensor:
    """`run(x)` in place of `block(x)`, with the block's own forward pre-hooks and hooks around it in the order
    `Module.__call__` runs them (`fused_cpu_off` sends blocks with keyword-argument hooks to the modules)."""
    for hook in block._forward_pre_hooks.values():
        res = hook(block, (x,))
        if res is not None:
            x = res[0] if isinstance(res, tuple) else res
    out = run(x)
    for hook in block._forward_hooks.values():
        res = hook(block, (x,), out)
        if res is not None:
            out = res
    return out


@functools.cache
def _onednn() -> bool:
    ok = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    if not ok:
        log.info("the RADIO tower runs timm's modules: torch was built without oneDNN")
    return ok


# nn.Linear -> (weak ref to its weight, (data_ptr, version), packed weight): packed once per weight and repacked when
# the weight is replaced, moved or changed in place (inference tensors have no version counter: replaced or moved
# only); held only as long as the module lives.
_PACKED: "weakref.WeakKeyDictionary[nn.Linear, tuple]" = weakref.WeakKeyDictionary()


def packed_weight(linear: nn.Linear) -> torch.Tensor:
    """`linear.weight` in oneDNN's blocked layout (`torch.ops.mkldnn._reorder_linear_weight`), cached per module."""
    w = linear.weight
    stamp = (w.data_ptr(), 0 if w.is_inference() else w._version)
    hit = _PACKED.get(linear)
    if hit is None or hit[0]() is not w or hit[1] != stamp:
        hit = (weakref.ref(w), stamp, torch.ops.mkldnn._reorder_linear_weight(w.detach()))
        _PACKED[linear] = hit
    return hit[2]


def _weight(linear: nn.Linear, packed: bool) -> torch.Tensor:
    return packed_weight(linear) if packed else linear.weight


def _residual(x: torch.Tensor, h: torch.Tensor, linear: nn.Linear, scale: nn.Module, packed: bool) -> torch.Tensor:
    """x + scale(linear(h)): the add is the product's post-op unless a LayerScale sits between them."""
    w = _weight(linear, packed)
    if isinstance(scale, nn.Identity):
        return torch.ops.mkldnn._linear_pointwise.binary(h, x, w, linear.bias, "add")
    return x + scale(torch.ops.mkldnn._linear_pointwise(h, w, linear.bias, "none", [], ""))


def fused_block(block: Block, x: torch.Tensor, packed: bool = False) -> torch.Tensor:
    """timm `Block.forward` (pre-norm attention + MLP, exact GELU, optional LayerScale) on oneDNN's fused products:
    (B, L, D) -> (B, L, D), bf16 or fp32. Inference on the CPU only; `fused_cpu_off` says when the encoder uses it.
    `packed`: the weights in oneDNN's layout, packed once and cached (`packed_weight`), instead of per call."""
    b, length, d = x.shape
    attn, mlp = block.attn, block.mlp
    h = F.layer_norm(x, (d,), block.norm1.weight, block.norm1.bias, block.norm1.eps)
    qkv = torch.ops.mkldnn._linear_pointwise(h, _weight(attn.qkv, packed), attn.qkv.bias, "none", [], "")
    qkv = qkv.view(b, length, 3, attn.num_heads, attn.head_dim)  # (B, L, 3, H, hd)
    o = attention.attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], attn.scale)  # (B, L, H, hd) or None
    if o is None:  # no AMX here, or fp32: torch's
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # (B, H, L, hd)
        o = F.scaled_dot_product_attention(q, k, v).transpose(1, 2)
    x = _residual(x, o.reshape(b, length, d), attn.proj, block.ls1, packed)
    h = F.layer_norm(x, (d,), block.norm2.weight, block.norm2.bias, block.norm2.eps)
    h = torch.ops.mkldnn._linear_pointwise(h, _weight(mlp.fc1, packed), mlp.fc1.bias, "gelu", [], "none")  # (B, L, F)
    return _residual(x, h, mlp.fc2, block.ls2, packed)


def encode_tiles(encoder: RadioEncoder, tiles: torch.Tensor, micro_batch: int = 16) -> torch.Tensor:
    """Run the encoder over (N, 3, H, W) tiles in chunks of `micro_batch`: (N, h*w, D).

    Only one chunk's activations live at a time (a 13-tile page or 128 video frames would otherwise
    hold them all); results go straight into one preallocated output. Same values as one big batch.
    """
    if micro_batch < 1:
        raise ConfigError(f"micro_batch must be >= 1; found {micro_batch}")
    n = tiles.shape[0]
    if n == 0:
        raise TileShapeError("encode_tiles: expected at least one tile, found 0")
    first = encoder.forward_features(tiles[:micro_batch])  # (b, h*w, D)
    if n <= micro_batch:
        return first
    out = first.new_empty((n, *first.shape[1:]))  # (N, h*w, D)
    out[: first.shape[0]] = first
    del first
    for start in range(micro_batch, n, micro_batch):
        out[start : start + micro_batch] = encoder.forward_features(tiles[start : start + micro_batch])
    return out
