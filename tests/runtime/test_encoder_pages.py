"""Encoder weights in memory only while an encoder runs (vl/runtime/cpu/encoder_pages.py, `VL_ENCODER_PAGES`):
a tiny Omni and a tiny Nano V2 VL loaded in `release` mode answer exactly as in `keep` mode, request after request
(a bad request between good ones, a follow-up served from the encoder cache); the encoders' pages are in the process
while they run and gone after; and the `auto` choice by checkpoint size against RAM."""

import os
import struct
import sys

import numpy as np
import pytest
import torch
from PIL import Image

import vl
from tiny_models import make_tiny_omni_dir, make_tiny_vl_dir
from vl.checkpoint import load as checkpoint_load
from vl.errors import VLError
from vl.runtime.cpu import encoder_pages

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "processing"))
from media_fixtures import tone  # noqa: E402

linux = pytest.mark.skipif(not os.path.exists("/proc/self/pagemap"), reason="needs Linux /proc/self/pagemap")


def resident_pages(t: torch.Tensor) -> int:
    """How many of the pages under `t` are in this process's page table (/proc/self/pagemap bit 63)."""
    page = encoder_pages.PAGE
    first = t.data_ptr() // page
    last = (t.data_ptr() + t.numel() * t.element_size() - 1) // page
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        entries = struct.unpack(f"{last - first + 1}Q", f.read(8 * (last - first + 1)))
    return sum(e >> 63 for e in entries)


def mapped_weights(model, names):
    parts = [getattr(model, n, None) for n in names]
    return [p for part in parts if part is not None for p in part.parameters() if encoder_pages.file_backed(p)]


@pytest.fixture(scope="module")
def omni_dir(tmp_path_factory):
    return make_tiny_omni_dir(tmp_path_factory.mktemp("omni_pages") / "omni")[0]


def engines(path, monkeypatch):
    """(keep, release) engines of one directory; every encoder tensor is mapped in release (the tiny model's
    tensors are under the size limit that keeps small ones out of maps)."""
    monkeypatch.setenv("VL_ENCODER_PAGES", "keep")
    keep = vl.Engine.from_pretrained(path)
    monkeypatch.setenv("VL_ENCODER_PAGES", "release")
    monkeypatch.setattr(checkpoint_load, "MAPPED_MIN_BYTES", 0)
    release = vl.Engine.from_pretrained(path)
    return keep, release


def user(*parts, text="What is said?"):
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


