"""Start `vl serve` (a subprocess) or the same app in this process (uvicorn in a thread), on free loopback ports.

The in-process form shares one loaded engine between several server configurations (API key, tiny limits, an
engine that never emits its stop token), which keeps the error-class tests to seconds.
"""

from __future__ import annotations

import base64
import io
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "vl" / "demo"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_health(base: str, proc: subprocess.Popen | None = None, timeout: float = 180) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"vl serve exited with {proc.returncode}")
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{base} did not come up within {timeout} s")


def start_serve(port: int, *flags: str, log_path: Path | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    out = open(log_path, "a") if log_path else subprocess.DEVNULL
    return subprocess.Popen([sys.executable, "-m", "vl.cli", "serve", "--port", str(port), "--log-level", "warning",
                             *flags], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def in_process_server(engine, **config):
    """The `vl serve` app over `engine`, served by uvicorn in a thread; yields (base_url, scheduler)."""
    import uvicorn

    from vl.server.app import ServerConfig, create_app
    from vl.server.edge import uvicorn_kwargs
    from vl.server.scheduler import Scheduler

    sched_kw = {k: config.pop(k) for k in ("max_batch", "max_queue", "batch_window_s", "prepare_workers")
                if k in config}
    log_level = config.pop("log_level", "warning")
    vl_log = logging.getLogger("vl")
    saved = vl_log.level, list(vl_log.handlers), vl_log.propagate  # the server's log config is process-wide
    scheduler = Scheduler(engine, **sched_kw)
    server_config = ServerConfig(**config)
    app = create_app(engine, scheduler, server_config)
    port = free_port()
    # the transport settings `vl serve` runs with (vl/server/edge.py), with this test's connection limits
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                          **uvicorn_kwargs(server_config.connection, log_level)))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    try:
        wait_health(base, timeout=30)
        yield base, scheduler
    finally:
        server.should_exit = True
        thread.join(10)
        scheduler.close()
        vl_log.setLevel(saved[0])
        vl_log.handlers[:], vl_log.propagate = saved[1], saved[2]


def never_stopping(engine):
    """The same model and processor behind an engine with no stop token: answers run to max_tokens (queue and
    timeout tests need requests that hold the engine)."""
    from vl.runtime.engine import Engine

    e = Engine(engine.model, engine.processor)
    e.stop_ids = set()
    return e


def data_uri(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def png_bytes(colour="red", size=(96, 64)) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, "PNG")
    return buf.getvalue()


@contextmanager
def paced(engine, step_s: float = 0.001):
    """Every forward of `engine`'s LM takes at least `step_s` (a forward hook, which also sends the decode steps
    through the modules): a test whose long answer must outlast a second or two then holds on any machine,
    however fast its decode step (the demo model's fused step decodes 4000 tokens in about a second here).
    Yields the forward calls counted so far (a list, one entry per call): tests read steps, not clocks."""
    steps = []
    hook = engine.lm.register_forward_hook(lambda *_: steps.append(1) or time.sleep(step_s))  # None: output kept
    try:
        yield steps
    finally:
        hook.remove()
