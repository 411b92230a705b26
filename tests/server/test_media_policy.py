"""The server's media policy (vl/server/media.py) and request parsing (vl/server/request.py), without a model:
data URIs capped before decoding, file:// only under allowed roots (symlinks resolved), URLs refused unless
fetching is on, and then no non-public address, no redirect, byte and time caps (a loopback test server
counts its hits)."""

from __future__ import annotations

import base64
import http.server
import os
import threading
import time

import pytest

from vl.errors import (
    GenerationOptionError,
    InputError,
    MediaFetchError,
    MediaTooLargeError,
    MediaURLRefusedError,
    ModelNotFoundError,
    NoAudioError,
    RemoteMediaError,
)
from vl.processing.limits import MediaLimits
from vl.server.media import MediaPolicy, resolve
from vl.server.request import Ceilings, parse_chat_request


class _Handler(http.server.BaseHTTPRequestHandler):
    hits = 0
    slow_sent, slow_done = 0, threading.Event()  # bytes of /slow written before the client hung up; it ended

    def do_GET(self):  # noqa: N802
        type(self).hits += 1
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "/ok")
            self.end_headers()
        elif self.path == "/big":
            self.send_response(200)
            self.send_header("Content-Length", str(10_000))
            self.end_headers()
            self.wfile.write(b"x" * 10_000)
        elif self.path == "/slow":  # 40 bytes over 2 s, each read well inside a per-read timeout
            self.send_response(200)
            self.end_headers()
            try:
                for _ in range(40):
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    type(self).slow_sent += 1
                    time.sleep(0.05)
            except OSError:  # the client hung up
                pass
            type(self).slow_done.set()
        else:
            self.send_response(200)
            self.send_header("Content-Length", "5")
            self.end_headers()
            self.wfile.write(b"hello")

    def log_message(self, *args):
        pass


@pytest.fixture()
def http_server():
    _Handler.hits, _Handler.slow_sent, _Handler.slow_done = 0, 0, threading.Event()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_data_uri_size_is_checked_before_decoding():
    policy = MediaPolicy(limits=MediaLimits(max_image_bytes=1000))
    assert resolve("data:image/png;base64," + base64.b64encode(b"a" * 900).decode(), "image", policy) == b"a" * 900
    with pytest.raises(MediaTooLargeError, match="at most 1000"):
        resolve("data:image/png;base64," + "A" * 4000, "image", policy)
    with pytest.raises(InputError, match="base64"):
        resolve("data:image/png;base64,???", "image", policy)
    with pytest.raises(InputError, match="data:<mime>;base64"):
        resolve("data:image/png,raw", "image", policy)


def test_file_urls_only_under_allowed_roots(tmp_path):
    inside, outside = tmp_path / "media", tmp_path / "secret"
    inside.mkdir()
    outside.mkdir()
    (inside / "a.png").write_bytes(b"x")
    (outside / "b.png").write_bytes(b"y")
    os.symlink(outside / "b.png", inside / "link.png")
    with pytest.raises(RemoteMediaError, match="--allowed-root"):
        resolve(f"file://{inside / 'a.png'}", "image", MediaPolicy())
    policy = MediaPolicy(allowed_roots=(inside,))
    assert resolve(f"file://{inside / 'a.png'}", "image", policy) == str((inside / "a.png").resolve())
    for escape in (f"file://{outside / 'b.png'}", f"file://{inside}/../secret/b.png", f"file://{inside / 'link.png'}",
                   f"file://{inside}/%2e%2e/secret/b.png", "file://evil.example.com/etc/passwd"):
        with pytest.raises(RemoteMediaError):
            resolve(escape, "image", policy)


def test_urls_refused_unless_fetching_is_on_and_never_private_by_default(http_server):
    with pytest.raises(MediaURLRefusedError, match="--allow-fetch"):
        resolve(http_server + "/ok", "image", MediaPolicy())
    with pytest.raises(MediaFetchError, match="non-public"):
        resolve(http_server + "/ok", "image", MediaPolicy(allow_fetch=True))
    for host in ("http://169.254.169.254/latest", "http://10.0.0.1/x", "http://localhost/x"):
        with pytest.raises(MediaFetchError, match="non-public"):
            resolve(host, "image", MediaPolicy(allow_fetch=True))
    assert _Handler.hits == 0


def test_fetch_caps_bytes_time_and_redirects(http_server):
    policy = MediaPolicy(allow_fetch=True, allow_private_fetch=True, fetch_max_bytes=1000, fetch_timeout_s=0.5)
    assert resolve(http_server + "/ok", "image", policy) == b"hello"
    with pytest.raises(MediaTooLargeError):
        resolve(http_server + "/big", "image", policy)
    with pytest.raises(MediaFetchError, match="redirect"):
        resolve(http_server + "/redirect", "image", policy)
    with pytest.raises(MediaFetchError, match="longer than"):
        resolve(http_server + "/slow", "image", policy)
    assert _Handler.slow_done.wait(30)
    assert _Handler.slow_sent < 40, "the fetch read the whole slow body instead of hanging up at its time cap"
    assert _Handler.hits == 4  # the redirect's target was never requested


