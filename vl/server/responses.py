"""Our results and errors in OpenAI's response shapes (Chat Completions object, chunk object, error object).

Reasoning goes to `reasoning_content` (`delta.reasoning_content` when streamed), as vLLM's reasoning parsers
and DeepSeek's API return it; the answer goes to `content`; a `</think>` never reaches the client (the
splitting is vl/processing/chat.py's, the same for every front end). `usage` carries prompt and completion
tokens as OpenAI counts them plus our vision-token counts before and after token reduction
(`vision_tokens_before`, `vision_tokens_after`) and the audio tokens the model heard (`audio_tokens`: audio files
and videos' sound tracks; 0 for a model that does not hear).
"""

from __future__ import annotations

import json
import time
import uuid

from vl.errors import VLError

FINISH = {"stop": "stop", "stop_string": "stop", "length": "length", "cancelled": "stop", "timeout": "length"}
_ERROR_TYPE = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 405: "invalid_request_error", 408: "invalid_request_error",
               413: "invalid_request_error", 415: "invalid_request_error", 422: "invalid_request_error",
               429: "rate_limit_error", 503: "service_unavailable", 504: "timeout_error"}


def completion_id() -> str:
    return "chatcmpl-" + uuid.uuid4().hex


def error_body(status: int, code: str, message: str) -> dict:
    return {"error": {"message": message, "type": _ERROR_TYPE.get(status, "server_error"), "param": None,
                      "code": code}}


def error_of(exc: BaseException) -> tuple[int, dict]:
    """(HTTP status, OpenAI error JSON). Our typed errors keep their stable code and message; anything else is
    an internal error whose details stay in the server log (no traceback, path or secret goes out)."""
    if isinstance(exc, VLError):
        return exc.http_status, error_body(exc.http_status, exc.code, str(exc))
    return 500, error_body(500, "internal_error", "internal server error; the request was logged")


def usage(stats) -> dict:
    return {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.new_tokens,
            "total_tokens": stats.prompt_tokens + stats.new_tokens,
            "vision_tokens_before": stats.vision_tokens_before, "vision_tokens_after": stats.vision_tokens_after,
            "audio_tokens": stats.audio_tokens}


def completion(result, model: str, cid: str) -> dict:
    message = {"role": "assistant", "content": None if result.reasoning_truncated else result.answer,
               "reasoning_content": result.reasoning or None}
    return {"id": cid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": FINISH.get(result.finish_reason, "stop"),
                         "logprobs": None}],
            "usage": usage(result.stats)}


def chunk(cid: str, model: str, created: int, delta: dict | None = None, finish_reason: str | None = None,
          usage_: dict | None = None) -> str:
    body = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish_reason,
                                                  "logprobs": None}]}
    if usage_ is not None:
        body["usage"] = usage_
    return sse(body)


def json_bytes(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode()


def sse(obj) -> str:
    return "data: " + json.dumps(obj, ensure_ascii=False) + "\n\n"


DONE = "data: [DONE]\n\n"
