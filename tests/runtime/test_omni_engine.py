"""vl.Engine on a Nemotron 3 Nano Omni directory (a tiny random one, as transformers saves it): images, audio and a
video's sound track end to end, against transformers' own `generate`; follow-ups, bad input next to good input, and
a checkpoint without an audio encoder."""

import os
import sys

import numpy as np
import pytest
import torch
from PIL import Image

import vl
from tiny_models import make_tiny_omni_dir
from vl.errors import ContextLengthError, InputError, UnsupportedFormatError, VLError
from vl.runtime.batch import ChatRequest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "processing"))
from media_fixtures import make_video, tone, write_video  # noqa: E402


@pytest.fixture(scope="module")
def omni(tmp_path_factory):
    d, ref = make_tiny_omni_dir(tmp_path_factory.mktemp("omni") / "omni")
    return vl.Engine.from_pretrained(d), ref


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    d = tmp_path_factory.mktemp("omni_media")
    return {"image": Image.fromarray(np.random.default_rng(0).integers(0, 255, (60, 90, 3), dtype=np.uint8)),
            "speech": tone(16000, 1.5, 440.0, 0.2),
            "video": write_video(d / "with_sound.mp4", seconds=2.0),
            "silent": make_video(d / "silent.mp4", frames=20),
            "broken_sound": write_video(d / "broken_sound.mp4", seconds=2.0, corrupt_audio=True)}


def user(*parts, text="What is said?"):
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def hf_greedy(ref, inputs, n):
    kwargs = {k: v for k, v in inputs.model_inputs().items() if v is not None and k != "media_order"}
    with torch.no_grad():
        out = ref.generate(**kwargs, max_new_tokens=n, do_sample=False)
    return out[0, inputs.input_ids.shape[1]:].tolist()


@pytest.mark.parametrize("kind", ["image+audio", "video+sound"])
def test_greedy_answer_equals_transformers_generate(omni, media, kind):
    """The same ids as transformers' `NemotronH_Omni_Reasoning_V3.generate` on the processor's inputs (fp32,
    greedy, the stop id ignored so that all 12 tokens are compared)."""
    engine, ref = omni
    parts = ([{"type": "image", "image": media["image"]}, {"type": "audio", "audio": media["speech"]}]
             if kind == "image+audio" else [{"type": "video", "video": media["video"]}])
    msgs = user(*parts)
    result = engine.chat(msgs, max_new_tokens=12, ignore_eos=True, max_frames=4)
    inputs = engine.processor(msgs, max_frames=4)
    assert inputs.input_features is not None  # the video's sound track is heard by default
    assert result.token_ids == hf_greedy(ref, inputs, 12)
    s = result.stats
    assert s.audio_tokens == sum(inputs.audio_num_tokens) > 0
    assert s.vision_tokens_before == s.vision_tokens_after > 0
    assert s.prompt_tokens == inputs.input_ids.shape[1]
    assert {"media", "vision", "audio", "prefill", "decode"} <= set(s.stages_s)


def test_a_follow_up_reuses_the_encoders_and_answers_the_same(omni, tmp_path):
    engine, _ = omni
    image = Image.fromarray(np.random.default_rng(7).integers(0, 255, (40, 70, 3), dtype=np.uint8))
    msgs = user({"type": "video", "video": write_video(tmp_path / "v.mp4", seconds=1.5, audio_streams=((520.0, False),))},
                {"type": "image", "image": image})
    first = engine.chat(msgs, max_new_tokens=6, max_frames=4)
    again = engine.chat(msgs, max_new_tokens=6, max_frames=4)
    assert again.token_ids == first.token_ids
    assert (first.stats.vision_cache_hits, again.stats.vision_cache_hits) == (0, 3)  # video, image, the audio
    assert again.stats.stages_s["vision"] < first.stats.stages_s["vision"]


def test_the_sound_of_a_video_is_optional_and_its_faults_never_cost_the_frames(omni, media):
    engine, _ = omni
    heard = engine.chat(user({"type": "video", "video": media["video"]}), max_new_tokens=3, max_frames=4)
    muted = engine.chat(user({"type": "video", "video": media["video"]}), max_new_tokens=3, max_frames=4,
                        use_audio_in_video=False)
    assert heard.stats.audio_tokens > 0 and muted.stats.audio_tokens == 0
    assert heard.stats.prompt_tokens == muted.stats.prompt_tokens + heard.stats.audio_tokens + 2  # + so_start/end
    for name, why in (("silent", "the video has no audio track"), ("broken_sound", "audio track unreadable")):
        r = engine.chat(user({"type": "video", "video": media[name]}), max_new_tokens=3, max_frames=4)
        assert r.stats.audio_tokens == 0 and r.stats.vision_tokens_after > 0 and r.finish_reason in ("length", "stop")
        assert any(n.startswith("answered from the frames only") and why in n for n in r.stats.notes), r.stats.notes
        assert not any("sent beside it" in n for n in r.stats.notes)
    beside = engine.chat(user({"type": "video", "video": media["silent"]}, {"type": "audio", "audio": media["speech"]}),
                         max_new_tokens=3, max_frames=4)  # a silent video with a clip of its own: the clip is heard
    assert beside.stats.audio_tokens > 0
    assert any(n.startswith("answered from the frames only: the video has no audio track (the audio sent beside it "
                            "was heard)") for n in beside.stats.notes), beside.stats.notes


def test_a_video_whose_sound_starts_late_is_led_by_silence(omni, tmp_path):
    engine, _ = omni
    path = write_video(tmp_path / "late.mp4", seconds=2.0, audio_offset_s=0.5)
    inputs = engine.processor(user({"type": "video", "video": path}), max_frames=4)
    wave = inputs.audio[0]
    lead = np.abs(wave[:int(0.4 * 16000)]).max()
    assert lead < 1e-3 and np.abs(wave[int(0.6 * 16000):int(1.0 * 16000)]).max() > 0.1


