"""Parakeet (FastConformer) encoder: numerics against transformers' `ParakeetEncoder` on the same random weights,
output lengths and the Omni's audio-embedding count, the subsampling in chunks over time against one pass (bit for
bit, also through the engine), the `audio_config` reader, contract checks."""

import dataclasses
import os
import sys
import types

import pytest
import torch
import torch.nn.functional as F

import vl
import vl.modeling.parakeet as parakeet
from tiny_models import make_tiny_omni_dir
from vl.config.parakeet import ParakeetConfig, parakeet_config_from_hf, parakeet_config_to_hf, tiny_parakeet
from vl.errors import ConfigError, VLError
from vl.modeling.parakeet import ParakeetEncoder, Subsampling, omni_embedding_lengths, subsampled_length
from vl.processing.audio_features import MelConfig
from vl.runtime.batch import ChatRequest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "processing"))
from media_fixtures import tone  # noqa: E402

VARIANTS = {  # the Omni's switches (no biases, no input scale) and transformers' defaults (both on), odd widths
    "omni": tiny_parakeet(),
    "defaults": tiny_parakeet(attention_bias=True, convolution_bias=True, scale_input=True),
    "head_dim_gelu": tiny_parakeet(head_dim=6, hidden_act="gelu", subsampling_conv_kernel_size=5, conv_kernel_size=3,
                                   num_mel_bins=24),
}


def transformers_twin(cfg: ParakeetConfig, attn: str = "eager", seed: int = 0):
    """transformers' ParakeetEncoder with every tensor random (biases, u/v, batch-norm statistics too, so that no
    term can hide), in eval mode."""
    from transformers import ParakeetEncoderConfig
    from transformers.models.parakeet.modeling_parakeet import ParakeetEncoder as Reference

    hf_cfg = ParakeetEncoderConfig(**parakeet_config_to_hf(cfg))
    hf_cfg._attn_implementation = attn
    ref = Reference(hf_cfg).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in ref.state_dict().items():
            if not t.is_floating_point():
                continue
            if name.endswith("running_var"):
                t.copy_(torch.rand(t.shape, generator=g) + 0.5)
            elif name.endswith(("norm_feed_forward1.weight", "norm_self_att.weight", "norm_conv.weight",
                                "norm_feed_forward2.weight", "norm_out.weight", "conv.norm.weight")):
                t.copy_(1.0 + 0.2 * torch.randn(t.shape, generator=g))
            else:
                t.copy_(0.2 * torch.randn(t.shape, generator=g))
    return ref


def ours_from(ref, cfg: ParakeetConfig) -> ParakeetEncoder:
    enc = ParakeetEncoder(cfg).eval()
    enc.load_state_dict(ref.state_dict(), strict=True)  # the same names: the checkpoint adapter is a prefix strip
    return enc


def padded_batch(cfg: ParakeetConfig, lengths, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths)
    mask = torch.arange(int(lengths.max()))[None, :] < lengths[:, None]
    x = torch.randn(len(lengths), int(lengths.max()), cfg.num_mel_bins, generator=g) * mask[..., None]
    return x, mask


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_state_dict_names_equal_transformers(variant):
    cfg = VARIANTS[variant]
    ref = transformers_twin(cfg)
    assert list(ParakeetEncoder(cfg).state_dict()) == list(ref.state_dict())
    assert {k: v.shape for k, v in ParakeetEncoder(cfg).state_dict().items()} == \
        {k: v.shape for k, v in ref.state_dict().items()}


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_padded_batch_equals_transformers(variant, attn):
    """Every position (padding included: both compute the same uniform attention there) and the lengths, which
    equal transformers' output attention mask."""
    cfg = VARIANTS[variant]
    ref = transformers_twin(cfg, attn)
    enc = ours_from(ref, cfg)
    x, mask = padded_batch(cfg, [77, 50, 9, 64])
    with torch.no_grad():
        want = ref(input_features=x, attention_mask=mask)
        hidden, lengths = enc(x, mask)
    torch.testing.assert_close(hidden, want.last_hidden_state, rtol=1e-5, atol=1e-6)
    assert lengths.tolist() == want.attention_mask.sum(-1).tolist() == [10, 7, 2, 8]


