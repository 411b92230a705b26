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

    seen = {}
    encode_images, encode_audio = model.encode_images, model.encode_audio

    def spy(name, fn, weights):
        def run(*a, **k):
            seen[name] = sum(resident_pages(w) for w in weights)
            return fn(*a, **k)
        return run

    monkeypatch.setattr(model, "encode_images", spy("vision", encode_images, vision))
    monkeypatch.setattr(model, "encode_audio", spy("audio", encode_audio, audio))
    for i in range(2):  # new media each time: the encoder cache does not answer
        image = Image.fromarray(np.random.default_rng(3 + i).integers(0, 255, (60, 90, 3), dtype=np.uint8))
        msgs = user({"type": "image", "image": image}, {"type": "audio", "audio": tone(16000, 1.2, 330.0 + i, 0.2)})
        want = keep.chat(msgs, max_new_tokens=8, ignore_eos=True)
        got = release.chat(msgs, max_new_tokens=8, ignore_eos=True)
        assert got.token_ids == want.token_ids and got.stats.vision_cache_hits == 0
        assert seen["vision"] > 0 and seen["audio"] > 0  # mapped in while each encoder ran
        assert sum(resident_pages(w) for w in vision + audio) == 0  # and dropped after the request
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
    monkeypatch.setattr(encoder_pages, "_advise", lambda part, advice, fallback=None: advised.append(advice))
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