def _parse(**body):
    return parse_chat_request({"messages": [{"role": "user", "content": "hi"}], **body}, served_names=("m",),
                              policy=MediaPolicy(), ceilings=Ceilings(max_tokens=100))


def test_request_fields():
    p = _parse(max_completion_tokens=7, temperature=0, stop="x", seed=3, top_k=-1, mm_processor_kwargs={
        "max_num_tiles": 2, "fps": 1.0, "max_frames": 8}, chat_template_kwargs={"enable_thinking": False},
        video_pruning_rate=0.5, token_pruning_rate=0.25, skip_blank_tiles=True, reasoning_budget=10, user="u")
    c = p.chat
    assert (c.max_new_tokens, c.stop, c.thinking, c.reasoning_budget) == (7, ["x"], False, 10)
    assert c.options.processor_kwargs() == {"max_num_tiles": 2, "fps": 1.0, "max_frames": 8, "skip_blank_tiles": True}
    o = c.options
    assert (o.video_pruning_rate, o.token_pruning_rate, p.params.seed, p.params.top_k) == (0.5, 0.25, 3, 0)
    assert _parse().params.temperature == 1.0 and _parse().chat.max_new_tokens == 100  # OpenAI's defaults, capped
    # chat_template_kwargs: enable_thinking is the reasoning option, the other keys are template variables
    vars_ = _parse(chat_template_kwargs={"enable_thinking": True, "truncate_history_thinking": False}).chat.options
    assert (vars_.thinking, vars_.template_kwargs) == (True, {"truncate_history_thinking": False})
    for bad in ({"max_tokens": 101}, {"n": 3}, {"logprobs": True}, {"tools": [{"type": "function"}]},
                {"presence_penalty": 0.5}, {"mm_processor_kwargs": {"max_frames": 129}},
                {"mm_processor_kwargs": {"size": 9}}, {"video_pruning_rate": 1.0}, {"temperature": -1},
                {"chat_template_kwargs": {"foo": [1]}}, {"chat_template_kwargs": {"messages": "x"}},
                {"stop": ["a"] * 17}, {"top_p": 0}):
        with pytest.raises(GenerationOptionError):
            _parse(**bad)
    with pytest.raises(ModelNotFoundError):
        _parse(model="other")
    with pytest.raises(InputError, match=r"messages\[0\]\.content\[0\]: unsupported part type 'input_image'"):
        _parse(messages=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}])
    with pytest.raises(NoAudioError, match=r"messages\[0\]\.content\[0\] \(input_audio\): this model does not hear"):
        _parse(messages=[{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}])


def test_item_caps_are_checked_before_any_url_is_fetched(http_server):
    from vl.errors import TooManyItemsError

    policy = MediaPolicy(limits=MediaLimits(max_images=4, max_videos=1, max_documents=1), allow_fetch=True,
                         allow_private_fetch=True)
    parts = [{"type": "image_url", "image_url": {"url": f"{http_server}/ok?{i}"}} for i in range(12)]
    with pytest.raises(TooManyItemsError, match="at most 4 image"):
        parse_chat_request({"messages": [{"role": "user", "content": parts}]}, served_names=("m",), policy=policy,
                           ceilings=Ceilings())
    videos = [{"type": "video_url", "video_url": {"url": f"{http_server}/ok?v{i}"}} for i in range(2)]
    with pytest.raises(TooManyItemsError, match="at most 1 video"):  # counted over all messages
        parse_chat_request({"messages": [{"role": "user", "content": videos[:1]},
                                         {"role": "user", "content": videos[1:]}]}, served_names=("m",),
                           policy=policy, ceilings=Ceilings())
    assert _Handler.hits == 0
    # within the caps the same URLs are fetched, once each
    parse_chat_request({"messages": [{"role": "user", "content": parts[:4]}]}, served_names=("m",), policy=policy,
                       ceilings=Ceilings())
    assert _Handler.hits == 4


def _audio_request(parts, policy=None, hears=True):
    return parse_chat_request({"messages": [{"role": "user", "content": parts}]}, served_names=("m",),
                              policy=policy or MediaPolicy(), ceilings=Ceilings(), hears=hears)


