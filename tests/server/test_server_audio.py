"""Audio through `vl serve` and its client, on a tiny random Nemotron 3 Nano Omni directory served in this process:
OpenAI's `input_audio` (sent by the official `openai` SDK) and vLLM's `audio_url`, a video's sound track switched by
`mm_processor_kwargs.use_audio_in_video`, `usage.audio_tokens`, `vl.has_audio` in /v1/models, bad audio next to good
audio, models that do not hear, and `RemoteEngine` with audio parts (docs/server.md, "Audio").

Every answer is compared with `Engine.chat` greedy in this process on the same bytes: the server must say exactly
what the library says.
"""

from __future__ import annotations

import base64
import io
import sys
import threading
import wave
from pathlib import Path

import httpx
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "processing"))
from helpers import DEMO, data_uri, in_process_server  # noqa: E402
from media_fixtures import tone, write_video  # noqa: E402
from tiny_models import make_tiny_omni_dir  # noqa: E402

from vl.errors import NoAudioError, UnsupportedFormatError  # noqa: E402
from vl.server.client import RemoteEngine, encode_audio, float_wav  # noqa: E402

openai = pytest.importorskip("openai", reason="the openai client is a [dev] extra: pip install openai")
QUESTION = "What is said?"
N = 8  # tokens per answer: enough to tell answers apart, few enough to keep the file fast


def wav_bytes(freq: float, seconds: float = 1.0, rate: int = 16000) -> bytes:
    """A 16-bit PCM WAV tone (the stdlib's writer)."""
    samples = (tone(rate, seconds, freq, 0.3) * 32767).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.tobytes())
    return buf.getvalue()


def encoded(path: Path, codec: str, fmt: str | None = None, freq: float = 500.0, rate: int = 48000) -> Path:
    """A mono tone encoded with PyAV (FLAC, Ogg/Opus ...)."""
    import av

    x = tone(rate, 1.0, freq, 0.3)[None]
    with av.open(str(path), "w", format=fmt) as c:
        s = c.add_stream(codec, rate=rate, layout="mono")
        step = s.codec_context.frame_size or 1024
        for i in range(0, x.shape[1], step):
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(x[:, i:i + step]), format="fltp", layout="mono")
            frame.sample_rate, frame.pts = rate, i
            for packet in s.encode(frame):
                c.mux(packet)
        for packet in s.encode():
            c.mux(packet)
    return path


def user(*parts, text: str = QUESTION) -> list[dict]:
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def input_audio(data: bytes, fmt: str = "wav") -> dict:
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt}}


@pytest.fixture(scope="module")
def omni_dir(tmp_path_factory):
    d, _ = make_tiny_omni_dir(tmp_path_factory.mktemp("omni") / "omni")
    return d


@pytest.fixture(scope="module")
def omni(omni_dir):
    import vl

    return vl.Engine.from_pretrained(omni_dir)


@pytest.fixture(scope="module")
def served(omni):
    with in_process_server(omni, served_names=("omni",), max_batch=8, batch_window_s=0.3) as (base, _):
        yield base


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served + "/v1", api_key="unused", max_retries=0, timeout=120)


def local(engine, messages, **kw):
    return engine.chat(messages, max_new_tokens=N, temperature=0.0, **kw)


def post(base: str, content: list, **body) -> httpx.Response:
    return httpx.post(base + "/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": content}], "max_tokens": N, "temperature": 0, **body})


def test_the_openai_sdk_sends_input_audio_twice_and_gets_the_engines_answer(omni, served, client):
    data = wav_bytes(440.0)
    want = local(omni, user({"type": "audio", "audio": data}))
    assert want.stats.audio_tokens > 0
    for _ in range(2):  # the second request reuses the engine's encoder cache: the same answer
        r = client.chat.completions.create(model="omni", max_tokens=N, temperature=0, messages=[
            {"role": "user", "content": [input_audio(data), {"type": "text", "text": QUESTION}]}])
        assert r.choices[0].message.content == want.answer
        assert r.choices[0].finish_reason == {"stop": "stop", "length": "length"}[want.finish_reason]
        usage = r.usage.model_dump()
        assert usage["audio_tokens"] == want.stats.audio_tokens > 0
        assert usage["prompt_tokens"] == want.stats.prompt_tokens
    stream = client.chat.completions.create(model="omni", max_tokens=N, temperature=0, stream=True,
                                            stream_options={"include_usage": True}, messages=[
            {"role": "user", "content": [input_audio(data), {"type": "text", "text": QUESTION}]}])
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want.answer
    assert chunks[-1].usage.model_dump()["audio_tokens"] == want.stats.audio_tokens
    card = client.models.retrieve("omni").model_dump()
    assert card["vl"]["has_audio"] is True and card["vl"]["has_vision"] is True


