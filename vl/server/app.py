"""The OpenAI-compatible HTTP surface: `GET /v1/models`, `POST /v1/chat/completions`, `GET /health`.

Starlette on uvicorn (the stack FastAPI, vLLM's and mlx-vlm's servers stand on). Handlers only parse, admit
and relay: parsing is vl/server/request.py, admission and batching vl/server/scheduler.py, shapes
vl/server/responses.py. A client that disconnects cancels its generation (vLLM's `with_cancellation`): a
streamed response notices when its send fails or Starlette cancels it, a plain one polls the connection.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from vl.errors import (
    AuthenticationError,
    DecodeTimeoutError,
    InputError,
    RequestTooLargeError,
    ServerUnavailableError,
    VLError,
)
from vl.runtime.results import ChatResult
from vl.server import responses as R
from vl.server.media import MediaPolicy
from vl.server.request import Ceilings, parse_chat_request
from vl.server.scheduler import Job, Scheduler

log = logging.getLogger("vl.server")


@dataclass
class ServerConfig:
    served_names: tuple[str, ...] = ("vl",)
    api_key: str | None = None
    max_body_bytes: int = 64 << 20
    default_max_tokens: int = 256
    policy: MediaPolicy = field(default_factory=MediaPolicy)
    ceilings: Ceilings = field(default_factory=Ceilings)
    model_info: dict = field(default_factory=dict)  # extra facts for /v1/models (context, defaults)


def create_app(engine, scheduler: Scheduler, config: ServerConfig) -> Starlette:
    def check_key(request: Request) -> None:
        if config.api_key is None:
            return
        header = request.headers.get("authorization", "")
        token = header[7:] if header[:7].lower() == "bearer " else ""
        if not hmac.compare_digest(token.encode(), config.api_key.encode()):
            raise AuthenticationError("missing or wrong API key: send the header Authorization: Bearer <key>")

    async def models(request: Request):
        check_key(request)
        created = int(time.time())
        return JSONResponse({"object": "list", "data": [
            {"id": name, "object": "model", "created": created, "owned_by": "vl", "root": name,
             "max_model_len": engine.context_length, **config.model_info} for name in config.served_names]})

    async def health(request: Request):
        return JSONResponse({"status": "ok", **scheduler.snapshot()})

    async def read_json(request: Request):
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > config.max_body_bytes:
            raise RequestTooLargeError(f"the request body is {length} bytes; this server accepts at most "
                                       f"{config.max_body_bytes} (--max-body-mb)")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > config.max_body_bytes:
                raise RequestTooLargeError(f"the request body is over {config.max_body_bytes} bytes, this "
                                           "server's limit (--max-body-mb)")
        try:
            return json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise InputError(f"the request body is not valid JSON: {e}") from None

    async def chat_completions(request: Request):
        check_key(request)
        body = await read_json(request)
        loop = asyncio.get_running_loop()
        # data: URIs are decoded and local media checked off the event loop (they can be tens of MB)
        parsed = await loop.run_in_executor(None, lambda: parse_chat_request(
            body, served_names=config.served_names, policy=config.policy, ceilings=config.ceilings,
            default_max_tokens=config.default_max_tokens))
        job = Job(parsed.chat, parsed.params, loop, stream=parsed.stream)
        scheduler.submit(job)
        cid = R.completion_id()
        if parsed.stream:
            return StreamingResponse(_stream(job, parsed, cid), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await _complete(request, job, parsed.model, cid)

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
                        raise DecodeTimeoutError(f"the answer was not finished within this server's limit of "
                                                 f"{config.ceilings.request_timeout_s:g} s (--request-timeout)")
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
                log.info("client went away; cancelling its generation")
                scheduler.withdraw(job)
                return
            await asyncio.sleep(0.1)

    async def _stream(job: Job, parsed, cid: str):
        created, model = int(time.time()), parsed.model
        try:
            yield R.chunk(cid, model, created, {"role": "assistant", "content": ""})
            while True:
                item = await job.out.get()
                if item is None:
                    break
                if isinstance(item, BaseException):
                    status, body = R.error_of(item)
                    yield R.sse(body)
                    break
                if isinstance(item, ChatResult):
                    if item.finish_reason == "timeout":
                        yield R.sse(R.error_body(504, DecodeTimeoutError.code, "the answer was not finished within "
                                                 f"this server's limit of {config.ceilings.request_timeout_s:g} s"))
                        break
                    yield R.chunk(cid, model, created, {}, R.FINISH.get(item.finish_reason, "stop"))
                    if parsed.include_usage:
                        yield R.chunk(cid, model, created, None, usage_=R.usage(item.stats))
                    continue
                key = "reasoning_content" if item.kind == "reasoning" else "content"
                yield R.chunk(cid, model, created, {key: item.text})
            yield R.DONE
        finally:  # normal end, or the client went away (Starlette cancels this generator)
            scheduler.withdraw(job)

    async def on_error(request: Request, exc: Exception):
        if isinstance(exc, HTTPException):
            code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
            return JSONResponse(R.error_body(exc.status_code, code, str(exc.detail)), status_code=exc.status_code)
        status, body = R.error_of(exc)
        if not isinstance(exc, VLError):
            log.exception("internal error")
        elif status >= 500:
            log.warning("request failed: [%s] %s", exc.code, exc)
        return JSONResponse(body, status_code=status)

    routes = [Route("/v1/models", models, methods=["GET"]), Route("/health", health, methods=["GET"]),
              Route("/v1/chat/completions", chat_completions, methods=["POST"])]
    handlers = {VLError: on_error, HTTPException: on_error, Exception: on_error}
    return Starlette(routes=routes, exception_handlers=handlers)
