"""The HTTP edge around the app: request ids, the last-resort error answer, slow-client bounds, the log format.

- Every response carries `x-request-id`: the client's own when it sent a usable one (as vLLM, nginx and the
  OpenAI API echo it), else a new one; log lines about a request name it.
- An exception that no typed handler took is answered here with a JSON 500 `internal_error` as an ordinary
  response, so the keep-alive connection stays open (Starlette's `ServerErrorMiddleware` re-raises after its
  answer, and uvicorn then drops the connection).
- Slow clients are bounded (the slowloris family): a request head must arrive within `header_timeout_s` of its
  first byte (uvicorn has no such timer: a client sending a header byte a second holds a connection forever);
  an idle keep-alive connection closes after `keep_alive_s` (uvicorn's `timeout_keep_alive`); at most
  `max_connections` connections are open (uvicorn's `limit_concurrency`: one more gets 503); the body's own
  deadline is the app's (vl/server/app.py, `read_json`).
"""

from __future__ import annotations

import logging
import re
import uuid

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from vl.server import responses as R
from vl.server.ceilings import ConnectionLimits

log = logging.getLogger("vl.server")
_CLIENT_ID = re.compile(r"[\x21-\x7e]{1,128}")  # printable ASCII, no spaces: safe to echo and to log


def request_id(headers) -> str:
    """The client's `x-request-id` when it is usable, else a fresh one."""
    given = headers.get("x-request-id")
    return given if given is not None and _CLIENT_ID.fullmatch(given) else uuid.uuid4().hex


class Edge:
    """ASGI middleware (outside the routes and typed handlers): request id in and out, last-resort 500."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        rid = request_id(headers)
        scope.setdefault("state", {})["request_id"] = rid
        started = False

        async def send_with_id(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message = {**message, "headers": [*message.get("headers", ()), (b"x-request-id", rid.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:  # noqa: BLE001 - our bug: logged here, answered without details
            log.exception("internal error in request %s %s (request id %s)", scope.get("method"), scope.get("path"),
                          rid)
            if started:  # part of the answer is out: nothing else can be said on this connection
                return
            body = R.json_bytes(R.error_body(500, "internal_error", "internal server error; the request was "
                                             f"logged (request id {rid})"))
            await send({"type": "http.response.start", "status": 500,
                        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                    (b"x-request-id", rid.encode())]})
            await send({"type": "http.response.body", "body": body})


def protocol_class(header_timeout_s: float) -> type:
    """uvicorn's h11 protocol with a deadline on each request head: armed at the connection's start and at the
    first byte of every later head, disarmed once h11 has the whole head; when it fires the connection is closed."""

    class HeadTimeoutProtocol(H11Protocol):
        _head_timer = None

        def connection_made(self, transport):
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._head_timer is None and self.conn.their_state is h11.IDLE:
                self._arm()
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:
                self._disarm()

        def connection_lost(self, exc):
            self._disarm()
            super().connection_lost(exc)

        def _arm(self):
            self._head_timer = self.loop.call_later(header_timeout_s, self._head_timed_out)

        def _disarm(self):
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self):
            self._head_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                client = "%s:%d" % self.client if self.client else "a client"
                log.info("closed the connection of %s: no complete request head within %g s", client,
                         header_timeout_s)
                self.transport.close()

    return HeadTimeoutProtocol


def uvicorn_kwargs(limits: ConnectionLimits, log_level: str = "info") -> dict:
    """The `uvicorn.Config` keywords that `vl serve` and the tests' in-process server share."""
    # uvicorn refuses a request once `limit_concurrency` connections are open, its own included: +1 lets
    # `max_connections` connections be served at once
    return {"http": protocol_class(limits.header_timeout_s), "timeout_keep_alive": limits.keep_alive_s,
            "limit_concurrency": limits.max_connections + 1, "log_config": log_config(log_level),
            "log_level": log_level}


def log_config(level: str = "info") -> dict:
    """Timestamps on every line (uvicorn's default format has none), for uvicorn's loggers and ours."""
    level = level.upper()
    line = {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}
    access = {"()": "uvicorn.logging.AccessFormatter", "use_colors": False,
              "fmt": '%(asctime)s %(levelname)s access: %(client_addr)s "%(request_line)s" %(status_code)s'}
    handler = {"class": "logging.StreamHandler", "stream": "ext://sys.stderr"}
    return {"version": 1, "disable_existing_loggers": False,
            "formatters": {"line": line, "access": access},
            "handlers": {"line": {**handler, "formatter": "line"}, "access": {**handler, "formatter": "access"}},
            "loggers": {"uvicorn": {"handlers": ["line"], "level": level, "propagate": False},
                        "uvicorn.error": {"level": level},
                        "uvicorn.access": {"handlers": ["access"], "level": level, "propagate": False},
                        # ours propagate too: a root handler (a test's log capture, an embedding app) still sees them
                        "vl": {"handlers": ["line"], "level": level, "propagate": True}}}