@pytest.mark.parametrize("variant", ["omni", "defaults"])
def test_unmasked_clip_equals_transformers(variant):
    cfg = VARIANTS[variant]
    ref = transformers_twin(cfg)
    enc = ours_from(ref, cfg)
    x, _ = padded_batch(cfg, [123])
    with torch.no_grad():
        want = ref(input_features=x).last_hidden_state
        hidden, lengths = enc(x)
    torch.testing.assert_close(hidden, want, rtol=1e-5, atol=1e-6)
    assert lengths.tolist() == [want.shape[1]] == [16]


@pytest.mark.parametrize("block", [1, 3, 7])
def test_query_blocks_equal_transformers_and_bound_the_attention_memory(block, monkeypatch):
    """Long clips attend a block of queries at a time (`QUERY_BLOCK`); the result is transformers' whole-matrix
    attention, padded batches included, for blocks that split T' = 10 unevenly."""
    import vl.modeling.parakeet as parakeet

    cfg = VARIANTS["omni"]
    ref = transformers_twin(cfg)
    enc = ours_from(ref, cfg)
    x, mask = padded_batch(cfg, [77, 50, 9, 64])
    monkeypatch.setattr(parakeet, "QUERY_BLOCK", block)
    rows, attend = [], parakeet.RelPositionAttention._attend

    def counted(self, qu, *args):
        rows.append(qu.shape[2])
        return attend(self, qu, *args)

    monkeypatch.setattr(parakeet.RelPositionAttention, "_attend", counted)
    with torch.no_grad():
        want = ref(input_features=x, attention_mask=mask)
        hidden, _ = enc(x, mask)
    torch.testing.assert_close(hidden, want.last_hidden_state, rtol=1e-5, atol=1e-6)
    assert max(rows) == block and sum(rows) == 10 * cfg.num_hidden_layers  # every query once, `block` at a time


def _attend_by_gather(self, qu, qv, k_t, v, r_t, mask, i0: int) -> torch.Tensor:
    """The relative-position term as an explicit gather of each (query, key) pair's position row: the twin of the
    strided view `_attend` takes, written the plain way."""
    b, h, n, d = qu.shape
    t = k_t.shape[-1]
    scale = d**-0.5
    first = (t - 1) - (i0 + n - 1)  # the same product as `_attend`'s (its window of positions), then a gather
    by_position = qv @ r_t[:, :, first:first + n + t - 1]  # (B, H, n, n + T - 1)
    i = torch.arange(i0, i0 + n)
    rows = (t - 1) - i[:, None] + torch.arange(t)[None, :] - first  # query i, key j: position (T - 1) - (i - j)
    position = by_position.gather(-1, rows.expand(b, h, n, t)).mul_(scale)
    scores = (qu @ k_t).mul_(scale).add_(position)
    if mask is not None:
        pair = mask[:, None, i0:i0 + n, None] & mask[:, None, None, :]
        scores.masked_fill_(~pair, torch.finfo(scores.dtype).min)
    return torch.softmax(scores.float(), dim=-1).to(v.dtype) @ v


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block", [3, 64])
def test_the_strided_relative_shift_equals_a_gather_bit_for_bit(block, dtype, monkeypatch):
    """The block's position scores are a strided view of its window's products (no index tensor, no copy): the
    same numbers, bit for bit, as gathering each pair's position row, in fp32 and bf16, padded or not."""
    cfg = VARIANTS["omni"]
    enc = ours_from(transformers_twin(cfg), cfg).to(dtype)
    monkeypatch.setattr(parakeet, "QUERY_BLOCK", block)
    x, mask = padded_batch(cfg, [77, 50, 9, 64])
    for m in (mask, None):
        with torch.no_grad():
            fast, _ = enc(x.to(dtype), m)
            monkeypatch.setattr(parakeet.RelPositionAttention, "_attend", _attend_by_gather)
            plain, _ = enc(x.to(dtype), m)
            monkeypatch.undo()
            monkeypatch.setattr(parakeet, "QUERY_BLOCK", block)
        assert torch.equal(fast, plain)


