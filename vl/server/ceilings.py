"""The server's caps on what one request may ask for and on its connections, in a module of their own so that
`vl serve --help` can show their defaults without importing torch or uvicorn (vl/server/request.py and
vl/server/edge.py apply them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Ceilings:
    """Server-side caps on what one request may ask for (vLLM's 2026 advisories: every per-request knob that
    scales work needs a ceiling)."""

    max_tokens: int = 4096
    max_num_tiles: int = 12  # the model card's range is 1..12
    max_frames: int = 128  # the reference sampling (2 fps, at most 128 frames)
    max_fps: float = 30.0
    max_stop: int = 16
    max_logit_bias: int = 300  # token ids one request's logit_bias may name
    request_timeout_s: float = 300.0


@dataclass(frozen=True)
class ConnectionLimits:
    """Bounds on slow or idle clients (vl/server/edge.py, vl/server/app.py)."""

    header_timeout_s: float = 10.0  # from a request head's first byte to its end; then the connection is closed
    keep_alive_s: float = 5.0  # an idle keep-alive connection (uvicorn's default)
    max_connections: int = 256  # open connections; a request on one more is answered 503 (uvicorn)
    body_timeout_s: float = 60.0  # from the end of the head to the end of the body; then 408
