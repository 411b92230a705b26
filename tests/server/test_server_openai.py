"""`vl serve` on the shipped demo model, driven by the official `openai` client: answers, streaming, reasoning,
usage and the error classes (docs/server.md).

Answers are compared with `Engine.chat` greedy in this process: the server must say exactly what the library
says, streamed or not, for an image, a PDF and a video question.
"""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "processing"))
from helpers import DEMO, data_uri, free_port, png_bytes, start_serve, stop, wait_health  # noqa: E402
from media_fixtures import make_pdf, make_video, red_square_page  # noqa: E402

openai = pytest.importorskip("openai", reason="the openai client is a [dev] extra: pip install openai")
pytestmark = pytest.mark.skipif(not (DEMO / "config.json").is_file(), reason="the demo model is not shipped here")


@pytest.fixture(scope="module")
def engine():
    from vl.runtime.engine import Engine

    return Engine.from_pretrained(str(DEMO))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = free_port()
    proc = start_serve(port, "--max-queue", "4", log_path=tmp_path_factory.mktemp("serve") / "serve.log")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_health(base, proc)
        yield base
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    d = tmp_path_factory.mktemp("media")
    pdf = make_pdf([red_square_page(), red_square_page(120, 200)])
    video = Path(make_video(d / "clip.mp4", frames=16, fps=4, size=(64, 48))).read_bytes()
    return {"image": png_bytes("green"), "pdf": pdf, "video": video}


def local_and_remote(kind: str, data: bytes, question: str):
    """(our messages, the OpenAI content parts) for one question about one medium."""
    local = {"type": kind, kind: data}
    if kind == "image":
        remote = {"type": "image_url", "image_url": {"url": data_uri(data, "image/png")}}
    elif kind == "video":
        remote = {"type": "video_url", "video_url": {"url": data_uri(data, "video/mp4")}}
    else:
        remote = {"type": "file", "file": {"filename": "doc.pdf", "file_data": data_uri(data, "application/pdf")}}
    text = {"type": "text", "text": question}
    return [{"role": "user", "content": [local, text]}], [{"role": "user", "content": [remote, text]}]


QUESTIONS = {"image": "What colour is the picture?", "pdf": "What is on the pages?",
             "video": "Which way does the shape move?"}


def test_models_and_health(server, client):
    models = client.models.list().data
    assert [m.id for m in models] == ["demo"]
    health = httpx.get(server + "/health").json()
    assert health["status"] == "ok" and health["max_queue"] == 4
    from vl.server.client import RemoteEngine  # what `vl app --backend` and eval read of a vl serve

    remote = RemoteEngine(server + "/v1")
    assert (remote.has_vision, remote.model.config.max_num_tiles) == (True, 1)


