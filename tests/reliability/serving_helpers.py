"""Helpers for the serving rows: start `vl app` as a subprocess, talk to it over plain HTTP and gradio_client.

Plain HTTP is used where the matrix asks about the wire (413 before the handler, 503 when the queue is full,
what `file=` serves); gradio_client where it asks about a request's answer.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from types import SimpleNamespace

import psutil

from ui.measure import free_port, multipart, raw_upload, vl_command

REPO = Path(__file__).resolve().parents[2]
DOC_DEFAULTS = dict(pages="", max_tiles=2, token_budget=0, thinking=False, reasoning_budget=0, max_new_tokens=4,
                    temperature=0.0)


def start_app(model: Path, work: Path, *flags: str) -> SimpleNamespace:
    """`vl app` on a free port, cwd `work` (so that dotfiles there are "in the CWD"), uploads under work/uploads."""
    port = free_port()
    # VL_CPU_DECODE=off: these rows size their waits and limits for decoding through the modules (~1200 tok/s on
    # the tiny models); the fused CPU step (docs/cpu_decode.md, twin-tested in tests/runtime/cpu/test_cpu_decode.py)
    # decodes them ~3x faster, so a burst's requests would finish before the queue fills
    env = {**os.environ, "GRADIO_TEMP_DIR": str(work / "uploads"), "GRADIO_ANALYTICS_ENABLED": "False",
           "VL_CPU_DECODE": "off"}
    log = open(work / "app.log", "w")
    proc = subprocess.Popen(vl_command() + ["app", "--model", str(model), "--port", str(port),
                                            "--examples-dir", str(work / "examples"), *flags],
                            cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
    return SimpleNamespace(proc=proc, url=f"http://127.0.0.1:{port}/", work=work, log=log, model=Path(model),
                           uploads=work / "uploads", examples=work / "examples")


def wait_ready(app: SimpleNamespace, timeout: float = 240) -> None:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if app.proc.poll() is not None:
            raise AssertionError(f"vl app exited with {app.proc.returncode}:\n{log_tail(app)}")
        try:
            with urllib.request.urlopen(app.url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.25)
    raise AssertionError(f"vl app did not serve {app.url} within {timeout} s:\n{log_tail(app)}")


def stop_app(app: SimpleNamespace) -> None:
    if app.proc.poll() is None:
        app.proc.terminate()
        try:
            app.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            app.proc.kill()
            app.proc.wait()
    app.log.close()


def log_tail(app: SimpleNamespace, n: int = 3000) -> str:
    app.log.flush()
    return (app.work / "app.log").read_text(errors="replace")[-n:]


def children(app: SimpleNamespace) -> list[psutil.Process]:
    return psutil.Process(app.proc.pid).children(recursive=True)


def http_get(url: str, timeout: float = 10):
    """(status, headers, body) without raising on 4xx/5xx."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def upload(url: str, path: Path) -> str:
    status, body = raw_upload(url, multipart(path.name.encode(), path.read_bytes()))
    assert status == 200, (status, body[:300])
    return json.loads(body)[0]


def file_data(server_path: str, name: str) -> dict:
    return {"path": server_path, "orig_name": name, "meta": {"_type": "gradio.FileData"}}


def fn_index(url: str, api_name: str) -> int:
    _, _, body = http_get(url + "config")
    config = json.loads(body)
    return next(d["id"] for d in config["dependencies"] if d.get("api_name") == api_name)


def queue_join(url: str, fn: int, data: list, session_hash: str) -> tuple[int, dict, float]:
    """(status, JSON body, seconds) of one POST /gradio_api/queue/join."""
    body = json.dumps({"data": data, "fn_index": fn, "session_hash": session_hash, "event_data": None,
                       "trigger_id": None}).encode()
    req = urllib.request.Request(url + "gradio_api/queue/join", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read()), time.perf_counter() - t0
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = {"detail": raw.decode(errors="replace")}
        return e.code, parsed, time.perf_counter() - t0


def read_events(url: str, session_hash: str, want: set[str], timeout: float) -> list[tuple[float, dict]]:
    """SSE messages of one session until every event id in `want` has completed: [(arrival time, message)]."""
    req = urllib.request.Request(url + f"gradio_api/queue/data?session_hash={session_hash}")
    out, done, t0 = [], set(), time.perf_counter()
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for line in r:
            if time.perf_counter() - t0 > timeout:
                break
            if not line.startswith(b"data:"):
                continue
            msg = json.loads(line[5:])
            out.append((time.perf_counter(), msg))
            if msg.get("msg") == "process_completed":
                done.add(msg.get("event_id"))
                if want <= done:
                    break
    return out


def new_session() -> str:
    return uuid.uuid4().hex[:11]
