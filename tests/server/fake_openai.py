"""A scripted OpenAI-compatible server on a loopback socket, for the client's failure paths.

Raw sockets rather than a web framework, so that a test states the exact bytes a reply has (a stream cut off
mid-way, a JSON or HTML page where an event stream belongs, a server that stops sending): what a real proxy,
a crashed vLLM or a llama.cpp server put on the wire. Each chat request is answered by the behaviour chosen
for its last user text (`behaviours`), else by `default`; `chat_requests` counts them, so tests bound work by
counting. `close()` makes the address refuse connections, as a server that went away does.
"""

from __future__ import annotations

import json
import socket
import threading
from collections import Counter


def sse(*objects, done: bool = True) -> bytes:
    """The body of an event stream: one `data:` event per object, then `[DONE]`."""
    out = b"".join(b"data: " + json.dumps(o).encode() + b"\n\n" for o in objects)
    return out + (b"data: [DONE]\n\n" if done else b"")


def chunk(content: str | None = None, finish: str | None = None, **extra) -> dict:
    delta = {"content": content} if content is not None else {}
    return {"id": "c", "object": "chat.completion.chunk", "model": "fake",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}


def answer_stream(text: str) -> bytes:
    return sse(chunk(text), chunk(finish="stop"),
               {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}})


def head(status: int = 200, content_type: str = "text/event-stream", length: int | None = None,
         reason: str = "OK") -> bytes:
    lines = [f"HTTP/1.1 {status} {reason}", f"content-type: {content_type}", "connection: close"]
    lines.append(f"content-length: {length}" if length is not None else "transfer-encoding: chunked")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def chunked(body: bytes, final: bool = True) -> bytes:
    """`body` in HTTP/1.1 chunked framing; without the terminating zero-size chunk when `final` is False."""
    return (f"{len(body):x}\r\n".encode() + body + b"\r\n" if body else b"") + (b"0\r\n\r\n" if final else b"")


# --- behaviours: (connection, fake) -> None -------------------------------------------------------------
def reply(text: str = "42"):
    """A well-formed streamed answer."""
    return lambda conn, fake: conn.sendall(head() + chunked(answer_stream(text)))


def raw(data: bytes):
    """Exactly these bytes, then the connection closes."""
    return lambda conn, fake: conn.sendall(data)


def cut_after(body: bytes):
    """A 200 event stream whose connection closes after `body`, mid-message (no final chunk)."""
    return lambda conn, fake: conn.sendall(head() + chunked(body, final=False))


def stall(body: bytes = b""):
    """A 200 event stream that sends `body` and then nothing, until the client hangs up or the fake closes."""
    def behave(conn, fake):
        conn.sendall(head() + chunked(body, final=False))
        fake.stopping.wait()
    return behave


def reply_then_leave(text: str = "42"):
    """A well-formed answer, after which the server goes away (its address refuses connections). It stops listening
    before it answers, so that no request sent after the answer can still be accepted."""
    def behave(conn, fake):
        fake.stop_listening()
        reply(text)(conn, fake)
        threading.Thread(target=fake.close, daemon=True).start()
    return behave


def status(code: int, payload: dict | str, content_type: str = "application/json"):
    data = (json.dumps(payload) if isinstance(payload, dict) else payload).encode()
    return lambda conn, fake: conn.sendall(head(code, content_type, len(data), reason="Error") + data)


class FakeOpenAI:
    def __init__(self, port: int = 0, models: list[dict] | None = None, props: dict | None = None,
                 default=None, behaviours: dict | None = None):
        self.models = models if models is not None else [{"id": "fake", "object": "model"}]
        self.props, self.default = props, default or reply()
        self.behaviours = dict(behaviours or {})
        self.chat_requests: Counter = Counter()  # last user text -> requests seen
        self.stopping = threading.Event()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._serve, daemon=True)
        self._accept.start()

    def _serve(self):
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            t = threading.Thread(target=self._handle, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _read_request(self, conn) -> tuple[str, str, bytes]:
        data = b""
        while b"\r\n\r\n" not in data:
            got = conn.recv(65536)
            if not got:
                raise ConnectionError("client closed before sending a request")
            data += got
        header, _, body = data.partition(b"\r\n\r\n")
        lines = header.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        length = next((int(l.split(":", 1)[1]) for l in lines[1:] if l.lower().startswith("content-length:")), 0)
        while len(body) < length:
            body += conn.recv(65536)
        return method, path, body

    def _handle(self, conn):
        with conn:
            try:
                method, path, body = self._read_request(conn)
                if method == "GET" and path == "/v1/models":
                    payload = json.dumps({"object": "list", "data": self.models}).encode()
                    conn.sendall(head(200, "application/json", len(payload)) + payload)
                elif method == "GET" and path == "/props" and self.props is not None:
                    payload = json.dumps(self.props).encode()
                    conn.sendall(head(200, "application/json", len(payload)) + payload)
                elif method == "POST" and path == "/v1/chat/completions":
                    text = last_user_text(json.loads(body))
                    self.chat_requests[text] += 1
                    self.behaviours.get(text, self.default)(conn, self)
                else:
                    status(404, {"error": {"message": f"no route {method} {path}", "code": 404}})(conn, self)
            except (OSError, ConnectionError, ValueError):
                pass  # the client hung up: nothing to answer

    def stop_listening(self) -> None:
        """New connections are refused from here on; connections already accepted go on."""
        self.stopping.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    def close(self) -> None:
        """Stop listening: new connections are refused, stalled replies end."""
        self.stop_listening()
        self._accept.join(5)
        for t in self._threads:
            t.join(5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def last_user_text(body: dict) -> str:
    content = [m for m in body.get("messages", []) if m.get("role") == "user"][-1]["content"]
    if isinstance(content, str):
        return content
    return " ".join(p.get("text", "") for p in content if p.get("type") == "text")