def test_audio_url_data_uris_in_other_containers(omni, served, tmp_path):
    for path, mime in ((encoded(tmp_path / "a.flac", "flac"), "audio/flac"),
                       (encoded(tmp_path / "a.ogg", "libopus", "ogg"), "audio/ogg")):
        data = path.read_bytes()
        want = local(omni, user({"type": "audio", "audio": data}))
        r = post(served, [{"type": "audio_url", "audio_url": {"url": data_uri(data, mime)}},
                          {"type": "text", "text": QUESTION}])
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == want.answer
        assert r.json()["usage"]["audio_tokens"] == want.stats.audio_tokens > 0


def test_a_videos_sound_track_follows_use_audio_in_video(omni, served, tmp_path):
    video = Path(write_video(tmp_path / "with_sound.mp4", seconds=1.5)).read_bytes()
    part = {"type": "video_url", "video_url": {"url": data_uri(video, "video/mp4")}}
    usage = {}
    for hear in (None, False, True):
        kwargs = {} if hear is None else {"mm_processor_kwargs": {"use_audio_in_video": hear}}
        r = post(served, [part, {"type": "text", "text": QUESTION}], **kwargs)
        assert r.status_code == 200, r.text
        usage[hear] = r.json()["usage"]
        want = local(omni, user({"type": "video", "video": video}), use_audio_in_video=hear)
        assert r.json()["choices"][0]["message"]["content"] == want.answer
        assert usage[hear]["audio_tokens"] == want.stats.audio_tokens
    assert usage[None]["audio_tokens"] == usage[True]["audio_tokens"] > 0  # on by default: the model hears
    assert usage[False]["audio_tokens"] == 0
    assert usage[False]["vision_tokens_after"] == usage[None]["vision_tokens_after"] > 0


def test_bad_audio_is_a_typed_400_and_the_next_request_works(omni, served):
    good = wav_bytes(330.0)
    want = local(omni, user({"type": "audio", "audio": good}))
    for bad, codes, at_edge in (
            (input_audio(b"this is not audio at all, only text"), {"unsupported_format"}, False),
            ({"type": "input_audio", "input_audio": {"data": "%%%garbage%%%", "format": "wav"}}, {"bad_input"}, True),
            ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "aiff"}}, {"unsupported_format"}, True),
            (input_audio(good[:60]), {"corrupt_media", "audio_too_short"}, False)):  # a header and 8 samples
        r = post(served, [{"type": "text", "text": "hi"}, bad])
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["code"] in codes, error
        assert error["message"].startswith("messages[0].content[1]: ") == at_edge, error  # the edge names the part
        ok = post(served, [input_audio(good), {"type": "text", "text": QUESTION}])
        assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == want.answer
    too_many = post(served, [input_audio(good)] * 5)
    assert too_many.status_code == 400 and too_many.json()["error"]["code"] == "too_many_items"


def test_an_empty_recording_among_good_ones_is_named_and_the_next_request_works(omni, served):
    """Two clips in one request, the second a WAV with no samples: a typed 400 that says which clip (the request's
    second audio), not "corrupt"; the same clips without it answer as the engine does."""
    good = wav_bytes(330.0)
    empty = wav_bytes(330.0, seconds=0.0)
    r = post(served, [input_audio(good), input_audio(empty), {"type": "text", "text": QUESTION}])
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "audio_too_short" and error["message"].startswith("audio 2 of 2: "), error
    want = local(omni, user({"type": "audio", "audio": good}, {"type": "audio", "audio": good}))
    ok = post(served, [input_audio(good), input_audio(good), {"type": "text", "text": QUESTION}])
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == want.answer