def test_audio_parts_follow_the_media_policy(http_server, tmp_path):
    """`audio_url` is resolved as `image_url` is (counted before any fetch, refused URLs and addresses, allowed
    roots); `input_audio` is base64 with a known format; every refusal names the part and has a stable code."""
    from vl.errors import TooManyItemsError, UnsupportedFormatError

    wav = b"RIFF\x24\x00\x00\x00WAVEfmt "
    b64 = base64.b64encode(wav).decode()
    said = _audio_request([{"type": "input_audio", "input_audio": {"data": b64, "format": "wav"}},
                           {"type": "input_audio", "input_audio": {"data": "data:audio/wav;base64," + b64,
                                                                   "format": "MP3"}},
                           {"type": "audio_url", "audio_url": {"url": "data:audio/flac;base64," + b64}},
                           {"type": "audio_url", "audio_url": "data:audio/ogg;base64," + b64},
                           {"type": "text", "text": "What is said?"}])
    assert [p for p in said.chat.messages[0]["content"] if p["type"] == "audio"] == [
        {"type": "audio", "audio": wav}] * 4
    where = r"messages\[0\]\.content\[1\]: "
    ok = {"type": "text", "text": "hi"}
    for part, error, match in (
            ({"type": "input_audio", "input_audio": {"data": "!!not base64!!", "format": "wav"}}, InputError,
             where + "input_audio.data is not valid base64"),
            ({"type": "input_audio", "input_audio": {"data": b64, "format": "aiff"}}, UnsupportedFormatError,
             where + "input_audio.format must be one of wav, mp3"),
            ({"type": "input_audio", "input_audio": {"data": b64, "format": "pcm16"}}, UnsupportedFormatError,
             "raw PCM has no header"),
            ({"type": "input_audio", "input_audio": {"data": b64}}, UnsupportedFormatError, "found None"),
            ({"type": "input_audio", "input_audio": b64}, InputError, where + r"expected \{\"type\": \"input_audio\""),
            ({"type": "audio_url", "audio_url": {"url": "data:audio/wav;base64,@@"}}, InputError,
             where + "the audio data URI is not valid base64"),
            ({"type": "audio_url", "audio_url": {"url": f"{http_server}/ok"}}, MediaURLRefusedError, "--allow-fetch"),
            ({"type": "audio_url", "audio_url": {"url": f"file://{tmp_path}/a.wav"}}, RemoteMediaError,
             "--allowed-root")):
        with pytest.raises(error, match=match):
            _audio_request([ok, part])
    with pytest.raises(MediaTooLargeError, match=where + "the audio is about"):
        _audio_request([ok, {"type": "input_audio", "input_audio": {"data": "A" * 4000, "format": "wav"}}],
                       MediaPolicy(limits=MediaLimits(max_audio_bytes=1000)))
    with pytest.raises(MediaFetchError, match="non-public"):  # --allow-fetch alone never reaches loopback
        _audio_request([{"type": "audio_url", "audio_url": {"url": f"{http_server}/ok"}}],
                       MediaPolicy(allow_fetch=True))
    fetching = MediaPolicy(allow_fetch=True, allow_private_fetch=True)
    urls = [{"type": "audio_url", "audio_url": {"url": f"{http_server}/ok?a{i}"}} for i in range(5)]
    with pytest.raises(TooManyItemsError, match="at most 4 audio"):  # counted before any fetch
        _audio_request(urls, fetching)
    with pytest.raises(NoAudioError, match=r"content\[0\] \(audio_url\): this model does not hear"):
        _audio_request(urls[:1], fetching, hears=False)  # refused before any fetch as well
    assert _Handler.hits == 0
    fetched = _audio_request(urls[:2], fetching)
    assert _Handler.hits == 2 and all(isinstance(p["audio"], bytes) for p in fetched.chat.messages[0]["content"])
    (tmp_path / "a.wav").write_bytes(wav)  # an allowed root: the path goes to the engine, which checks it again
    local = _audio_request([{"type": "audio_url", "audio_url": {"url": f"file://{tmp_path}/a.wav"}}],
                           MediaPolicy(allowed_roots=(tmp_path,)))
    assert local.chat.messages[0]["content"][0] == {"type": "audio", "audio": str((tmp_path / "a.wav").resolve())}


@pytest.mark.parametrize("host", [
    "[::127.0.0.1]", "[::7f00:1]",  # IPv4-compatible
    "[::ffff:127.0.0.1]", "[::ffff:a9fe:a9fe]",  # IPv4-mapped (loopback, the metadata address)
    "[64:ff9b::7f00:1]", "[64:ff9b::a9fe:a9fe]",  # NAT64, well-known prefix: the last 32 bits
    "[64:ff9b:1::a00:1]",  # NAT64, local-use prefix
    "[2002:7f00:1::1]", "[2002:a9fe:a9fe::]",  # 6to4: bits 16-48
    "[2001:0:4136:e378:8000:63bf:80ff:fffe]",  # Teredo: client 127.0.0.1 inverted in the last 32 bits
])
def test_ipv6_forms_of_forbidden_ipv4_addresses_are_refused(http_server, host):
    port = http_server.rsplit(":", 1)[1]
    with pytest.raises(MediaFetchError, match="non-public"):
        resolve(f"http://{host}:{port}/ok", "image", MediaPolicy(allow_fetch=True))
    assert _Handler.hits == 0


