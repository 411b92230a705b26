"""Serving rows that need a hook inside the server process (docs/reliability_policy.md §6.6): S3 (client gone
mid-generation), S4 (a slow handler meets our per-request time limits), S6 (a decode worker over its memory
cap). The app is built and launched in this process exactly as `vl app` does it (UIEngine with sandboxed
decoding, `build_app`, `launch_app`), so a forward hook can count the model's decoding steps.

Two apps share one engine: one with the default 180 s answer limit (S3 must not be ended by the time limit),
one with a 3 s limit (S4). Process-wide settings (GRADIO_TEMP_DIR) are restored when the module ends.
"""

from __future__ import annotations

import dataclasses
import os
import struct
import subprocess
import sys
import threading
import time
import zlib
from types import SimpleNamespace

import psutil
import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError
from ui.measure import free_port

pytestmark = pytest.mark.timeout(300)

CLIENT = """
import sys, time
from gradio_client import Client, handle_file
c = Client(sys.argv[1], verbose=False, download_files=False)
job = c.submit([handle_file(sys.argv[2])], "", "What is the total?", 12, 0, True, 0, 2048, 0.0, api_name="/document")
while not any(isinstance(o[0], str) and len(o[0]) > 3 for o in job.outputs()):
    time.sleep(0.02)
print("streaming", flush=True)
time.sleep(600)
"""


@pytest.fixture(scope="module")
def apps(rel_tiny_dir, tmp_path_factory):
    saved = os.environ.get("GRADIO_TEMP_DIR")
    uploads = tmp_path_factory.mktemp("inproc_uploads")
    os.environ["GRADIO_TEMP_DIR"] = str(uploads)  # before any component is built, as `vl app` does
    demos = []
    try:
        from ui.app import build_app, launch_app
        from ui.examples import ensure_examples
        from ui.limits import AppLimits
        from ui.runner import UIEngine

        examples_dir, records = ensure_examples(tmp_path_factory.mktemp("inproc_examples"))
        limits = AppLimits()
        engine = UIEngine.from_pretrained(rel_tiny_dir, isolate=True, limits=limits.media,
                                          allowed_roots=[uploads, examples_dir])
        out = SimpleNamespace(engine=engine, examples=examples_dir, media=limits.media)
        for name, lim in (("normal", limits), ("short", dataclasses.replace(limits, request_timeout_s=3.0))):
            demo = build_app(engine, limits=lim, examples_dir=examples_dir, examples=records, model_name="tiny")
            launch_app(demo, port=free_port(), limits=lim, model_dir=rel_tiny_dir, examples_dir=examples_dir,
                       prevent_thread_lock=True, quiet=True)
            demos.append(demo)
            setattr(out, name, SimpleNamespace(url=demo.local_url, limits=lim,
                                               client=Client(demo.local_url, verbose=False, download_files=False)))
        out.png = next(examples_dir.glob("*.png"))
        yield out
    finally:
        for demo in demos:
            demo.close()
        if saved is None:
            os.environ.pop("GRADIO_TEMP_DIR", None)
        else:
            os.environ["GRADIO_TEMP_DIR"] = saved


def doc(path, question="What is the total?", max_new_tokens=4, thinking=False, max_tiles=2):
    return [[handle_file(path)], "", question, max_tiles, 0, thinking, 0, max_new_tokens, 0.0]


def served_ok(app, png, within_s=30.0):
    t0 = time.perf_counter()
    out = app.client.predict(*doc(png), api_name="/document")
    assert out[1] and "finished by" in out[3], out
    assert time.perf_counter() - t0 < within_s


@pytest.fixture()
def steps(apps):
    """perf_counter() of every forward call of the language model while the test runs."""
    seen = []
    hook = apps.engine.lm.register_forward_hook(lambda *_: seen.append(time.perf_counter()))
    yield seen
    hook.remove()