def test_one_bad_audio_in_a_concurrent_batch_fails_alone(omni, served):
    clips = {f: wav_bytes(f, 0.8) for f in (220.0, 350.0, 500.0, 700.0)}
    singles = {f: local(omni, user({"type": "audio", "audio": d})).answer for f, d in clips.items()}
    jobs = [(f, [input_audio(d), {"type": "text", "text": QUESTION}]) for f, d in clips.items()]
    jobs.insert(2, ("bad", [input_audio(b"RIFF\x00\x00\x00\x00WAVEnot really"), {"type": "text", "text": QUESTION}]))
    got, barrier = {}, threading.Barrier(len(jobs))

    def send(key, content):
        barrier.wait()
        got[key] = post(served, content)

    threads = [threading.Thread(target=send, args=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert got["bad"].status_code == 400 and got["bad"].json()["error"]["code"] in ("corrupt_media",
                                                                                   "unsupported_format")
    for f, answer in singles.items():
        assert got[f].status_code == 200, got[f].text
        assert got[f].json()["choices"][0]["message"]["content"] == answer


def test_remote_engine_sends_audio_as_the_engine_takes_it(omni, served, tmp_path):
    flac = encoded(tmp_path / "b.flac", "flac", freq=610.0)
    mp3 = encoded(tmp_path / "c.mp3", "libmp3lame", freq=450.0, rate=44100).read_bytes()
    assert mp3[:3] == b"ID3"  # FFmpeg's MP3 muxer starts the file with an ID3v2 tag, as most MP3 files do
    wav = wav_bytes(260.0)
    samples = tone(16000, 1.2, 380.0, 0.25)
    remote = RemoteEngine(served)
    assert remote.has_audio is True and remote.has_vision is True
    for source in (str(flac), wav, mp3, samples):
        messages = user({"type": "audio", "audio": source})
        want = local(omni, messages)
        got = remote.chat(messages, max_new_tokens=N, temperature=0.0)
        assert (got.answer, got.finish_reason) == (want.answer, want.finish_reason)
        assert got.stats.audio_tokens == want.stats.audio_tokens > 0
        assert got.stats.prompt_tokens == want.stats.prompt_tokens
    video = write_video(tmp_path / "v.mp4", seconds=1.5)  # the sound-track switch travels as mm_processor_kwargs
    for hear in (True, False, None):
        messages = user({"type": "video", "video": video})
        got = remote.chat(messages, max_new_tokens=N, temperature=0.0, use_audio_in_video=hear)
        want = local(omni, messages, use_audio_in_video=hear)
        assert (got.answer, got.stats.audio_tokens) == (want.answer, want.stats.audio_tokens)
        assert (got.stats.audio_tokens > 0) == (hear is not False)
    # unset, against a model that says it hears: said outright, since vLLM's own default is off
    body = remote.request_body(user({"type": "video", "video": video}))
    assert body["mm_processor_kwargs"]["use_audio_in_video"] is True
    assert "mm_processor_kwargs" not in remote.request_body(user({"type": "audio", "audio": wav}))
    # the wire form: WAV and MP3 as OpenAI's input_audio, other containers as vLLM's audio_url, sniffed by content
    assert encode_audio(wav)["input_audio"]["format"] == "wav" and encode_audio(mp3)["input_audio"]["format"] == "mp3"
    assert encode_audio(str(flac))["audio_url"]["url"].startswith("data:audio/flac;base64,")
    renamed = tmp_path / "really_flac.wav"
    renamed.write_bytes(flac.read_bytes())
    assert encode_audio(str(renamed))["type"] == "audio_url"
    assert float_wav(samples)[20:22] == b"\x03\x00"  # IEEE float: the samples go over unchanged
    with pytest.raises(UnsupportedFormatError):  # what the local engine says about bytes that are no audio
        remote.chat(user({"type": "audio", "audio": b"plain text, no audio"}), max_new_tokens=2)


@pytest.fixture(scope="module")
def deaf(tmp_path_factory):
    """An Omni checkpoint without an audio encoder."""
    import vl

    d, _ = make_tiny_omni_dir(tmp_path_factory.mktemp("omni_deaf") / "omni", audio=False)
    return vl.Engine.from_pretrained(d)


def refused_as_deaf(base: str) -> None:
    for part in (input_audio(wav_bytes(300.0)),
                 {"type": "audio_url", "audio_url": {"url": "https://example.com/a.wav"}}):  # refused before any fetch
        r = post(base, [{"type": "text", "text": "hi"}, part])
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["code"] == "no_audio" and "does not hear" in error["message"]
        assert error["message"].startswith("messages[0].content[1] (")
    ok = post(base, [{"type": "text", "text": "hi"}])  # and it keeps serving
    assert ok.status_code == 200, ok.text
    remote = RemoteEngine(base)
    assert remote.has_audio is False
    with pytest.raises(NoAudioError, match="does not hear"):
        remote.chat(user({"type": "audio", "audio": wav_bytes(300.0)}), max_new_tokens=2)


def test_an_omni_checkpoint_without_an_audio_encoder_refuses_audio(deaf):
    with in_process_server(deaf, served_names=("deaf",)) as (base, _):
        card = httpx.get(base + "/v1/models").json()["data"][0]
        assert card["vl"]["has_audio"] is False and card["vl"]["has_vision"] is True
        refused_as_deaf(base)


@pytest.mark.skipif(not (DEMO / "config.json").is_file(), reason="the demo model is not shipped here")
def test_the_demo_model_does_not_hear(tmp_path):
    """Nemotron Nano V2 VL (the demo checkpoint) has no audio encoder: audio is refused by name."""
    from vl.runtime.engine import Engine

    with in_process_server(Engine.from_pretrained(str(DEMO)), served_names=("demo",)) as (base, _):
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=60)
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="demo", max_tokens=4, messages=[
                {"role": "user", "content": [input_audio(wav_bytes(300.0)), {"type": "text", "text": "hi"}]}])
        assert info.value.code == "no_audio"
        r = client.chat.completions.create(model="demo", max_tokens=4, temperature=0,
                                           messages=[{"role": "user", "content": "hi"}])
        assert r.usage.model_dump()["audio_tokens"] == 0
        refused_as_deaf(base)


