"""The server's HTTP edge on the `vl serve` app in this process (vl/server/app.py, vl/server/edge.py), over raw
sockets and httpx: hostile bodies are typed 400s on a connection that stays open (JSON nested 100k deep, a
5,000-digit integer, a lone surrogate, %00 in a file:// path), an unexpected 500 keeps the connection too, every
answer carries `x-request-id`, 405/404/401 are what clients expect, 429 carries `Retry-After`, slow clients are
cut off (a request head sent a byte at a time, a body sent a byte at a time, more connections than allowed),
and the log has timestamps and names the request whose client went away.
"""

from __future__ import annotations

import json
import logging
import select
import socket
import threading
import time

import httpx
import pytest

from helpers import DEMO, in_process_server, never_stopping, paced

pytestmark = pytest.mark.skipif(not (DEMO / "config.json").is_file(), reason="the demo model is not shipped here")
HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def engine():
    from vl.runtime.engine import Engine

    return Engine.from_pretrained(str(DEMO))


@pytest.fixture(scope="module")
def endless(engine):
    return never_stopping(engine)


class Conn:
    """One keep-alive HTTP/1.1 connection on a raw socket: requests are written byte-exact, answers read by
    Content-Length, so a test sees whether the server kept the connection after each answer."""

    def __init__(self, base: str):
        host, port = base.split("//")[1].split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=60)
        self.buf = b""

    def request(self, method: str, path: str, body: bytes = b"", headers: dict | None = None):
        head = f"{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Length: {len(body)}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in (headers or {"Content-Type": "application/json"}).items())
        self.sock.sendall(head.encode() + b"\r\n" + body)
        while b"\r\n\r\n" not in self.buf:
            self._read()
        raw_head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = raw_head.decode("latin-1").split("\r\n")
        fields = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        n = int(fields["content-length"])
        while len(self.buf) < n:
            self._read()
        payload, self.buf = self.buf[:n], self.buf[n:]
        return int(lines[0].split()[1]), fields, payload

    def _read(self):
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("the server closed the connection")
        self.buf += data

    def close(self):
        self.sock.close()


def chat_body(content, **kw) -> bytes:
    return json.dumps({"model": "vl", "max_tokens": 2, "temperature": 0,
                       "messages": [{"role": "user", "content": content}], **kw}).encode()


def test_hostile_bodies_are_typed_400s_on_a_connection_that_stays_open(engine, tmp_path):
    (tmp_path / "a.png").write_bytes(b"x")
    from vl.server.media import MediaPolicy

    hostile = {
        "nested 100k deep": b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
        "5000-digit integer": b'{"model": "vl", "seed": ' + b"9" * 5000 + b', "messages": [{"role": "user", '
                                                                         b'"content": "hi"}]}',
        "lone surrogate": b'{"model": "vl", "max_tokens": 2, "messages": [{"role": "user", "content": "a\\ud800b"}]}',
        "%00 in a file:// path": chat_body([{"type": "image_url", "image_url": {
            "url": f"file://{tmp_path}/a%00.png"}}]),
        "not JSON": b"{",
        "not UTF-8": b'{"model": "\xff"}',
    }
    with in_process_server(engine, policy=MediaPolicy(allowed_roots=(tmp_path,))) as (base, _):
        conn = Conn(base)
        try:
            for name, body in hostile.items():
                status, headers, payload = conn.request("POST", "/v1/chat/completions", body)
                error = json.loads(payload)["error"]
                assert status == 400 and error["code"] == "bad_input", (name, status, payload[:300])
                assert error["type"] == "invalid_request_error" and headers["x-request-id"], name
            status, _, payload = conn.request("POST", "/v1/chat/completions", chat_body("hi"))  # same connection
            assert status == 200, payload
        finally:
            conn.close()


def test_an_unexpected_error_is_a_500_that_keeps_the_connection(engine, monkeypatch):
    import vl.server.app as app_module

    def broken(*args, **kwargs):
        raise RuntimeError("a bug in the server")

    with in_process_server(engine) as (base, _):
        monkeypatch.setattr(app_module, "parse_chat_request", broken)  # a bug behind the edge
        conn = Conn(base)
        try:
            status, headers, payload = conn.request("POST", "/v1/chat/completions", chat_body("hi"),
                                                    {"Content-Type": "application/json", "X-Request-Id": "bug-1"})
            error = json.loads(payload)["error"]
            assert (status, error["code"], headers["x-request-id"]) == (500, "internal_error", "bug-1")
            assert "a bug in the server" not in payload.decode()  # no details of ours go out
            status, _, _ = conn.request("GET", "/health")  # the connection is still open
            assert status == 200
        finally:
            conn.close()


