"""Numbered steps on the console (`[i/n] what… 1.2 s`), as `vl app` prints them while it starts and while the
model picker (ui/model_picker.py) switches models."""

from __future__ import annotations

import sys
import threading
import time


class Step:
    """`[i/n] what… 1.2 s` on stderr; on a terminal the seconds tick while the step runs."""

    def __init__(self, i: int, n: int, what: str):
        self.label, self._stop = f"[{i}/{n}] {what}", threading.Event()

    def __enter__(self):
        self.t0 = time.perf_counter()
        if sys.stderr.isatty():
            threading.Thread(target=self._tick, daemon=True).start()
        else:
            print(f"{self.label}…", file=sys.stderr, flush=True)
        return self

    def _tick(self):
        while not self._stop.wait(0.25):
            print(f"\r{self.label}… {time.perf_counter() - self.t0:.1f} s", end="", file=sys.stderr, flush=True)

    def __exit__(self, kind, exc, tb):
        self._stop.set()
        status = "done" if kind is None else "failed"
        print(f"\r{self.label}: {status} in {time.perf_counter() - self.t0:.1f} s", file=sys.stderr, flush=True)
        return False