def test_vl_serve_on_a_released_omni_directory_hears_like_its_transformers_layout(omni, omni_dir, tmp_path):
    """`vl serve --model DIR` in its own process on the hub's directory layout (config.json naming the remote class,
    `sound_config`, no feature-extractor file: tests/tiny_models.py `make_released_omni_dir`): the official client's
    `input_audio` answered as the engine on the transformers layout answers it, twice, with a broken recording
    refused in between; /v1/models says it hears."""
    from helpers import free_port, start_serve, stop, wait_health
    from tiny_models import make_released_omni_dir

    released = make_released_omni_dir(omni_dir, tmp_path / "released")
    data = wav_bytes(440.0)
    want = local(omni, user({"type": "audio", "audio": data}))
    port = free_port()
    proc = start_serve(port, "--model", str(released), "--served-model-name", "omni",
                       log_path=tmp_path / "serve.log")
    try:
        base = f"http://127.0.0.1:{port}"
        wait_health(base, proc)
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)
        assert client.models.retrieve("omni").model_dump()["vl"]["has_audio"] is True
        ask = [{"role": "user", "content": [input_audio(data), {"type": "text", "text": QUESTION}]}]
        for broken in (False, True, False):
            if broken:
                with pytest.raises(openai.BadRequestError) as err:
                    client.chat.completions.create(model="omni", max_tokens=N, temperature=0, messages=[
                        {"role": "user", "content": [input_audio(b"RIFF\x00\x00\x00\x00WAVEnot really"),
                                                     {"type": "text", "text": QUESTION}]}])
                assert err.value.code in ("corrupt_media", "unsupported_format"), err.value
                continue
            r = client.chat.completions.create(model="omni", max_tokens=N, temperature=0, messages=ask)
            assert r.choices[0].message.content == want.answer
            assert r.usage.model_dump()["audio_tokens"] == want.stats.audio_tokens > 0
    finally:
        stop(proc)
