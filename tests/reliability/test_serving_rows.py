"""Serving rows of docs/reliability_policy.md §6.6 against the real `vl app` command (a subprocess on a free port,
tight limits: a 4-deep queue, one model slot, 1 MB uploads, answers cut at 10 s): S1, S2, S5, S7, S8, S9, S10.

S3, S4 and S6 need hooks inside the server process and run in test_serving_inprocess.py; S11 is the soak
(test_soak_short.py and scripts/soak.py); S12 is in tests/hf/test_hf_pipeline.py; S13 in tests/ui/test_ui_cli.py.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError
from serving_helpers import (
    children,
    file_data,
    fn_index,
    http_get,
    log_tail,
    new_session,
    queue_join,
    read_events,
    start_app,
    stop_app,
    upload,
    wait_ready,
)

from ui.measure import multipart, raw_upload

pytestmark = pytest.mark.timeout(300)
SECRET = b"VL_RELIABILITY_SECRET_7d1f"


@pytest.fixture(scope="module")
def served(rel_tiny_dir, tmp_path_factory):
    work = tmp_path_factory.mktemp("served")
    (work / ".env").write_bytes(b"API_KEY=" + SECRET)  # a dotfile in the app's working directory
    (work / "notes.txt").write_bytes(SECRET)
    app = start_app(rel_tiny_dir, work, "--queue-size", "4", "--max-upload-mb", "1", "--timeout", "10")
    try:
        wait_ready(app)
        app.client = Client(app.url, verbose=False, download_files=False)
        app.png = next(app.examples.glob("*.png"))
        app.pdf = next(app.examples.glob("*.pdf"))
        app.mp4 = next(app.examples.glob("*.mp4"))
        yield app
    finally:
        stop_app(app)


def doc(files, question="What is the total?", **over):
    a = dict(pages="", max_tiles=2, token_budget=0, thinking=False, reasoning_budget=0, max_new_tokens=4,
             temperature=0.0, skip_blank=False, prune_rate=0.0)
    a.update(over)
    return [files, a["pages"], question, a["max_tiles"], a["token_budget"], a["thinking"], a["reasoning_budget"],
            a["max_new_tokens"], a["temperature"], a["skip_blank"], a["prune_rate"]]


def video(path, question="What happens?", max_new_tokens=4):
    return [path, question, 2.0, 4, 0.5, False, 0, max_new_tokens, 0.0]


def assert_serves(app):
    out = app.client.predict(*doc([handle_file(app.png)]), api_name="/document")
    assert out[1] and "finished by" in out[3], out


def assert_clear(message: str, tmp: Path | None = None):
    assert "Traceback" not in message and "Internal error" not in message, message
    assert tmp is None or str(tmp) not in message, message


# --- S1: bad generation options and an over-long prompt -------------------------------------------------------
@pytest.mark.parametrize("value,words", [(0, "less than minimum value 1"), (-5, "less than minimum value 1"),
                                         (10**6, "greater than maximum value 2048")])
def test_s1_max_new_tokens_out_of_range_quotes_the_limit(served, value, words):
    with pytest.raises(AppError, match=words) as err:
        served.client.predict(*doc([handle_file(served.png)], max_new_tokens=value), api_name="/document")
    assert str(value) in str(err.value), "the message quotes the requested count"


def test_s1_prompt_over_the_context_quotes_both_numbers(served):
    context = 131072  # the tiny checkpoint's max_position_embeddings
    text = "The red circle moves to the right. " * 30000
    # the Chat tab answers a failed turn with the error as the assistant's message and keeps the chat usable
    out = served.client.predict({"text": text, "files": []}, False, 0, 4, 0.0, 2, 2.0, 4, 0.0, api_name="/chat")
    said = out if isinstance(out, str) else json.dumps(out)
    pattern = rf"the prompt has \d+ tokens but the model(&#x27;|'|\\u2019)s context is {context}"
    assert re.search(pattern, said), said[:300]
    assert_clear(said)
    assert_serves(served)


# --- S2: a burst of 50 against queue(max_size=4) with one model slot -----------------------------------------
def test_s2_burst_of_50_sheds_at_once_and_the_queued_ones_finish_in_order(served):
    path = upload(served.url, served.png)
    fn = fn_index(served.url, "document")
    session = new_session()
    # the raw protocol sends every input, the Stop flag's state slot too
    data = doc([file_data(path, served.png.name)], max_new_tokens=48) + [None]
    t0 = time.perf_counter()
    answers = [queue_join(served.url, fn, data, session) for _ in range(50)]  # sequential: a known join order
    burst_s = time.perf_counter() - t0
    accepted = [body["event_id"] for status, body, _ in answers if status == 200]
    refused = [(status, body, s) for status, body, s in answers if status != 200]
    print(f"S2: burst of 50 joins in {burst_s:.2f} s: {len(accepted)} accepted, {len(refused)} refused "
          f"(slowest refusal {max(s for *_, s in refused):.3f} s)")
    assert {status for status, _, _ in refused} == {503}
    assert all("Queue is full. Max size is 4" in body["detail"] for _, body, _ in refused)
    assert max(s for *_, s in refused) < 2.0, "refusals must be immediate"
    assert len(accepted) >= 5  # 1 running + 4 waiting; a request that finished during the burst freed its place
    events = read_events(served.url, session, set(accepted), timeout=180)
    waiting = [m["queue_size"] for _, m in events if m.get("msg") == "estimation"]
    assert waiting and max(waiting) <= 4, waiting  # the queue's own count, never over its size
    completed = [m for _, m in events if m.get("msg") == "process_completed"]
    assert [m["event_id"] for m in completed] == accepted, "the queued requests complete in join order"
    assert all(m["success"] for m in completed), [m for m in completed if not m["success"]][:1]
    running = 0
    for _, m in events:  # never more than the one model slot at a time
        running += {"process_starts": 1, "process_completed": -1}.get(m.get("msg"), 0)
        assert running <= 1
    assert_serves(served)


# --- S5: a decode worker killed mid-request ------------------------------------------------------------------
def test_s5_killed_decode_worker_fails_that_request_only_and_the_next_is_ok(served):
    # idle workers from earlier tests go first: a warm worker (decoder libraries loaded at its start) decodes this
    # small clip between two sweeps of the loop below, so the request must start a fresh one, which the loop kills
    for child in children(served):
        child.kill()
    while any(_alive(c) for c in children(served)):  # dead ones stay zombies until the pool reaps them
        time.sleep(0.05)
    first = served.client.submit(*video(handle_file(served.mp4)), api_name="/video")
    text_only = Client(served.url, verbose=False, download_files=False).submit(
        {"text": "Describe the image.", "files": []}, False, 0, 4, 0.0, 2, 2.0, 4, 0.0, api_name="/chat")
    killed = set()
    deadline = time.perf_counter() + 120
    while not first.done() and time.perf_counter() < deadline:  # SIGKILL every decode worker until it fails
        for child in children(served):
            try:
                child.kill()
                killed.add(child.pid)
            except Exception:  # noqa: BLE001 - already gone
                pass
        time.sleep(0.05)
    assert killed, "no decode worker was seen"
    with pytest.raises(AppError, match=r"decoder process died with SIGKILL.*\[decoder_crashed\]") as err:
        first.result(timeout=30)
    assert_clear(str(err.value))
    assert text_only.result(timeout=60), "a request that needs no decoder is unaffected"
    assert served.proc.poll() is None
    out = served.client.predict(*video(handle_file(served.mp4)), api_name="/video")  # a fresh worker
    assert out[1] is not None and "finished by" in str(out[-1])
    assert {c.pid for c in children(served)}.isdisjoint(killed)


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# --- S7: file= routes serve uploads and examples only --------------------------------------------------------
def test_s7_traversal_variants_never_return_content(served):
    model_cfg = served.model / "config.json"
    link = served.examples / "innocent.json"
    if not link.exists():
        link.symlink_to(model_cfg)  # a symlink inside an allowed folder, pointing out of it
    ex = str(served.examples)
    targets = [
        str(model_cfg), str(served.model / "model.safetensors"), "/etc/passwd", str(served.work / ".env"),
        ".env", "./.env", "notes.txt", str(served.work / "notes.txt"), str(served.work / "app.log"),
        f"{ex}/../{served.model.name}/config.json", f"{ex}/../.env", f"{ex}/../../{served.work.name}/.env",
        "//etc/passwd", str(model_cfg).upper(), str(link), f"{ex}/.././.env", f"{ex}/%2e%2e/.env",
    ]
    secret_cfg = model_cfg.read_bytes()
    checked = 0
    for target in targets:
        for form in (target, urllib.parse.quote(target, safe=""), urllib.parse.quote(urllib.parse.quote(target))):
            status, _, body = http_get(served.url + "gradio_api/file=" + form)
            assert status in (403, 404), (target, form, status)
            assert SECRET not in body and secret_cfg not in body, (target, form)
            checked += 1
    assert checked == 3 * len(targets)
    status, _, body = http_get(served.url + "gradio_api/file=" + str(served.examples / "examples.json"))
    assert status == 200 and b"question" in body  # the allowed folder is served: the checks are not vacuous


# --- S8: URLs in place of files are never fetched from private addresses ------------------------------------
@pytest.fixture()
def loopback_server():
    hits = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"\x89PNG\r\n\x1a\n")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], hits
    server.shutdown()
    server.server_close()


def test_s8_private_and_loopback_urls_are_refused_without_a_request(served, loopback_server):
    port, hits = loopback_server
    for url in [f"http://127.0.0.1:{port}/doc.png", f"http://localhost:{port}/doc.png",
                f"http://[::1]:{port}/doc.png", f"http://0.0.0.0:{port}/doc.png",
                "http://169.254.169.254/latest/meta-data/iam.png", "http://10.0.0.1/doc.png",
                "http://192.168.1.1/doc.png"]:
        t0 = time.perf_counter()
        with pytest.raises(AppError) as err:
            served.client.predict(*doc([{"path": url, "url": url, "orig_name": "doc.png",
                                         "meta": {"_type": "gradio.FileData"}}]), api_name="/document")
        assert "Traceback" not in str(err.value)
        assert time.perf_counter() - t0 < 10, f"{url}: refused only after {time.perf_counter() - t0:.1f} s"
    for form in (f"http://127.0.0.1:{port}/x", "http://169.254.169.254/latest", "http://10.0.0.1/"):
        status, headers, _ = http_get(served.url + "gradio_api/file=" + form)
        assert status in (400, 403, 404) and "location" not in {k.lower() for k in headers}, (form, status)
    assert hits == [], f"the app fetched {hits}"
    assert_serves(served)


# --- S9: over-size uploads ------------------------------------------------------------------------------------
def _upload_dir_state(app):
    files = [p for p in app.uploads.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


@pytest.mark.parametrize("case", ["body_2MB", "filename_2MB", "filename_50MB"])
def test_s9_oversize_upload_is_413_and_nothing_is_written(served, case):
    before = _upload_dir_state(served)
    if case == "body_2MB":
        payload = multipart(b"big.png", b"\x89PNG\r\n\x1a\n" + bytes(2 << 20), b"image/png")
    else:
        size = (2 << 20) if case == "filename_2MB" else (50 << 20)
        payload = multipart(b"a" * size + b".png", b"\x89PNG\r\n\x1a\n", b"image/png")
    t0 = time.perf_counter()
    status, body = raw_upload(served.url, payload)
    assert status == 413, (status, body[:200])
    assert time.perf_counter() - t0 < 30
    assert _upload_dir_state(served) == before, "an over-cap upload left something on disk"
    assert served.proc.poll() is None


# --- S10: content spoofing ---------------------------------------------------------------------------------
SPOOFS = {
    "pdf": b"%PDF-1.4\n1 0 obj<<>>endobj\ntrailer<<>>\n%%EOF\n",
    "eps": b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n",
    "html": b"<!DOCTYPE html><html><body><script>alert(document.cookie)</script></body></html>",
    "svg": b'<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>',
}


@pytest.mark.parametrize("kind", sorted(SPOOFS))
def test_s10_png_with_other_content_is_refused_by_sniffing_and_never_served_as_html(served, kind, tmp_path):
    fake = tmp_path / "page.png"
    fake.write_bytes(SPOOFS[kind])
    with pytest.raises(AppError, match=r"\[unsupported_format\]") as err:
        served.client.predict(*doc([handle_file(fake)]), api_name="/document")
    assert_clear(str(err.value), tmp_path)
    assert "by content, not file name" in str(err.value)
    path = upload(served.url, fake)  # anyone can upload; what comes back must not be active content
    status, headers, body = http_get(served.url + "gradio_api/file=" + path)
    ctype = {k.lower(): v for k, v in headers.items()}.get("content-type", "")
    assert status == 200 and body == SPOOFS[kind]
    assert not ctype.startswith(("text/html", "image/svg", "application/xhtml")), ctype
    if kind in ("html", "svg"):  # the same bytes under their own extension are sent as a download
        real = tmp_path / f"page.{kind}"
        real.write_bytes(SPOOFS[kind])
        status, headers, _ = http_get(served.url + "gradio_api/file=" + upload(served.url, real))
        h = {k.lower(): v for k, v in headers.items()}
        assert status == 200 and h.get("content-type") == "application/octet-stream"
        assert h.get("content-disposition", "").startswith("attachment")


def test_server_survived_the_module(served):
    assert served.proc.poll() is None, log_tail(served)
    assert_serves(served)
    assert os.path.isdir(served.uploads)
