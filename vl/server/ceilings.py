"""The server's caps on what one request may ask for, in a module of their own so that `vl serve --help` can show
their defaults without importing torch (vl/server/request.py, which applies them, imports the engine)."""

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
    request_timeout_s: float = 300.0