def test_request_ids_routes_and_statuses(engine):
    import openai

    with in_process_server(engine, api_key="k3y", max_queue=0, max_batch=1) as (base, sched):
        auth = {"Authorization": "Bearer k3y"}
        r = httpx.get(base + "/health", headers={"X-Request-Id": "my-id-42"})
        assert r.headers["x-request-id"] == "my-id-42"
        ids = {httpx.get(base + "/health").headers["x-request-id"] for _ in range(3)}
        assert len(ids) == 3 and all(ids)  # generated, one per response
        odd = httpx.get(base + "/health", headers={"X-Request-Id": "has space " + "x" * 300})
        assert odd.headers["x-request-id"] != "has space " + "x" * 300  # not echoed: replaced
        # an unknown /v1 path or method without the key is 401 (no route probing), with it 404 / 405
        assert httpx.get(base + "/v1/nothing-here").status_code == 401
        assert httpx.delete(base + "/v1/models").status_code == 401
        r = httpx.get(base + "/v1/nothing-here", headers=auth)
        assert (r.status_code, r.json()["error"]["code"]) == (404, "not_found")
        r = httpx.get(base + "/v1/chat/completions", headers=auth)
        error = r.json()["error"]
        assert (r.status_code, error["code"], error["type"]) == (405, "method_not_allowed", "invalid_request_error")
        assert r.headers["allow"] == "POST" and r.headers["x-request-id"]
        # GET /v1/models/{id}: the SDK's models.retrieve
        client = openai.OpenAI(base_url=base + "/v1", api_key="k3y", max_retries=0, timeout=60)
        card = client.models.retrieve("vl")
        assert card.id == "vl" and card.model_extra["max_model_len"] == engine.context_length
        with pytest.raises(openai.NotFoundError) as info:
            client.models.retrieve("gpt-4o")
        assert info.value.body["code"] == "model_not_found"
        # 429 carries Retry-After: the engine is busy (a job it holds) and the queue holds none
        with paced(engine, 0.05):
            slow = threading.Thread(target=lambda: httpx.post(
                base + "/v1/chat/completions", headers=auth, timeout=120,
                json={"model": "vl", "messages": HELLO, "max_tokens": 100, "temperature": 0, "ignore_eos": True}))
            slow.start()
            end = time.monotonic() + 60
            while sched.snapshot()["running"] == 0 and time.monotonic() < end:
                time.sleep(0.01)
            r = httpx.post(base + "/v1/chat/completions", headers=auth, timeout=60,
                           json={"model": "vl", "messages": HELLO, "max_tokens": 2})
            slow.join(120)
        assert (r.status_code, r.json()["error"]["code"]) == (429, "queue_full")
        assert int(r.headers["retry-after"]) >= 1


def test_a_streamed_request_with_a_bad_image_is_an_http_400(engine):
    import openai

    from helpers import data_uri, png_bytes

    bad = {"type": "image_url", "image_url": {"url": data_uri(b"%PDF-1.4 not an image", "image/png")}}
    cut = {"type": "image_url", "image_url": {"url": data_uri(png_bytes()[:60], "image/png")}}  # a truncated PNG
    with in_process_server(engine) as (base, _):
        client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0, timeout=60)
        for part, code in ((bad, "unsupported_format"), (cut, "corrupt_media")):
            for stream in (True, False):
                with pytest.raises(openai.BadRequestError) as info:
                    out = client.chat.completions.create(model="vl", max_tokens=2, stream=stream,
                                                         messages=[{"role": "user", "content": [part]}])
                    list(out) if stream else None
                assert info.value.status_code == 400 and info.value.body["code"] in (code, "bad_media"), stream
        # and the same client goes on: a good streamed request after the errors
        chunks = list(client.chat.completions.create(model="vl", max_tokens=3, stream=True, messages=HELLO,
                                                     temperature=0))
        assert chunks and chunks[-1].choices[0].finish_reason


