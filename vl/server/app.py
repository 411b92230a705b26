"""The OpenAI-compatible HTTP surface: `GET /v1/models`, `GET /v1/models/{id}`, `POST /v1/chat/completions`,
`GET /health`.

Starlette on uvicorn (the stack FastAPI, vLLM's and mlx-vlm's servers stand on). Handlers only parse, admit
and relay: parsing is vl/server/request.py, admission and batching vl/server/scheduler.py, shapes
vl/server/responses.py, request ids, the last-resort 500 and slow-client bounds vl/server/edge.py. A client that
disconnects cancels its generation (vLLM's `with_cancellation`): a streamed response notices when its send fails
or Starlette cancels it, a plain one polls the connection. A streamed request answers its HTTP status once its
first token (or its error) is known, so an error found before the answer begins is an HTTP error, as vLLM does.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from vl.errors import (
    AuthenticationError,
    DecodeTimeoutError,
    ModelNotFoundError,
    RequestBodyTimeoutError,
    RequestTooLargeError,
    ServerUnavailableError,
    VLError,
)
from vl.runtime.results import ChatResult
from vl.server import responses as R
from vl.server.ceilings import Ceilings, ConnectionLimits
from vl.server.edge import Edge
from vl.server.media import MediaPolicy
from vl.server.request import parse_chat_request, parse_json
from vl.server.template_defaults import TemplateDefaults
from vl.server.scheduler import Job, Scheduler

log = logging.getLogger("vl.server")
RETRY_AFTER_S = 1  # what a 429 asks the client to wait: a queue slot frees as soon as one answer ends


@dataclass
class ServerConfig:
    served_names: tuple[str, ...] = ("vl",)
    api_key: str | None = None
    max_body_bytes: int = 64 << 20
    default_max_tokens: int = 256
    policy: MediaPolicy = field(default_factory=MediaPolicy)
    ceilings: Ceilings = field(default_factory=Ceilings)
    model_info: dict = field(default_factory=dict)  # extra facts for /v1/models (context, defaults)
    connection: ConnectionLimits = field(default_factory=ConnectionLimits)
    template_defaults: TemplateDefaults | None = None  # --default-chat-template-kwargs
    default_fps: float | None = None  # video sampling of requests that set none (--media-io-kwargs; None: 2 fps)


def model_facts(engine) -> dict:
    """What the served model takes, under `vl` in /v1/models (RemoteEngine's `has_vision` and `has_audio`): whether it
    reads images (a text-only Nemotron-H does not) and whether it hears (an Omni checkpoint with an audio encoder)."""
    processor = engine.processor
    return {"has_vision": bool(getattr(processor, "has_vision", True)),
            "has_audio": bool(getattr(processor, "has_audio", False))}


def create_app(engine, scheduler: Scheduler, config: ServerConfig) -> Starlette:
    vocab_size = getattr(engine.lm.config, "vocab_size", None)  # the logits' size, for logit_bias ids
    facts = {**model_facts(engine), **(config.model_info.get("vl") or {})}
    hears = facts["has_audio"]  # audio parts are refused at the edge otherwise (no_audio)

    def key_ok(request: Request) -> bool:
        if config.api_key is None:
            return True
        header = request.headers.get("authorization", "")
        token = header[7:] if header[:7].lower() == "bearer " else ""
        return hmac.compare_digest(token.encode(), config.api_key.encode())

    def check_key(request: Request) -> None:
        if not key_ok(request):
            raise AuthenticationError("missing or wrong API key: send the header Authorization: Bearer <key>")

    def model_card(name: str, created: int) -> dict:
        return {"id": name, "object": "model", "created": created, "owned_by": "vl", "root": name,
                "max_model_len": engine.context_length, **config.model_info, "vl": facts}

    async def models(request: Request):
        check_key(request)
        created = int(time.time())
        return JSONResponse({"object": "list", "data": [model_card(n, created) for n in config.served_names]})

    async def model(request: Request):
        check_key(request)
        name = request.path_params["model_id"]
        if name not in config.served_names:
            raise ModelNotFoundError(f"the model {name!r} does not exist here; this server serves "
                                     f"{', '.join(map(repr, config.served_names))} (GET /v1/models)")
        return JSONResponse(model_card(name, int(time.time())))

    async def health(request: Request):
        return JSONResponse({"status": "ok", **scheduler.snapshot()})

    async def read_body(request: Request) -> bytes:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > config.max_body_bytes:
            raise RequestTooLargeError(f"the request body is {length} bytes; this server accepts at most "
                                       f"{config.max_body_bytes} (--max-body-mb)")
        body = bytearray()
        try:
            async with asyncio.timeout(config.connection.body_timeout_s):
                async for chunk in request.stream():
                    body += chunk
                    if len(body) > config.max_body_bytes:
                        raise RequestTooLargeError(f"the request body is over {config.max_body_bytes} bytes, this "
                                                   "server's limit (--max-body-mb)")
        except TimeoutError:
            raise RequestBodyTimeoutError(f"the request body did not arrive within {config.connection.body_timeout_s:g}"
                                          f" s ({len(body)} bytes came); send it at once") from None
        return bytes(body)

    async def chat_completions(request: Request):
        check_key(request)
        raw = await read_body(request)
        loop = asyncio.get_running_loop()
        # JSON decoding, data: URIs and local media checks run off the event loop (a body can be tens of MB)
        parsed = await loop.run_in_executor(None, lambda: parse_chat_request(
            parse_json(raw), served_names=config.served_names, policy=config.policy, ceilings=config.ceilings,
            default_max_tokens=config.default_max_tokens, vocab_size=vocab_size, hears=hears,
            template_defaults=config.template_defaults, default_fps=config.default_fps))
        job = Job(parsed.chat, parsed.params, loop, stream=parsed.stream, request_id=request.state.request_id)
        scheduler.submit(job)
        cid = R.completion_id()
        if parsed.stream:
            first = await _first_item(request, job)  # an error before the first token raises: an HTTP status
            return StreamingResponse(_stream(job, parsed, cid, first), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await _complete(request, job, parsed.model, cid)

    def _timeout_error() -> DecodeTimeoutError:
        return DecodeTimeoutError(f"the answer was not finished within this server's limit of "
                                  f"{config.ceilings.request_timeout_s:g} s (--request-timeout)")

    async def _first_item(request: Request, job: Job):
        """The first event, result or end of a streamed job, with the connection watched meanwhile."""
        watcher = asyncio.ensure_future(_watch_disconnect(request, job))
        try:
            item = await job.out.get()
        except BaseException:
            scheduler.withdraw(job)
            raise
        finally:
            watcher.cancel()
        if isinstance(item, BaseException) or item is None or (
                isinstance(item, ChatResult) and item.finish_reason == "timeout"):
            scheduler.withdraw(job)
            if isinstance(item, BaseException):
                raise item
            raise _timeout_error() if item is not None else ServerUnavailableError("the request was withdrawn "
                                                                                   "before it ran")
        return item

    async def _complete(request: Request, job: Job, model: str, cid: str):
        watcher = asyncio.ensure_future(_watch_disconnect(request, job))
        result = None
        try:
            while True:
                item = await job.out.get()
                if item is None:
                    break
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, ChatResult):
                    if item.finish_reason == "timeout":
                        raise _timeout_error()
                    result = item
            if result is None:  # withdrawn before it ran: its client is gone, nobody reads this
                raise ServerUnavailableError("the request was withdrawn before it ran")
            return JSONResponse(R.completion(result, model, cid))
        finally:
            watcher.cancel()
            scheduler.withdraw(job)  # a no-op for a finished job

    async def _watch_disconnect(request: Request, job: Job):
        while not job.cancel.is_set():
            if await request.is_disconnected():
                log.info("client went away before its answer was complete; cancelled request %s", job.request_id)
                scheduler.withdraw(job)
                return
            await asyncio.sleep(0.1)

    async def _stream(job: Job, parsed, cid: str, first):
        created, model = int(time.time()), parsed.model
        complete = False
        try:
            yield R.chunk(cid, model, created, {"role": "assistant", "content": ""})
            item = first
            while item is not None:
                if isinstance(item, BaseException):
                    yield R.sse(R.error_of(item)[1])
                    break
                if isinstance(item, ChatResult):
                    if item.finish_reason == "timeout":
                        error = _timeout_error()
                        yield R.sse(R.error_body(error.http_status, error.code, str(error)))
                        break
                    yield R.chunk(cid, model, created, {}, R.FINISH.get(item.finish_reason, "stop"))
                    if parsed.include_usage:
                        yield R.chunk(cid, model, created, None, usage_=R.usage(item.stats))
                else:
                    key = "reasoning_content" if item.kind == "reasoning" else "content"
                    yield R.chunk(cid, model, created, {key: item.text})
                item = await job.out.get()
            yield R.DONE
            complete = True
        except Exception as exc:  # noqa: BLE001 - our bug while streaming: the client gets an error event
            log.exception("streaming request %s failed", job.request_id)
            yield R.sse(R.error_of(exc)[1])
        finally:  # normal end, or the client went away (Starlette cancels this generator)
            if not complete and not job.cancel.is_set():
                log.info("client went away during its streamed answer; cancelled request %s", job.request_id)
            scheduler.withdraw(job)

    async def on_error(request: Request, exc: Exception):
        if isinstance(exc, HTTPException):
            if request.url.path.startswith("/v1/") and not key_ok(request):  # no route probing without the key
                exc = AuthenticationError("missing or wrong API key: send the header Authorization: Bearer <key>")
            else:
                code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
                return JSONResponse(R.error_body(exc.status_code, code, f"{request.method} {request.url.path}: "
                                                 f"{exc.detail}"), status_code=exc.status_code, headers=exc.headers)
        status, body = R.error_of(exc)
        if status >= 500:
            log.warning("request %s failed: [%s] %s", request.state.request_id, body["error"]["code"], exc)
        headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 429 else None
        return JSONResponse(body, status_code=status, headers=headers)

    routes = [Route("/v1/models", models, methods=["GET"]),
              Route("/v1/models/{model_id:path}", model, methods=["GET"]),
              Route("/health", health, methods=["GET"]),
              Route("/v1/chat/completions", chat_completions, methods=["POST"])]
    # VLError and HTTP errors are answered by `on_error`; anything else by the edge (vl/server/edge.py), as an
    # ordinary 500 that keeps the connection open
    return Starlette(routes=routes, middleware=[Middleware(Edge)],
                     exception_handlers={VLError: on_error, HTTPException: on_error})
