"""`RemoteEngine` against replies no well-behaved server sends: a stream cut off or ended early, a JSON or HTML page
where an event stream belongs, a server that stops sending, gateway errors; and what it reads from the servers it
meets (vLLM's `max_model_len`, llama.cpp's `/props`, a "this model has no vision" refusal). Every reply is exact
bytes from a loopback socket (fake_openai.py); no model is loaded."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_openai import (  # noqa: E402
    FakeOpenAI,
    answer_stream,
    chunk,
    chunked,
    cut_after,
    head,
    raw,
    sse,
    stall,
    status,
)

from vl.errors import DecodeTimeoutError, InputError, ServerReplyError, ServerUnavailableError  # noqa: E402
from vl.server.client import RemoteEngine  # noqa: E402

HI = [{"role": "user", "content": "hi"}]
IMAGE = [{"role": "user", "content": [{"type": "image", "image": b"\x89PNG\r\n\x1a\n" + b"\0" * 64},
                                      {"type": "text", "text": "hi"}]}]


def engine(fake, **kw) -> RemoteEngine:
    return RemoteEngine(fake.base_url, backoff_s=0.01, **kw)


def ask_twice_around(fake, remote, broken_text: str, error):
    """The broken reply raises `error`, and the same engine answers a good request before and after it."""
    assert remote.chat([{"role": "user", "content": "ok"}]).answer == "42"
    with pytest.raises(error) as info:
        remote.chat([{"role": "user", "content": broken_text}])
    assert remote.chat([{"role": "user", "content": "ok"}]).answer == "42"
    return info.value


@pytest.mark.parametrize("body", [
    sse(chunk("The total is"), done=False),                        # ends cleanly: no finish_reason, no [DONE]
    sse(chunk("The total is"), chunk(" 4"), done=False) + b": keep-alive\n\n",
])
def test_a_stream_that_ends_without_finish_or_done_is_unavailable_not_an_answer(body):
    with FakeOpenAI(behaviours={"cut": raw(head() + chunked(body))}) as fake:
        e = ask_twice_around(fake, engine(fake), "cut", ServerUnavailableError)
    assert e.code == "unavailable" and "finish_reason" in str(e) and "[DONE]" in str(e)


def test_a_connection_cut_mid_stream_is_unavailable():
    with FakeOpenAI(behaviours={"cut": cut_after(sse(chunk("The total"), done=False))}) as fake:
        e = ask_twice_around(fake, engine(fake), "cut", ServerUnavailableError)
    assert e.code == "unavailable" and "broke" in str(e)


def test_a_stream_with_finish_reason_but_no_done_is_complete():
    body = sse(chunk("42"), chunk(finish="length"), done=False)
    with FakeOpenAI(behaviours={"x": raw(head() + chunked(body))}) as fake:
        r = engine(fake).chat([{"role": "user", "content": "x"}])
    assert (r.answer, r.finish_reason) == ("42", "length")


@pytest.mark.parametrize("content_type,payload", [
    ("application/json", b'{"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": '
                         b'{"role": "assistant", "content": "42"}, "finish_reason": "stop"}]}'),
    ("text/html; charset=utf-8", b"<html><body><h1>Welcome to nginx!</h1></body></html>"),
])
def test_a_200_that_is_not_an_event_stream_is_a_protocol_error(content_type, payload):
    with FakeOpenAI(behaviours={"page": raw(head(200, content_type, len(payload)) + payload)}) as fake:
        e = ask_twice_around(fake, engine(fake), "page", ServerReplyError)
        assert fake.chat_requests["page"] == 1  # a wrong reply is not retried: it will be the same again
    assert e.code == "bad_server_reply" and content_type.split(";")[0] in str(e) and "text/event-stream" in str(e)


def test_a_malformed_event_is_a_protocol_error():
    body = b"data: " + b'{"choices": [' + b"\n\n"
    with FakeOpenAI(behaviours={"bad": raw(head() + chunked(body))}) as fake:
        e = ask_twice_around(fake, engine(fake), "bad", ServerReplyError)
    assert "malformed" in str(e)


def test_a_server_that_stops_sending_is_unavailable_after_the_read_timeout():
    with FakeOpenAI(behaviours={"slow": stall(sse(chunk("The"), done=False))}) as fake:
        e = ask_twice_around(fake, engine(fake, timeout_s=0.5), "slow", ServerUnavailableError)
        assert fake.chat_requests["slow"] == 1  # the server may still be working on it: not sent again
    assert "0.5 s" in str(e)


def test_a_stall_past_the_callers_deadline_is_a_timeout_with_the_text_so_far():
    with FakeOpenAI(behaviours={"slow": stall(sse(chunk("The"), done=False))}) as fake:
        r = engine(fake, timeout_s=60).chat([{"role": "user", "content": "slow"}], timeout_s=0.3)
    assert (r.finish_reason, r.answer) == ("timeout", "The")


@pytest.mark.parametrize("code", [502, 503, 504])
def test_gateway_errors_are_retried_then_unavailable(code):
    page = "<html><body>Bad Gateway</body></html>"
    with FakeOpenAI(behaviours={"gw": status(code, page, "text/html")}) as fake:
        e = ask_twice_around(fake, engine(fake, max_retries=2), "gw", ServerUnavailableError)
        assert fake.chat_requests["gw"] == 3
    assert f"HTTP {code}" in str(e)


def test_our_own_decode_timeout_504_stays_typed_and_is_not_retried():
    error = {"error": {"message": "decoding the video took longer than 60 s", "code": "decode_timeout"}}
    with FakeOpenAI(behaviours={"v": status(504, error)}) as fake:
        with pytest.raises(DecodeTimeoutError):
            engine(fake, max_retries=2).chat([{"role": "user", "content": "v"}])
        assert fake.chat_requests["v"] == 1


def test_a_refused_connection_is_unavailable():
    fake = FakeOpenAI()
    url = fake.base_url
    fake.close()
    with pytest.raises(ServerUnavailableError, match="3 attempts"):
        RemoteEngine(url, model="x", max_retries=2, backoff_s=0.01).chat(HI)


# --- what the engine reads from the server it meets -------------------------------------------------------
def test_context_length_from_vllm_llama_cpp_and_ours():
    with FakeOpenAI(models=[{"id": "nvidia/x", "object": "model", "owned_by": "vllm", "max_model_len": 32768}]) as f:
        vllm = engine(f)
        assert vllm.context_length == 32768 and vllm.has_vision is None and vllm.has_audio is None  # vLLM does not say
    llama_entry = {"id": "nano.gguf", "object": "model", "owned_by": "llamacpp",
                   "meta": {"n_ctx_train": 131072, "n_vocab": 131072}}
    props = {"default_generation_settings": {"n_ctx": 8192}, "modalities": {"vision": False, "audio": True}}
    with FakeOpenAI(models=[llama_entry], props=props) as f:
        llama = engine(f)
        assert llama.context_length == 8192 and llama.has_vision is False  # the served n_ctx, not n_ctx_train
        assert llama.has_audio is True
    with FakeOpenAI(models=[llama_entry], props={"modalities": {"vision": True}}) as f:
        llama = engine(f)
        assert llama.context_length == 131072 and llama.has_vision is True  # no n_ctx served: the trained one
    ours = {"id": "demo", "object": "model", "owned_by": "vl", "max_model_len": 4096,
            "vl": {"max_num_tiles": 1, "has_vision": True, "has_audio": False}}
    with FakeOpenAI(models=[ours]) as f:
        mine = engine(f)
        assert (mine.context_length, mine.has_vision, mine.model.config.max_num_tiles) == (4096, True, 1)
        assert mine.has_audio is False


@pytest.mark.parametrize("code,payload", [
    (400, {"object": "error", "message": "nvidia/NVIDIA-Nemotron-Nano-9B-v2 is not a multimodal model",
           "type": "BadRequestError", "param": None, "code": 400}),                                   # vLLM
    (500, {"error": {"code": 500, "message": "image input is not supported - hint: if this is unexpected, you "
                                             "may need to provide the mmproj", "type": "server_error"}}),  # llama.cpp
])
def test_a_server_without_vision_becomes_no_vision(code, payload):
    with FakeOpenAI(behaviours={"hi": status(code, payload)}) as fake:
        remote = engine(fake, max_retries=2)
        assert remote.has_vision is None
        with pytest.raises(InputError) as info:
            remote.chat(IMAGE)
        assert fake.chat_requests["hi"] == 1
    assert info.value.code == "no_vision" and type(info.value).__name__ == "NoVisionError"
    assert remote.has_vision is False  # learned from the refusal


AUDIO = [{"role": "user", "content": [{"type": "audio", "audio": b"RIFF\x24\x00\x00\x00WAVEfmt " + b"\0" * 64},
                                      {"type": "text", "text": "hi"}]}]


@pytest.mark.parametrize("code,payload", [
    (400, {"object": "error", "message": "At most 0 audio(s) may be provided in one prompt.",
           "type": "BadRequestError", "param": None, "code": 400}),                                   # vLLM
    (400, {"error": {"message": "You set or defaulted to '{\"audio\": 0}' in `--limit-mm-per-prompt`, but passed 1 "
                                "audio items in the same prompt.", "type": "BadRequestError", "code": 400}}),  # vLLM
    (500, {"error": {"code": 500, "message": "audio input is not supported - hint: if this is unexpected, you "
                                             "may need to provide the mmproj", "type": "server_error"}}),  # llama.cpp
])
def test_a_server_that_does_not_hear_becomes_no_audio(code, payload):
    with FakeOpenAI(behaviours={"hi": status(code, payload)}) as fake:
        remote = engine(fake, max_retries=2)
        assert remote.has_audio is None
        with pytest.raises(InputError) as info:
            remote.chat(AUDIO)
        assert fake.chat_requests["hi"] == 1
    assert info.value.code == "no_audio" and type(info.value).__name__ == "NoAudioError"
    assert remote.has_audio is False and remote.has_vision is None  # learned from the refusal, and only that


def test_a_well_formed_stream_still_reads_the_same():
    with FakeOpenAI(default=raw(head() + chunked(answer_stream("42")))) as fake:
        r = engine(fake).chat(HI)
    assert (r.answer, r.finish_reason, r.stats.prompt_tokens, r.stats.new_tokens) == ("42", "stop", 5, 2)