@pytest.mark.parametrize("lengths", [[700], [-705], [300, 210, 77]])
def test_bf16_on_the_tile_kernel_is_as_close_to_fp32_as_the_torch_path(lengths, monkeypatch):
    """In bf16 the attention runs as one kernel on AMX tiles (vl/kernels/attention.py `relative_attention`), each
    clip's keys up to its length; with `VL_ATTENTION_KERNEL=off`, the torch path. Both against the same encoder in
    fp32, at every position: the kernel is no further from it. That includes the padded positions, which attend to all
    keys uniformly in both (-705: a lone clip whose mask leaves out its last frame, as the Omni's features do, so its
    last position is padding, and the Omni keeps it), and a padded batch."""
    from vl.kernels import attention

    if attention.library() is None:
        pytest.skip(f"the tile attention does not run here: {attention.status()}")
    cfg = dataclasses.replace(VARIANTS["omni"], num_hidden_layers=2)
    ref = ours_from(transformers_twin(cfg), cfg)
    enc = ours_from(transformers_twin(cfg), cfg).to(torch.bfloat16)
    x, mask = padded_batch(cfg, [abs(n) for n in lengths])  # 88 positions: two query blocks of 32 and a partial one
    if lengths[0] < 0:
        mask[0, -1] = False  # 705 frames, 704 real: 89 positions, 88 real
    calls, kernel = [], attention.relative_attention

    def counted(*args, **kwargs):
        out = kernel(*args, **kwargs)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(attention, "relative_attention", counted)
    with torch.no_grad():
        want, _ = ref(x, mask)
        tiles, _ = enc(x.bfloat16(), mask)
        assert sum(calls) == cfg.num_hidden_layers  # the bf16 run's layers, not the fp32 one's
        monkeypatch.setenv("VL_ATTENTION_KERNEL", "off")
        attention._load.cache_clear()
        try:
            plain, _ = enc(x.bfloat16(), mask)
        finally:
            monkeypatch.delenv("VL_ATTENTION_KERNEL")
            attention._load.cache_clear()
    ours_err, theirs_err = (tiles.float() - want).abs(), (plain.float() - want).abs()
    assert ours_err.max() <= 1.25 * theirs_err.max() + 1e-3, (ours_err.max(), theirs_err.max())
    assert ours_err.mean() <= 1.1 * theirs_err.mean() + 1e-4, (ours_err.mean(), theirs_err.mean())


def test_a_clip_in_a_padded_batch_equals_the_clip_alone():
    cfg = VARIANTS["omni"]
    enc = ours_from(transformers_twin(cfg), cfg)
    x, mask = padded_batch(cfg, [80, 35, 61])
    with torch.no_grad():
        batch, lengths = enc(x, mask)
        for i, n in enumerate([80, 35, 61]):
            alone, alone_len = enc(x[i : i + 1, :n], mask[i : i + 1, :n])
            assert alone_len.item() == lengths[i].item()
            torch.testing.assert_close(batch[i, : lengths[i]], alone[0], rtol=1e-5, atol=1e-6)


def _estimate(num_samples: int) -> int:
    """transformers' Omni processor's count of <so_embedding> tokens for a clip (the method needs only these)."""
    from transformers.models.nemotron_h_omni.processing_nemotron_h_omni import (
        NemotronH_Omni_Reasoning_V3Processor as Processor,
    )

    return Processor._estimate_audio_num_embeddings(
        types.SimpleNamespace(audio_hop_length=160, audio_subsampling_factor=8), num_samples)


def test_embedding_counts_equal_the_omni_processor_for_many_lengths():
    """For every length around the hop and subsampling boundaries: the frames the centred STFT makes, subsampled,
    equal the processor's estimate; so does `omni_embedding_lengths` from the feature mask, and the encoder's
    own output length for a clip run alone."""
    from transformers.models.parakeet.modeling_parakeet import ParakeetEncoder as Reference

    cfg, mel = VARIANTS["omni"], MelConfig(feature_size=16)
    lengths = sorted({k * 160 + r for k in range(2, 70) for r in (0, 1, 80, 159)})
    valid = mel.valid_frames(torch.tensor(lengths))
    mask = torch.arange(int(valid.max()))[None, :] < valid[:, None]
    counts = omni_embedding_lengths(mask, cfg).tolist()
    expected = [_estimate(n) for n in lengths]
    assert counts == expected == [subsampled_length(mel.stft_frames(n), cfg) for n in lengths]
    ref = Reference.__new__(Reference)  # only its length formula, which reads the config
    ref.config = types.SimpleNamespace(subsampling_conv_kernel_size=3, subsampling_conv_stride=2, subsampling_factor=8)
    assert ref._get_subsampling_output_length(mask.sum(-1) + 1).tolist() == expected
    enc = ParakeetEncoder(cfg).eval()
    with torch.no_grad():
        for n in lengths[::23]:
            hidden, _ = enc(torch.zeros(1, mel.stft_frames(n), cfg.num_mel_bins))
            assert hidden.shape[1] == _estimate(n)