def test_bad_audio_is_a_typed_error_and_the_next_request_and_its_neighbours_answer(omni, media):
    engine, _ = omni
    good = user({"type": "audio", "audio": media["speech"]})
    alone = engine.chat(good, max_new_tokens=5)
    with pytest.raises(UnsupportedFormatError):
        engine.chat(user({"type": "audio", "audio": b"this is not audio at all" * 10}), max_new_tokens=5)
    assert engine.chat(good, max_new_tokens=5).token_ids == alone.token_ids
    requests = [ChatRequest(good, max_new_tokens=5),
                ChatRequest(user({"type": "audio", "audio": b"RIFF\x00\x00\x00\x00WAVEjunk"}), max_new_tokens=5),
                ChatRequest(good, max_new_tokens=5)]
    got = dict(engine.stream_batch(requests, raise_errors=False))
    assert isinstance(got[1], VLError) and got[1].code in ("corrupt_media", "unsupported_format")
    assert got[0].token_ids == got[2].token_ids == alone.token_ids
    bad = user({"type": "audio", "audio": b"this is not audio at all" * 10})
    with pytest.raises(UnsupportedFormatError, match="^conversation 2 of 3: expected audio") as named:
        engine.chat_batch([good, bad, good], max_new_tokens=5)  # chat_batch raises, saying which conversation
    assert named.value.named == "conversation 2 of 3" and not named.value.unnamed.startswith("conversation")
    with pytest.raises(UnsupportedFormatError, match="^expected audio"):  # a lone one needs no name
        engine.chat_batch([bad], max_new_tokens=5)
    assert [r.token_ids for r in engine.chat_batch([good, good], max_new_tokens=5)] == [alone.token_ids] * 2


def test_tiling_options_are_accepted_and_named(omni, media):
    """A request written for Nano V2 VL (max_num_tiles, skip_blank_tiles) works on Omni and says they were unused."""
    engine, _ = omni
    r = engine.chat(user({"type": "image", "image": media["image"]}), max_new_tokens=3, max_num_tiles=2,
                    skip_blank_tiles=True)
    assert any("max_num_tiles, skip_blank_tiles" in n and "native resolution" in n for n in r.stats.notes)


def test_a_checkpoint_without_an_audio_encoder(tmp_path, media):
    d, _ = make_tiny_omni_dir(tmp_path / "omni_no_audio", audio=False)
    engine = vl.Engine.from_pretrained(d)
    assert engine.model.audio_encoder is None
    with pytest.raises(InputError, match="no audio encoder"):
        engine.chat(user({"type": "audio", "audio": media["speech"]}), max_new_tokens=3)
    asked = engine.chat(user({"type": "video", "video": media["video"]}), max_new_tokens=3, max_frames=4,
                        use_audio_in_video=True)
    assert asked.stats.audio_tokens == 0 and any("no audio encoder" in n for n in asked.stats.notes)
    default = engine.chat(user({"type": "video", "video": media["video"]}), max_new_tokens=3, max_frames=4)
    assert default.token_ids == asked.token_ids and not any("audio" in n for n in default.stats.notes)


def test_nano_v2_vl_says_it_does_not_hear(tmp_path):
    engine = vl.Engine.from_pretrained(os.path.join(os.path.dirname(vl.__file__), "demo"))
    path = write_video(tmp_path / "v.mp4", seconds=1.0)
    r = engine.chat(user({"type": "video", "video": path}), max_new_tokens=2, max_frames=4, use_audio_in_video=True)
    assert any("does not hear" in n for n in r.stats.notes)
    r = engine.chat(user({"type": "video", "video": path}), max_new_tokens=2, max_frames=4)
    assert not any("hear" in n for n in r.stats.notes)


def test_evs_prunes_tubelet_tokens_per_request(omni, tmp_path):
    engine, _ = omni
    path = make_video(tmp_path / "moving.mp4", frames=24, noise=True)
    msgs = user({"type": "video", "video": path})
    whole = engine.chat(msgs, max_new_tokens=3, max_frames=8)
    pruned = engine.chat(msgs, max_new_tokens=3, max_frames=8, video_pruning_rate=0.5)
    assert whole.stats.vision_tokens_after == whole.stats.vision_tokens_before == pruned.stats.vision_tokens_before
    assert pruned.stats.vision_tokens_after < pruned.stats.vision_tokens_before
    assert pruned.stats.prompt_tokens == whole.stats.prompt_tokens - (pruned.stats.vision_tokens_before
                                                                      - pruned.stats.vision_tokens_after)
    (evs,) = pruned.stats.reductions
    assert evs["method"] == "evs" and evs["q"] == 0.5 and sum(evs["counts"]) == pruned.stats.vision_tokens_after


def test_audio_longer_than_the_context_is_refused_before_any_encoder_runs(tmp_path, monkeypatch):
    d, _ = make_tiny_omni_dir(tmp_path / "short_context", context=512)
    engine = vl.Engine.from_pretrained(d)

    def no_encoder(*args, **kwargs):
        raise AssertionError("an encoder ran")

    monkeypatch.setattr(engine.model, "encode_audio", no_encoder)
    with pytest.raises(ContextLengthError, match="besides its video frames.*audio"):
        engine.chat(user({"type": "audio", "audio": tone(16000, 60.0, 300.0)}), max_new_tokens=3)  # 750 tokens
    monkeypatch.undo()
    assert engine.chat(user({"type": "audio", "audio": tone(16000, 2.0, 300.0)}), max_new_tokens=3).stats.audio_tokens