def test_ipv6_forms_of_public_ipv4_addresses_pass_the_check():
    import ipaddress

    from vl.server.media import _check_address, embedded_ipv4

    for host, v4 in (("::ffff:8.8.8.8", "8.8.8.8"), ("64:ff9b::808:808", "8.8.8.8"), ("2002:808:808::1", "8.8.8.8")):
        assert [str(a) for a in embedded_ipv4(ipaddress.ip_address(host))] == [v4]
        _check_address(host, MediaPolicy(allow_fetch=True))  # no error: judged by the public address it carries
    assert embedded_ipv4(ipaddress.ip_address("2606:4700::1111")) == []


def test_malformed_urls_and_paths_are_400s(tmp_path):
    (tmp_path / "a.png").write_bytes(b"x")
    policy = MediaPolicy(allowed_roots=(tmp_path,), allow_fetch=True)
    for url in (f"file://{tmp_path}/a%00.png", "http://[::1/x", "http://host:99999999/x", "http://host:port/x"):
        with pytest.raises(InputError) as info:
            resolve(url, "image", policy)
        assert info.value.http_status == 400, url


def _random_value(rng, depth=0):
    if depth > 3 or rng.random() < 0.5:
        return rng.choice([None, True, False, 0, 1, -1, 2**64, -(2**70), 10**400, 1e308, 0.5, "", "x", "none",
                           "data:image/png;base64,AAAA", "file:///etc/passwd", "http://[::1/x", "a\x00b", [], {}])
    if rng.random() < 0.5:
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    keys = ["type", "text", "url", "image_url", "file", "file_data", "fps", "max_num_tiles", "enable_thinking"]
    return {rng.choice(keys): _random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def test_no_body_reaches_an_untyped_error():
    """Any JSON body is answered by a typed error (a 4xx) or parsed: never an exception the server would turn into
    a 500. The cases found by fuzzing first, then seeded random bodies over every field name we know."""
    import json
    import random

    from vl.errors import VLError
    from vl.server.request import KNOWN, parse_json

    def parse(body):
        try:
            parse_chat_request(parse_json(json.dumps(body).encode()), served_names=("m",), policy=MediaPolicy(),
                               ceilings=Ceilings())
        except VLError:
            pass

    hi = {"role": "user", "content": "hi"}
    for field in ("temperature", "top_p", "min_p", "repetition_penalty", "video_pruning_rate", "token_pruning_rate"):
        with pytest.raises(GenerationOptionError):
            parse_chat_request({"messages": [hi], field: 10**400}, served_names=("m",), policy=MediaPolicy(),
                               ceilings=Ceilings())
    with pytest.raises(GenerationOptionError):
        parse_chat_request({"messages": [hi], "mm_processor_kwargs": {"fps": 10**400}}, served_names=("m",),
                           policy=MediaPolicy(), ceilings=Ceilings())
    for effort in ([], {}, 3):
        with pytest.raises(GenerationOptionError):
            parse_chat_request({"messages": [hi], "reasoning_effort": effort}, served_names=("m",),
                               policy=MediaPolicy(), ceilings=Ceilings())
    rng = random.Random(0)
    keys = sorted(KNOWN) + ["unknown_field"]
    for _ in range(3000):
        body = {rng.choice(keys): _random_value(rng) for _ in range(rng.randint(0, 4))}
        if rng.random() < 0.7:
            body["messages"] = [{"role": rng.choice(["user", "system", None]), "content": _random_value(rng)}]
        parse(body)


def test_reasoning_follows_the_request_then_the_messages_then_the_default():
    def thinking(messages, **body):
        return _parse(messages=messages, **body).chat.thinking

    plain = [{"role": "user", "content": "hi"}]
    toggled = [{"role": "system", "content": "/think"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert thinking(plain) is None  # unset: the processor applies the one default (off: tests/test_request_options.py)
    assert thinking(toggled) is None  # the processor reads the toggle (the model card's way)
    assert thinking([{"role": "user", "content": "hi /no_think"}]) is None
    assert thinking(toggled, chat_template_kwargs={"enable_thinking": False}) is False  # the request's flag wins
    assert thinking(toggled, reasoning_effort="minimal") is False
    assert thinking(plain, reasoning_effort="high") is True
    assert thinking([{"role": "assistant", "content": "/think"}, *plain]) is None