@linux
def test_omni_in_release_mode_answers_as_kept_and_holds_no_encoder_page_after_a_request(omni_dir, monkeypatch):
    keep, release = engines(omni_dir, monkeypatch)
    model = release.model
    assert keep.model.encoder_pages == "keep" and model.encoder_pages == "release"
    assert model.mapped_encoder_bytes > 0 and keep.model.mapped_encoder_bytes == 0
    vision = mapped_weights(model, encoder_pages.VISION)
    audio = mapped_weights(model, encoder_pages.AUDIO)
    assert vision and audio and not mapped_weights(keep.model, encoder_pages.VISION)
    assert not any(encoder_pages.file_backed(p) for p in model.language_model.parameters()
                   if p is not model.language_model.backbone.embeddings.weight)

    # a module's weights are in the process while it runs (its pre-hook maps them), and only then
    seen = {}
    tower_linear = next(m for m in model.vision.modules() if isinstance(m, torch.nn.Linear)
                        and encoder_pages.file_backed(m.weight))
    audio_linear = next(m for m in model.audio_encoder.modules() if isinstance(m, torch.nn.Linear)
                        and encoder_pages.file_backed(m.weight))
    def spy(key):
        def hook(module, args, output):
            seen.setdefault(key, resident_pages(module.weight))
        return hook

    for key, lin in (("vision", tower_linear), ("audio", audio_linear)):
        lin.register_forward_hook(spy(key), prepend=True)  # before the post-hook that drops the pages
    pages = {k: len(range(lin.weight.data_ptr() // encoder_pages.PAGE,
                          (lin.weight.data_ptr() + lin.weight.nbytes - 1) // encoder_pages.PAGE + 1))
             for k, lin in (("vision", tower_linear), ("audio", audio_linear))}
    for i in range(2):  # new media each time: the encoder cache does not answer
        image = Image.fromarray(np.random.default_rng(3 + i).integers(0, 255, (60, 90, 3), dtype=np.uint8))
        msgs = user({"type": "image", "image": image}, {"type": "audio", "audio": tone(16000, 1.2, 330.0 + i, 0.2)})
        want = keep.chat(msgs, max_new_tokens=8, ignore_eos=True)
        got = release.chat(msgs, max_new_tokens=8, ignore_eos=True)
        assert got.token_ids == want.token_ids and got.stats.vision_cache_hits == 0
        assert seen == pages  # every page of the weight mapped in while its module ran ...
        assert sum(resident_pages(w) for w in vision + audio) == 0  # ... and none left after the request
        seen.clear()
        with pytest.raises(VLError):  # a bad request between good ones leaves nothing mapped either
            release.chat(user({"type": "audio", "audio": b"not audio"}), max_new_tokens=4)
        assert sum(resident_pages(w) for w in vision + audio) == 0


@linux
def test_a_follow_up_from_the_encoder_cache_maps_nothing(omni_dir, monkeypatch):
    _, release = engines(omni_dir, monkeypatch)
    image = Image.fromarray(np.random.default_rng(5).integers(0, 255, (48, 64, 3), dtype=np.uint8))
    msgs = user({"type": "image", "image": image}, text="Describe it.")
    first = release.chat(msgs, max_new_tokens=5)
    advised = []
    monkeypatch.setattr(encoder_pages, "_advise", lambda part, advice, spans=None: advised.append(advice))
    again = release.chat(msgs, max_new_tokens=5)
    assert again.token_ids == first.token_ids and again.stats.vision_cache_hits == 1
    assert advised == []


@linux
def test_nano_vl_tiles_in_release_mode_answer_as_kept(tmp_path, monkeypatch):
    d = make_tiny_vl_dir(tmp_path / "vl")
    keep, release = engines(d, monkeypatch)
    weights = mapped_weights(release.model, encoder_pages.VISION)
    assert weights and release.model.encoder_pages == "release"
    image = Image.fromarray(np.random.default_rng(1).integers(0, 255, (80, 120, 3), dtype=np.uint8))
    msgs = user({"type": "image", "image": image}, text="What is the total?")
    want = keep.chat(msgs, max_new_tokens=6, ignore_eos=True)
    got = release.chat(msgs, max_new_tokens=6, ignore_eos=True)
    assert got.token_ids == want.token_ids
    assert sum(resident_pages(w) for w in weights) == 0
    both = release.chat_batch([msgs, user({"type": "image", "image": image.rotate(90)}, text="And this?")],
                              max_new_tokens=4, ignore_eos=True)  # the grouped tower call of a batch
    assert both[0].token_ids == want.token_ids[:4]
    assert sum(resident_pages(w) for w in weights) == 0


def test_auto_releases_when_the_checkpoint_holds_most_of_the_ram(monkeypatch):
    monkeypatch.delenv("VL_ENCODER_PAGES", raising=False)
    gib = 1 << 30
    on_linux = sys.platform.startswith("linux")
    assert encoder_pages.choose(21 * gib, 24 * gib) == ("release" if on_linux else "keep")  # Omni NVFP4, 24 GB
    assert encoder_pages.choose(11 * gib, 24 * gib) == "keep"  # Nano 12B NVFP4 with its tower
    monkeypatch.setenv("VL_ENCODER_PAGES", "keep")
    assert encoder_pages.choose(21 * gib, 24 * gib) == "keep"
    monkeypatch.setenv("VL_ENCODER_PAGES", "release")
    assert encoder_pages.choose(1, 24 * gib) == "release"
    monkeypatch.setenv("VL_ENCODER_PAGES", "sometimes")
    with pytest.raises(vl.errors.ConfigError):
        encoder_pages.choose(1, 24 * gib)


@linux
def test_a_weight_replaced_after_load_is_never_dropped(omni_dir, monkeypatch):
    """A hook only drops the storage it found at install: a weight replaced by torch's own memory since (a cast,
    a fine-tune step) keeps its values through requests (MADV_DONTNEED on it would zero it)."""
    keep, release = engines(omni_dir, monkeypatch)
    lin = next(m for m in release.model.vision.modules() if isinstance(m, torch.nn.Linear)
               and encoder_pages.file_backed(m.weight))
    lin.weight.data = lin.weight.data.clone()  # now in anonymous memory
    want = lin.weight.detach().clone()
    image = Image.fromarray(np.random.default_rng(9).integers(0, 255, (48, 80, 3), dtype=np.uint8))
    msgs = user({"type": "image", "image": image}, text="Describe it.")
    for _ in range(2):
        assert release.chat(msgs, max_new_tokens=5).token_ids == keep.chat(msgs, max_new_tokens=5).token_ids
        assert torch.equal(lin.weight, want)


@linux
def test_release_mode_trims_the_heap_after_each_layer_of_a_prefill_chunk_only(omni_dir, monkeypatch):
    """A prompt of >= TRIM_TOKENS tokens trims after every LLM layer of its prefill (a MoE layer's freed temporaries
    held 1.9 GiB over the Omni LLM's 52 layers); a decode step does not; `keep` mode never does."""
    keep, release = engines(omni_dir, monkeypatch)
    calls = []
    monkeypatch.setattr(encoder_pages, "trim_heap", lambda: calls.append(1))
    layers = len(release.model.language_model.backbone.layers)
    long = "word " * (2 * encoder_pages.TRIM_TOKENS)
    want = keep.chat(user(text=long), max_new_tokens=4, ignore_eos=True)
    assert calls == []  # keep mode: no hook, and no trim when the batch ends
    got = release.chat(user(text=long), max_new_tokens=4, ignore_eos=True)
    assert got.token_ids == want.token_ids
    prefill_calls = len(calls)
    assert layers <= prefill_calls <= layers * 2 + 1  # each layer of each chunk, and the end of the batch
    calls.clear()
    release.chat(user(text="Hi."), max_new_tokens=4, ignore_eos=True)  # a short prompt and 4 decode steps
    assert calls == [1]  # the end of the batch only


@linux
def test_release_mode_trims_before_a_requests_first_encoder_call_and_after_its_last(omni_dir, monkeypatch):
    """The media decoding's freed frames and temporaries go back to the OS before the tower's activations are
    allocated (one trim before the first encoder call of a block), and the encoders' after it; a follow-up from
    the encoder cache runs no encoder and trims nothing there."""
    _, release = engines(omni_dir, monkeypatch)
    events = []
    monkeypatch.setattr(encoder_pages, "trim_heap", lambda: events.append("trim"))
    model = release.model
    real = model.encode_images
    monkeypatch.setattr(model, "encode_images", lambda *a, **k: events.append("encode") or real(*a, **k))
    image = Image.fromarray(np.random.default_rng(9).integers(0, 255, (48, 64, 3), dtype=np.uint8))
    msgs = user({"type": "image", "image": image}, {"type": "image", "image": image.rotate(90)}, text="Compare.")
    release.chat(msgs, max_new_tokens=2)
    assert events[:4] == ["trim", "encode", "encode", "trim"]  # before the first, not between, after the block
    events.clear()
    release.chat(msgs, max_new_tokens=2)  # both images from the encoder cache
    assert "encode" not in events and events.count("trim") == 1  # the end of the batch only


@linux
def test_the_openai_server_in_release_mode_answers_as_kept_request_after_request(omni_dir, monkeypatch):
    """`vl serve` over a release-mode Omni: the official SDK's image + `input_audio` requests, a bad one between
    them and two at once (one batch) get the keep-mode engine's answers, and after each no encoder page is left in
    the process (the server runs requests through the batch path, not `Engine.chat`)."""
    import base64
    import io
    import threading
    import wave

    openai = pytest.importorskip("openai", reason="the openai client is a [dev] extra: pip install openai")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "server"))
    from helpers import data_uri, in_process_server

    keep, release = engines(omni_dir, monkeypatch)
    weights = mapped_weights(release.model, encoder_pages.VISION) + mapped_weights(release.model, encoder_pages.AUDIO)

    def wav(freq):
        buf = io.BytesIO()
        with wave.open(buf, "wb") as w:
            w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000)
            w.writeframes((tone(16000, 1.0, freq, 0.3) * 32767).astype("<i2").tobytes())
        return buf.getvalue()

    def png(seed):
        buf = io.BytesIO()
        Image.fromarray(np.random.default_rng(seed).integers(0, 255, (40, 56, 3), dtype=np.uint8)).save(buf, "PNG")
        return buf.getvalue()

    def content(seed, freq):
        return [{"type": "image_url", "image_url": {"url": data_uri(png(seed), "image/png")}},
                {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav(freq)).decode(), "format": "wav"}},
                {"type": "text", "text": "What is said?"}]

    def want(seed, freq):
        return keep.chat(user({"type": "image", "image": png(seed)}, {"type": "audio", "audio": wav(freq)}),
                         max_new_tokens=6, temperature=0.0).answer

    with in_process_server(release, served_names=("omni",), max_batch=4, batch_window_s=0.3) as (base, _):
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)

        def ask(seed, freq):
            r = client.chat.completions.create(model="omni", max_tokens=6, temperature=0,
                                               messages=[{"role": "user", "content": content(seed, freq)}])
            return r.choices[0].message.content

        for seed, freq in ((1, 300.0), (2, 420.0)):
            assert ask(seed, freq) == want(seed, freq)
            assert sum(resident_pages(w) for w in weights) == 0
            with pytest.raises(openai.BadRequestError):
                client.chat.completions.create(model="omni", max_tokens=6, messages=[{"role": "user", "content": [
                    {"type": "input_audio", "input_audio": {"data": base64.b64encode(b"no audio").decode(),
                                                            "format": "wav"}}]}])
            assert sum(resident_pages(w) for w in weights) == 0
        got, barrier = {}, threading.Barrier(2)

        def send(seed, freq):
            barrier.wait()
            got[seed] = ask(seed, freq)

        threads = [threading.Thread(target=send, args=(s, f)) for s, f in ((3, 250.0), (4, 610.0))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert got == {3: want(3, 250.0), 4: want(4, 610.0)}
        assert sum(resident_pages(w) for w in weights) == 0


def test_release_mode_decodes_through_the_fused_step(omni_dir, monkeypatch):
    """The prefill's per-layer trim is a forward hook on every LLM layer; the fused CPU decode step runs no hooks and
    so stands aside for any hook, but not for this one (it does nothing for one token): release mode decodes
    through the fused step as keep mode does, with the same tokens. Any other hook still sends a step to the
    modules."""
    from vl.runtime.cpu import decode as cpu_decode

    keep, release = engines(omni_dir, monkeypatch)
    if cpu_decode.library() is None or cpu_decode.unsupported(release.model.language_model) is not None:
        pytest.skip(f"the fused step does not run this model here ({cpu_decode.status()})")
    calls, real = [], cpu_decode.run_step
    monkeypatch.setattr(cpu_decode, "run_step", lambda *a, **k: calls.append(1) or real(*a, **k))
    msgs = user(text="Count to five.")
    want = keep.chat(msgs, max_new_tokens=6, ignore_eos=True)
    assert len(calls) == 5
    calls.clear()
    got = release.chat(msgs, max_new_tokens=6, ignore_eos=True)
    assert got.token_ids == want.token_ids and len(calls) == 5  # every step after the prefill's first token
    calls.clear()
    probe = release.model.language_model.backbone.layers[0].register_forward_hook(lambda *a: None)
    try:
        again = release.chat(msgs, max_new_tokens=6, ignore_eos=True)
    finally:
        probe.remove()
    assert again.token_ids == want.token_ids and calls == []  # a caller's own hook: the modules run every step


@linux
def test_bf16_tower_blocks_on_the_fused_path_map_their_weights_only_while_they_run(tmp_path, monkeypatch):
    """In bf16 the RADIO tower runs its blocks through the fused CPU path, which calls none of a block's layers: the
    block is hooked whole, so each block's weights are in the process while it runs and none are after, request
    after request, and the answers are the keep mode's (the two paths used together, vl/modeling/radio.py)."""
    from safetensors.torch import load_file, save_file

    from vl.kernels.gemm import native_16bit
    from vl.modeling import radio

    d = make_tiny_vl_dir(tmp_path / "vl")
    for f in d.glob("*.safetensors"):  # stored in bf16, so that release mode maps the weights (no cast at load)
        save_file({k: v.bfloat16() if v.is_floating_point() and "input_conditioner" not in k else v
                   for k, v in load_file(f).items()}, f, metadata={"format": "pt"})
    cfg = (d / "config.json").read_text()
    (d / "config.json").write_text(cfg.replace('"torch_dtype": "float32"', '"torch_dtype": "bfloat16"'))
    monkeypatch.setenv("VL_ENCODER_PAGES", "keep")
    keep = vl.Engine.from_pretrained(d, dtype=torch.bfloat16)
    monkeypatch.setenv("VL_ENCODER_PAGES", "release")
    monkeypatch.setattr(checkpoint_load, "MAPPED_MIN_BYTES", 0)
    release = vl.Engine.from_pretrained(d, dtype=torch.bfloat16)
    tower = release.model.vision
    block = tower.blocks[-1]
    weights = mapped_weights(release.model, encoder_pages.VISION)
    assert block.mlp.fc1.weight.dtype == torch.bfloat16 and any(w is block.mlp.fc1.weight for w in weights)
    assert not block.mlp.fc1._forward_hooks  # the block carries the hooks, not its layers
    fused, seen = [], []
    real = radio.fused_block
    monkeypatch.setattr(radio, "fused_block", lambda b, x, packed=False: fused.append(1) or real(b, x, packed))
    first = tower.blocks[0].mlp.fc1.weight
    block.register_forward_hook(lambda m, a, out: seen.append((resident_pages(m.mlp.fc1.weight),
                                                                resident_pages(first))), prepend=True)
    pages = len(range(block.mlp.fc1.weight.data_ptr() // encoder_pages.PAGE,
                      (block.mlp.fc1.weight.data_ptr() + block.mlp.fc1.weight.nbytes - 1) // encoder_pages.PAGE + 1))
    on_fused_path = radio._onednn() and native_16bit(torch.bfloat16)  # where the CPU has the fused path
    for i in range(2):
        image = Image.fromarray(np.random.default_rng(20 + i).integers(0, 255, (80, 120, 3), dtype=np.uint8))
        msgs = user({"type": "image", "image": image}, text="What is the total?")
        want = keep.chat(msgs, max_new_tokens=6, ignore_eos=True)
        got = release.chat(msgs, max_new_tokens=6, ignore_eos=True)
        assert got.token_ids == want.token_ids
        # the last block's weight mapped in while it ran, the first block's dropped after it ran (one block's
        # weights at a time, not the whole tower's) ...
        assert seen and set(seen) == {(pages, 0)}
        assert sum(resident_pages(w) for w in weights) == 0  # ... and nothing left after the request
        assert bool(fused) == on_fused_path  # the fused path ran where this CPU has it (else timm's modules)
        seen.clear()