def test_released_width_one_layer_equals_transformers():
    """The Omni audio tower's widths (1024 wide, 8 heads, MLP 4096, 128 mel bins, 256 subsampling channels, kernel
    9) with one conformer block, on a 2 s and a 1.3 s clip batched. The tolerance allows for transformers' own
    spread: its oneDNN convolutions sum the 256 channels in an order that depends on the thread count (its output,
    up to 5.3 here, moves by 2.8e-5 between 1 and 2 threads), where the 1x1 convolutions here sum in one order."""
    cfg = ParakeetConfig(hidden_size=1024, num_hidden_layers=1, num_attention_heads=8, intermediate_size=4096,
                         num_mel_bins=128, attention_bias=False, scale_input=False, convolution_bias=False)
    ref = transformers_twin(cfg, "sdpa")
    enc = ours_from(ref, cfg)
    x, mask = padded_batch(cfg, [200, 130])
    with torch.no_grad():
        want = ref(input_features=x, attention_mask=mask)
        hidden, lengths = enc(x, mask)
    torch.testing.assert_close(hidden, want.last_hidden_state, rtol=1e-5, atol=5e-5)
    assert lengths.tolist() == want.attention_mask.sum(-1).tolist() == [25, 17]


def test_forward_is_finite_and_every_parameter_gets_a_gradient():
    cfg = VARIANTS["defaults"]
    enc = ParakeetEncoder(cfg)
    x, mask = padded_batch(cfg, [40, 24])
    hidden, _ = enc(x, mask)
    assert torch.isfinite(hidden).all()
    hidden.square().mean().backward()
    assert [n for n, p in enc.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0] == []


# --- the subsampling in chunks over time ---------------------------------------------------------------------

OMNI_SUBSAMPLING = ParakeetConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                  num_mel_bins=128)  # the Omni's subsampling widths: 256 channels, 128 mel bins


def whole_subsampling(sub: Subsampling, features, lengths):
    """The subsampling stack in one pass over the whole clip, each strided convolution padding its own edges (the
    maths as the module computed it before it ran in chunks), the 1x1 convolutions as the module computes them."""
    x = features.unsqueeze(1)
    for layer in sub.layers:
        if isinstance(layer, torch.nn.ReLU):
            x = F.relu(x)
            continue
        if layer.kernel_size == (1, 1):
            x = parakeet._pointwise(x, layer)
        else:
            x = F.conv2d(x, layer.weight, layer.bias, layer.stride, layer.padding, groups=layer.groups)
        if lengths is not None:
            lengths = (lengths + 2 * layer.padding[0] - layer.kernel_size[0]) // layer.stride[0] + 1
            x = x * (torch.arange(x.shape[2]) < lengths[:, None])[:, None, :, None]
    b, c, t, f = x.shape
    return sub.linear(x.transpose(1, 2).reshape(b, t, c * f))


def chunks_of(monkeypatch, size: int) -> list:
    """Set `SUBSAMPLING_CHUNK` to `size`; the returned list fills with the (start, stop) of every chunk run."""
    monkeypatch.setattr(parakeet, "SUBSAMPLING_CHUNK", size)
    spans, chunk = [], parakeet.Subsampling._chunk

    def recorded(self, x, convs, rows, valid, start, stop):
        spans.append((start, stop))
        return chunk(self, x, convs, rows, valid, start, stop)

    monkeypatch.setattr(parakeet.Subsampling, "_chunk", recorded)
    return spans