# --- S3: the client goes away mid-generation ------------------------------------------------------------------
def test_s3_client_disconnect_aborts_generation_and_frees_the_slot(apps, steps, tmp_path, monkeypatch):
    """The client's process is killed mid-answer: the engine's stream for it is closed before the answer's end
    (events, not a clock: the generation would otherwise run past 600 tokens), and the next request is served."""
    ended, outcome = threading.Event(), {}
    chat_events = apps.engine._chat_events

    def watched(request, params):  # the engine's stream for one request; `finally` runs when it is closed
        try:
            outcome["result"] = yield from chat_events(request, params)
        finally:
            ended.set()

    monkeypatch.setattr(apps.engine, "_chat_events", watched)
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    client = subprocess.Popen([sys.executable, str(script), apps.normal.url, str(apps.png)], stdout=subprocess.PIPE,
                              text=True)
    try:
        line = client.stdout.readline()  # /think on this example runs past 600 tokens: only a stop ends it early
        assert line.strip() == "streaming", line
        assert steps and not ended.is_set(), "the model must be decoding when the client goes away"
        client.kill()  # the connection drops without a goodbye
    finally:
        if client.poll() is None:
            client.kill()
        client.wait()
    assert ended.wait(60), "the generation was not stopped after its client left"
    assert "result" not in outcome, "the answer ran to its end after its client left"
    monkeypatch.undo()
    before = len(steps)  # the slot is free: a new request is served
    job = apps.normal.client.submit(*doc(apps.png), api_name="/document")
    assert "finished by" in job.result(timeout=60)[3]
    assert len(steps) > before


# --- S4: a slow handler meets our time limits -------------------------------------------------------------
def test_s4_slow_generation_is_cut_at_the_request_time_limit(apps, steps):
    hook = apps.engine.lm.register_forward_hook(lambda *_: time.sleep(0.25))  # every decoding step is slow
    try:
        out = apps.short.client.predict(*doc(apps.png, max_new_tokens=400), api_name="/document")
    finally:
        hook.remove()
    assert "time limit reached" in out[3] and "time limit of 3 s" in out[3], out[3]
    assert len(steps) < 400 * 0.5  # cut: 400 tokens would be 400 steps of >= 0.25 s
    served_ok(apps.short, apps.png, within_s=10)


def _solid_png(width: int, height: int) -> bytes:
    """A large, valid PNG that costs real decoding time and memory but few bytes (one colour compresses ~1000:1)."""
    from media_fixtures import png_chunk

    row = b"\x00" + b"\x80\x40\x20" * width
    comp = zlib.compressobj(1)
    body = b"".join(comp.compress(row * 500) for _ in range(height // 500)) + comp.flush()
    ihdr = struct.pack(">II", width, height - height % 500) + b"\x08\x02\x00\x00\x00"
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", body) + png_chunk(b"IEND", b"")


@pytest.fixture()
def media_limits(apps):
    """Swap the processor's media limits for one test (the processor reads them per request)."""
    proc = apps.engine.processor
    original = proc.limits

    def use(**changes):
        proc.limits = dataclasses.replace(original, **changes)

    yield use
    proc.limits = original


def test_s4_slow_decode_is_killed_at_the_worker_time_limit_and_the_worker_replaced(apps, media_limits, tmp_path):
    big = tmp_path / "big.png"
    big.write_bytes(_solid_png(6000, 6000))  # 36 MP: inside the caps, slow to decode and tile
    served_ok(apps.normal, apps.png)  # a warm worker exists
    workers_before = {c.pid for c in psutil.Process().children()}
    media_limits(image_timeout_s=0.2)
    t0 = time.perf_counter()
    with pytest.raises(AppError, match=r"did not finish within 0\.2 s.*\[decode_timeout\]") as err:
        apps.normal.client.predict(*doc(big), api_name="/document")
    assert time.perf_counter() - t0 < 15
    assert "Traceback" not in str(err.value)
    assert workers_before - {c.pid for c in psutil.Process().children()}, "the timed-out worker was not stopped"
    media_limits()  # back to the app's limits
    served_ok(apps.normal, apps.png, within_s=30)


# --- S6: a decode worker over its memory cap ---------------------------------------------------------------
def test_s6_worker_over_its_memory_cap_is_a_clear_error_and_the_service_stays_up(apps, media_limits, tmp_path):
    """A "bomb without our cap": the pixel cap raised to Pillow's own limit, the worker's data and resident set
    capped at 640 MB. 81 MP decodes to 243 MB of RGB and more while tiling: the worker runs out, not the server.
    A normal page is served under the same cap first, so the error is the bomb's, not the cap's."""
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(_solid_png(9000, 9000))
    assert bomb.stat().st_size < 2 << 20
    media_limits(max_image_pixels=89_000_000, worker_memory_mb=640)
    served_ok(apps.normal, apps.png, within_s=30)
    server_rss = psutil.Process().memory_info().rss
    with pytest.raises(AppError, match=r"ran out of memory|memory cap|decoder process died") as err:
        apps.normal.client.predict(*doc(bomb), api_name="/document")
    assert "Traceback" not in str(err.value) and ("[too_large]" in str(err.value)
                                                  or "[decoder_crashed]" in str(err.value)), str(err.value)
    assert psutil.Process().memory_info().rss - server_rss < 150 << 20, "the server itself grew"
    media_limits()
    served_ok(apps.normal, apps.png, within_s=30)