def _closed(sock: socket.socket, wait_s: float) -> bool:
    """Whether the server closed `sock` (a read returns nothing) within `wait_s`."""
    ready, _, _ = select.select([sock], [], [], wait_s)
    if not ready:
        return False
    try:
        return sock.recv(1024) == b""
    except ConnectionError:
        return True


def test_slow_clients_are_cut_off(engine):
    from vl.server.ceilings import ConnectionLimits

    limits = ConnectionLimits(header_timeout_s=1.0, body_timeout_s=1.0, keep_alive_s=30.0, max_connections=3)
    with in_process_server(engine, connection=limits) as (base, _):
        host, port = base.split("//")[1].split(":")
        # a request head sent a byte at a time (slowloris): cut off long before the head is complete
        head = b"GET /health HTTP/1.1\r\nHost: test\r\nX-Padding: " + b"p" * 200 + b"\r\n\r\n"
        sent, cut = 0, False
        with socket.create_connection((host, int(port)), timeout=30) as s:
            for byte in head:
                try:
                    s.sendall(bytes([byte]))
                except OSError:
                    cut = True
                    break
                sent += 1
                if _closed(s, 0.2):
                    cut = True
                    break
        assert cut and sent < len(head) // 2, (cut, sent, len(head))
        # a connection that says nothing is closed too
        with socket.create_connection((host, int(port)), timeout=30) as s:
            assert _closed(s, 30)
        # a body sent a byte at a time: 408 with our code
        with socket.create_connection((host, int(port)), timeout=30) as s:
            body = chat_body("hi")
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                      + f"Content-Length: {len(body)}\r\n\r\n".encode())
            answer = b""
            for byte in body:
                try:
                    s.sendall(bytes([byte]))
                except OSError:
                    break
                ready, _, _ = select.select([s], [], [], 0.2)
                if ready:
                    break
            while b"}}" not in answer:  # the whole JSON answer (its head and body may come in several reads)
                data = s.recv(65536)
                if not data:
                    break
                answer += data
            assert answer.startswith(b"HTTP/1.1 408") and b'"request_timeout"' in answer, answer[:300]
        # at most 3 connections: idle ones held open take the places, a 4th client's request is refused
        held = [Conn(base) for _ in range(3)]
        try:
            for c in held:
                assert c.request("GET", "/health")[0] == 200
            assert httpx.get(base + "/health", timeout=30).status_code == 503
        finally:
            for c in held:
                c.close()
        end = time.monotonic() + 30
        while httpx.get(base + "/health", timeout=30).status_code != 200 and time.monotonic() < end:
            time.sleep(0.05)  # the server notices the closed connections
        assert httpx.get(base + "/health", timeout=30).status_code == 200


class _Records(logging.Handler):
    def __init__(self, wanted: str):
        super().__init__()
        self.wanted, self.lines, self.seen = wanted, [], threading.Event()

    def emit(self, record):
        line = record.getMessage()
        self.lines.append(line)
        if self.wanted in line:
            self.seen.set()


def test_the_log_has_timestamps_and_names_a_client_that_went_away(endless):
    records = _Records("gone-client-7")
    with paced(endless), in_process_server(endless, log_level="info") as (base, sched):
        logger = logging.getLogger("vl.server")
        logger.addHandler(records)
        try:
            body = {"model": "vl", "messages": HELLO, "max_tokens": 4000, "temperature": 0, "stream": True}
            with httpx.Client(timeout=60) as h, h.stream("POST", base + "/v1/chat/completions", json=body,
                                                         headers={"X-Request-Id": "gone-client-7"}) as r:
                assert r.status_code == 200 and r.headers["x-request-id"] == "gone-client-7"
                assert any(line.startswith("data:") for line in r.iter_lines())  # the answer has begun
            assert records.seen.wait(30), records.lines
            assert any("went away" in line and "gone-client-7" in line for line in records.lines), records.lines
            # the lines `vl serve` writes carry a timestamp (the handler its log configuration installs)
            handler = logging.getLogger("vl").handlers[0]
            text = handler.format(logging.LogRecord("vl.server", logging.INFO, __file__, 1, "x", None, None))
            assert time.strftime("%Y-%m-%d") in text and text.endswith("vl.server: x"), text
        finally:
            logger.removeHandler(records)