def tiled(spans, size: int, total: int) -> bool:
    """The chunks cover rows 0 .. total - 1 once, in order, none longer than `size`."""
    return [a for a, _ in spans] == list(range(0, total, size)) and spans[-1][1] == total \
        and all(0 < b - a <= size for a, b in spans) and all(b == a2 for (_, b), (a2, _) in zip(spans, spans[1:]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("size", [1, 2, 3, 8])
@pytest.mark.parametrize("variant", ["omni", "head_dim_gelu"])
def test_subsampling_in_chunks_is_bit_identical_to_one_pass(variant, size, dtype, monkeypatch):
    """Odd lengths and lengths either side of a chunk boundary (8 x size input frames per chunk) in one padded
    batch, a clip alone without a mask; kernel 3 and kernel 5 (a wider receptive field, so more overlap)."""
    cfg = VARIANTS[variant]
    sub = ours_from(transformers_twin(cfg), cfg).subsampling.to(dtype)
    edge = 8 * size
    lens = [131, edge - 1, edge, edge + 1, 2 * edge + 7, 9, 1]
    x, mask = padded_batch(cfg, lens)
    x = x.to(dtype)
    spans = chunks_of(monkeypatch, size)
    with torch.no_grad():
        for features, lengths in ((x, mask.sum(-1)), (x[:1], None), (x[3:4, :edge + 1], None)):
            spans.clear()
            got, want = sub(features, lengths), whole_subsampling(sub, features, lengths)
            assert got.dtype == dtype and torch.equal(got, want)
            assert len(spans) > 1 and tiled(spans, size, want.shape[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_released_width_subsampling_in_chunks_is_bit_identical(dtype, monkeypatch):
    """256 channels over 128 mel bins (the width at which oneDNN's convolution sums a 1x1 output in an order that
    depends on the tensor's size), a padded batch of two clips of different lengths, chunk sizes that do not
    divide them."""
    torch.manual_seed(0)
    sub = Subsampling(OMNI_SUBSAMPLING).eval().to(dtype)
    x, mask = padded_batch(OMNI_SUBSAMPLING, [1203, 801])
    x = x.to(dtype)
    with torch.no_grad():
        want = whole_subsampling(sub, x, mask.sum(-1))
        for size in (64, 100):
            spans = chunks_of(monkeypatch, size)
            assert torch.equal(sub(x, mask.sum(-1)), want) and tiled(spans, size, 151)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_encoder_in_chunks_equals_one_chunk_and_transformers(dtype, monkeypatch):
    """The whole encoder on a padded batch of two lengths: bit for bit one chunk's result, lengths equal, and
    (fp32) transformers' within the parity tolerance."""
    cfg = VARIANTS["omni"]
    ref = transformers_twin(cfg)
    enc = ours_from(ref, cfg).to(dtype)
    x, mask = padded_batch(cfg, [203, 118])
    with torch.no_grad():
        chunks_of(monkeypatch, 10**6)
        whole, whole_len = enc(x.to(dtype), mask)
        spans = chunks_of(monkeypatch, 3)
        hidden, lengths = enc(x.to(dtype), mask)
        want = ref(input_features=x, attention_mask=mask)
    assert torch.equal(hidden, whole) and lengths.tolist() == whole_len.tolist() == [26, 15]
    assert tiled(spans, 3, 26)
    if dtype == torch.float32:
        torch.testing.assert_close(hidden, want.last_hidden_state, rtol=1e-5, atol=1e-6)


def test_engine_hears_the_same_in_chunks_across_errors_and_neighbours(tmp_path, monkeypatch):
    """Through `vl.Engine`: a clip, a bad clip, the clip again, then a batch with the bad clip between two good
    ones of different lengths, once in chunks of 2 frames and once in one chunk: the encoder's outputs are equal
    bit for bit, request by request, and so are the answers. The encoder cache is off so every request encodes."""
    d, _ = make_tiny_omni_dir(tmp_path / "omni")
    engine = vl.Engine(vl.load_pretrained(d), vl.load_processor(d), vision_cache_size=0)
    seen = []
    engine.model.audio_encoder.register_forward_hook(lambda m, args, out: seen.append(out[0].clone()))
    good, other = tone(16000, 1.5, 440.0, 0.2), tone(16000, 0.9, 300.0, 0.3)

    def user(audio):
        return [{"role": "user", "content": [{"type": "audio", "audio": audio}, {"type": "text", "text": "Said?"}]}]

    def sequence():
        answers = [engine.chat(user(good), max_new_tokens=4).token_ids]
        with pytest.raises(VLError):
            engine.chat(user(b"this is not audio at all" * 10), max_new_tokens=4)
        answers.append(engine.chat(user(good), max_new_tokens=4).token_ids)
        got = dict(engine.stream_batch([ChatRequest(user(good), max_new_tokens=4),
                                        ChatRequest(user(b"RIFF\x00\x00\x00\x00WAVEjunk"), max_new_tokens=4),
                                        ChatRequest(user(other), max_new_tokens=4)], raise_errors=False))
        assert isinstance(got[1], VLError)
        return answers + [got[0].token_ids, got[2].token_ids]

    spans = chunks_of(monkeypatch, 2)
    chunked = sequence()
    chunked_seen, n_chunks = seen[:], len(spans)
    seen.clear()
    chunks_of(monkeypatch, 10**6)
    whole = sequence()
    assert n_chunks > 2 * len(chunked_seen)  # every encoder call ran in several chunks
    assert chunked == whole and chunked[0] == chunked[1] == chunked[2]
    assert len(chunked_seen) == len(seen) >= 3
    assert all(torch.equal(a, b) for a, b in zip(chunked_seen, seen))


# --- the audio_config reader -------------------------------------------------------------------------------


def test_omni_defaults_apply_only_where_the_config_is_silent():
    assert parakeet_config_from_hf({}).attention_bias is False
    assert parakeet_config_from_hf({}).scale_input is False
    assert parakeet_config_from_hf({"attention_bias": True, "scale_input": True}).scale_input is True
    plain = parakeet_config_from_hf({}, omni=False)  # a plain ParakeetEncoderConfig
    assert plain.attention_bias is True and plain.scale_input is True


def test_released_style_config_maps_and_names_what_it_ignores():
    raw = {"model_type": "parakeet", "hidden_size": 1024, "num_attention_heads": 8, "num_hidden_layers": 24,
           "intermediate_size": 4096, "num_mel_bins": 128, "conv_kernel_size": 9, "subsampling_conv_channels": 256,
           "subsampling_factor": 8, "convolution_bias": False, "projection_hidden_size": 4096,
           "projection_bias": False, "dropout": 0.1, "layerdrop": 0.1, "max_position_embeddings": 5000,
           "sampling_rate": 16000, "torch_dtype": "bfloat16", "architectures": ["ParakeetEncoder"]}
    notes = []
    cfg = parakeet_config_from_hf(raw, notes=notes)
    assert (cfg.hidden_size, cfg.num_mel_bins, cfg.projection_hidden_size, cfg.head_size) == (1024, 128, 4096, 128)
    joined = " ".join(notes)
    for key in ("dropout", "layerdrop", "max_position_embeddings", "sampling_rate", "torch_dtype", "model_type"):
        assert key in joined


def test_transformers_reads_our_export_the_same():
    from transformers import ParakeetEncoderConfig

    for cfg in VARIANTS.values():
        hf = ParakeetEncoderConfig(**parakeet_config_to_hf(cfg))
        for f in dataclasses.fields(ParakeetConfig):
            if f.name == "head_dim":
                assert getattr(hf, "head_dim", hf.hidden_size // hf.num_attention_heads) == cfg.head_size
            else:
                assert getattr(hf, f.name) == getattr(cfg, f.name), f.name
        assert parakeet_config_from_hf(parakeet_config_to_hf(cfg)) == cfg


@pytest.mark.parametrize("raw, named", [
    ({"num_key_value_heads": 2}, "num_key_value_heads"),
    ({"hidden_act": "tanh"}, "hidden_act"),
])
def test_maths_we_do_not_implement_is_refused_by_name(raw, named):
    with pytest.raises(ConfigError, match=named):
        parakeet_config_from_hf(raw)


@pytest.mark.parametrize("raw, named", [
    ({"num_mel_bins": 81}, "num_mel_bins"),
    ({"subsampling_factor": 6}, "subsampling_factor"),
    ({"conv_kernel_size": 8}, "conv_kernel_size"),
    ({"hidden_size": 30, "num_attention_heads": 4}, "head_dim"),
])
def test_shapes_transformers_cannot_build_are_config_errors(raw, named):
    with pytest.raises(ConfigError, match=named):
        parakeet_config_from_hf(raw)
