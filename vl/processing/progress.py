"""Progress reports and cooperative stops for the slow part before the first token: PDF pages, video frames,
tile encoding.

A request's `Work` (a stop event and a progress callback) is made current for the duration of the processor
call and of the vision encoding (`Work.current()` / `with work:`), so that the functions deep inside (the PDF
renderer, the sandbox worker that decodes a file) can report and stop without every signature in between
growing two parameters. It is a context variable, so two requests in two threads never see each other's.

The safe points are between pages, between media items, between decoded video frames (vl/processing/video.py),
between encoded tiles, and while waiting for a decode worker (the worker is killed, see `vl/processing/sandbox.py`,
which also carries a worker's reports back to the request's `Work`); a stop there raises `StoppedError`.
See docs/app_and_cli.md, "Stop and progress".
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from dataclasses import dataclass

from vl.errors import StoppedError

_CURRENT: contextvars.ContextVar[Work | None] = contextvars.ContextVar("vl_work", default=None)


@dataclass
class Work:
    cancel: threading.Event | None = None
    on_progress: Callable[[str, int, int], None] | None = None  # (what, done, total); total 0 = unknown

    @property
    def watched(self) -> bool:
        """Someone may stop this work or wants its progress (else the slow parts run in one go)."""
        return self.cancel is not None or self.on_progress is not None

    @property
    def stopped(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    def check(self) -> None:
        """A safe point: raise `StoppedError` when the stop was asked for."""
        if self.stopped:
            raise StoppedError("stopped by the user before the answer began")

    def report(self, what: str, done: int, total: int = 0) -> None:
        """Tell the watcher, then a safe point (a stop asked for by the callback itself counts too)."""
        if self.on_progress is not None:
            self.on_progress(what, done, total)
        self.check()

    @staticmethod
    def current() -> Work:
        return _CURRENT.get() or _IDLE

    def __enter__(self) -> Work:
        self._token = _CURRENT.set(self)
        return self

    def __exit__(self, *exc) -> None:
        _CURRENT.reset(self._token)


_IDLE = Work()