@pytest.mark.parametrize("kind", ["image", "pdf", "video"])
def test_answers_equal_engine_chat(engine, client, media, kind):
    ours, theirs = local_and_remote(kind, media[kind], QUESTIONS[kind])
    ref = engine.chat(ours, max_new_tokens=24, thinking=False)
    assert ref.answer  # a test on an empty answer would prove little
    kw = dict(model="demo", messages=theirs, max_tokens=24, temperature=0,
              extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    r = client.chat.completions.create(**kw)
    assert r.choices[0].message.content == ref.answer
    assert r.choices[0].finish_reason == {"length": "length"}.get(ref.finish_reason, "stop")
    u = r.usage
    assert (u.prompt_tokens, u.completion_tokens) == (ref.stats.prompt_tokens, ref.stats.new_tokens)
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    extra = u.model_extra
    assert (extra["vision_tokens_before"], extra["vision_tokens_after"]) == (ref.stats.vision_tokens_before,
                                                                             ref.stats.vision_tokens_after)
    assert ref.stats.vision_tokens_before > 0
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == ref.answer
    assert chunks[-1].usage.completion_tokens == ref.stats.new_tokens and not chunks[-1].choices


def test_reasoning_content_is_separated(engine, client, media):
    ours, theirs = local_and_remote("image", media["image"], QUESTIONS["image"])
    ref = engine.chat(ours, max_new_tokens=64, thinking=True)
    assert ref.reasoning and not ref.reasoning_truncated, "the demo model should reason, then answer"
    for how in ({"extra_body": {"chat_template_kwargs": {"enable_thinking": True}}},
                {"messages": [{"role": "system", "content": "/think"}] + theirs}):
        kw = {"model": "demo", "messages": theirs, "max_tokens": 64, "temperature": 0, **how}
        m = client.chat.completions.create(**kw).choices[0].message
        assert m.model_extra["reasoning_content"] == ref.reasoning and m.content == ref.answer
        chunks = list(client.chat.completions.create(**kw, stream=True))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        assert "".join(d.model_extra.get("reasoning_content") or "" for d in deltas) == ref.reasoning
        assert "".join(d.content or "" for d in deltas) == ref.answer
        assert all("</think>" not in (d.content or "") + (d.model_extra.get("reasoning_content") or "")
                   for d in deltas)
    off = client.chat.completions.create(model="demo", max_tokens=64, temperature=0,
                                         messages=[{"role": "system", "content": "/no_think"}] + theirs)
    assert off.choices[0].message.model_extra["reasoning_content"] is None
    assert off.choices[0].message.content == engine.chat(ours, max_new_tokens=64, thinking=False).answer


def _error(call):
    with pytest.raises(openai.APIStatusError) as info:
        call()
    body = info.value.body
    return info.value.status_code, (body or {}).get("code") if isinstance(body, dict) else None


def test_bad_requests_are_400_with_our_codes(client, media):
    def ask(content, **kw):
        kw = {"max_tokens": 4, **kw}
        return lambda: client.chat.completions.create(model="demo", temperature=0,
                                                      messages=[{"role": "user", "content": content}], **kw)

    img = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    assert _error(ask([img, {"type": "text", "text": "hi"}])) == (400, "media_url_refused")
    bad64 = {"type": "image_url", "image_url": {"url": "data:image/png;base64,@@not base64@@"}}
    assert _error(ask([bad64])) == (400, "bad_input")
    not_png = {"type": "image_url", "image_url": {"url": data_uri(b"%PDF-1.4 not an image", "image/png")}}
    assert _error(ask([not_png])) == (400, "unsupported_format")  # media errors in a valid body are 400s
    assert _error(ask("hi", n=2)) == (400, "unsupported_field")
    assert _error(ask("hi", extra_body={"mm_processor_kwargs": {"max_num_tiles": 99}})) == (400, "bad_generation_option")
    assert _error(ask("hi", max_tokens=10**6)) == (400, "bad_generation_option")
    local = {"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}
    assert _error(ask([local])) == (400, "remote_media_refused")
    status, code = _error(lambda: client.chat.completions.create(model="gpt-4o", messages=[{"role": "user",
                                                                                             "content": "hi"}]))
    assert (status, code) == (404, "model_not_found")
    # the server keeps serving after each of them
    assert client.chat.completions.create(model="demo", max_tokens=2, temperature=0,
                                          messages=[{"role": "user", "content": "hi"}]).choices[0].finish_reason


def test_too_many_items_is_400_and_bad_json_too(server):
    # a 5-image request over the per-request image cap of 4 (counted before anything is decoded): the body itself
    # is fine, so 400 (413 is only for a body over --max-body-mb)
    uri = data_uri(png_bytes(), "image/png")
    parts = [{"type": "image_url", "image_url": {"url": uri}}] * 5
    r = httpx.post(server + "/v1/chat/completions", timeout=60,
                   json={"model": "demo", "messages": [{"role": "user", "content": parts}], "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_items", r.text
    r = httpx.post(server + "/v1/chat/completions", content=b"{", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_input"
    r = httpx.get(server + "/v1/nothing-here")
    assert r.status_code == 404 and "error" in r.json()


def test_a_vllm_launch_line_starts_vl_serve_and_means_the_same(engine, tmp_path):
    """The flags of vLLM's recipe for this model, given to `vl serve` in its own process: vLLM's names for our
    settings act (`--max-num-seqs`, `--allowed-local-media-path`, `--media-io-kwargs`' sampling, `--dtype auto`),
    the ones that change nothing here are accepted and named at start, and a video read from the allowed folder is
    answered as `Engine.chat` answers it with the same sampling and EVS rate; a file outside it is refused."""
    from vl.server.cli import parse_args

    for changes_answers in (["--quantization", "fp8"], ["--kv-cache-dtype", "fp8"], ["--hf-overrides", "{}"],
                            ["--mamba_ssm_cache_dtype", "bfloat16"], ["a", "--model", "b"]):
        with pytest.raises(SystemExit):  # online quantization, another cache or state dtype, config overrides, two
            parse_args(changes_answers)  # models: usage errors
    assert parse_args(["--kv-cache-dtype", "auto", "--enable-chunked-prefill"]).max_batch == 8
    assert parse_args(["--quantization", "modelopt_fp4"]).max_batch == 8
    folder = tmp_path / "media"
    folder.mkdir()
    video = Path(make_video(folder / "clip.mp4", frames=16, fps=4, size=(64, 48)))
    outside = Path(make_video(tmp_path / "outside.mp4", frames=8, fps=4, size=(64, 48)))
    port, log = free_port(), tmp_path / "serve.log"
    # the model where `vllm serve MODEL` takes it, and flags spelt with underscores as vLLM also takes them
    proc = start_serve(port, str(DEMO), "--trust-remote-code", "--media-io-kwargs",
                       '{"video": {"fps": 4, "num_frames": 8}}', "--max-model-len", "131072", "--video-pruning-rate",
                       "0.5", "--allowed-local-media-path", str(folder), "--served-model-name", "nano-vl",
                       "--tensor-parallel-size", "2", "--data-parallel-size", "1", "--max_num_seqs", "4", "--dtype",
                       "auto", "--no-enable-prefix-caching", "--disable-mm-preprocessor-cache", "--reasoning-parser",
                       "nemotron_v3", "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder",
                       "--mamba_ssm_cache_dtype=float32", log_path=log)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_health(base, proc)
        assert httpx.get(base + "/health").json()["max_batch"] == 4
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)

        def ask(path):
            return client.chat.completions.create(model="nano-vl", max_tokens=16, temperature=0, messages=[
                {"role": "user", "content": [{"type": "video_url", "video_url": {"url": f"file://{path}"}},
                                             {"type": "text", "text": QUESTIONS["video"]}]}])

        want = engine.chat([{"role": "user", "content": [{"type": "video", "video": str(video)},
                                                          {"type": "text", "text": QUESTIONS["video"]}]}],
                           max_new_tokens=16, fps=4.0, max_frames=8, video_pruning_rate=0.5)
        got = ask(video)
        assert got.choices[0].message.content == want.answer
        assert got.usage.prompt_tokens == want.stats.prompt_tokens
        with pytest.raises(openai.BadRequestError):
            ask(outside)
        with pytest.raises(openai.BadRequestError, match="tool"):  # the tool flags call no tools into being
            client.chat.completions.create(model="nano-vl", max_tokens=4, messages=[{"role": "user", "content": "hi"}],
                                           tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}])
        assert ask(video).choices[0].message.content == want.answer  # and again after the refusals
    finally:
        stop(proc)
    text = log.read_text()
    for flag in ("--trust-remote-code", "--max-model-len 131072", "--tensor-parallel-size 2",
                 "--reasoning-parser nemotron_v3", "--data-parallel-size 1", "--enable-auto-tool-choice",
                 "--tool-call-parser qwen3_coder", "--mamba-ssm-cache-dtype float32"):
        assert f"vLLM's {flag} accepted and not used" in text, text[-2000:]
