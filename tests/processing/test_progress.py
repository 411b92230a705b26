"""vl/processing/progress.py: the work before the first token reports progress and stops at its safe points.

A stop during PDF rendering renders no further page; a stop while a decode worker runs kills the worker at once;
a stop during tile encoding encodes no further page, so the next request finds none of them in the vision
cache; the engine reports such a request as "cancelled" with no tokens.
"""

import os
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import sandbox_targets as targets  # noqa: E402
from media_fixtures import make_pdf  # noqa: E402

import vl.processing.documents as documents  # noqa: E402
from vl.errors import StoppedError  # noqa: E402
from vl.processing.progress import Work  # noqa: E402
from vl.processing.sandbox import run_isolated  # noqa: E402

PAGES = [(72, 72, b"")] * 5


def test_pdf_pages_are_reported_and_equal_the_one_call_render():
    data = make_pdf(PAGES)
    seen = []
    with Work(on_progress=lambda what, done, total: seen.append((what, done, total))):
        doc = documents.render_pdf(data, pages="2-5", scale=1.0)
    whole = documents.render_pdf(data, pages="2-5", scale=1.0)  # no watcher: one call, as before
    assert doc.page_numbers == whole.page_numbers == [2, 3, 4, 5] and doc.num_pages == 5
    assert [p.tobytes() for p in doc.pages] == [p.tobytes() for p in whole.pages]
    pages = [(d, t) for w, d, t in seen if w == "rendering PDF page"]
    assert pages[0] == (0, 4) and pages[-1] == (4, 4) and len(pages) >= 2, seen


def test_stop_during_pdf_rendering_renders_no_further_page(monkeypatch):
    data = make_pdf(PAGES)
    cancel, calls = threading.Event(), []
    real = documents.render_pdf_bytes

    def counting(data, pages, scale, password, limits, render=True):
        calls.append((pages, render))
        return real(data, pages, scale, password, limits, render)

    monkeypatch.setattr(documents, "render_pdf_bytes", counting)

    def progress(what, done, total):
        if done >= 1:
            cancel.set()  # the user presses Stop after the first page

    with pytest.raises(StoppedError), Work(cancel, progress):
        documents.render_pdf(data, scale=1.0)
    rendered = [p for p, render in calls if render]
    assert rendered == ["1"], calls  # the plan (render=False), then one page, then the stop


def test_stop_kills_a_running_decode_worker(tmp_path):
    """The stop comes once the worker is busy (it wrote its pid, then sleeps 30 s): the call ends with
    StoppedError and that worker is gone, not left to run on; the next call gets a fresh worker."""
    pid_file, cancel = tmp_path / "pid", threading.Event()

    def stop_when_busy():
        for _ in range(3000):  # 30 s: only a guard against a worker that never starts
            if pid_file.exists() and pid_file.read_text():
                break
            time.sleep(0.01)
        cancel.set()

    threading.Thread(target=stop_when_busy, daemon=True).start()
    with pytest.raises(StoppedError), Work(cancel):
        run_isolated(targets.sleep_after_writing_pid, str(pid_file), 30, timeout=60)
    busy = int(pid_file.read_text())
    assert not targets.running(busy), "the stopped worker is still running"
    assert run_isolated(targets.pid, timeout=30) != busy
    assert run_isolated(targets.echo, 7, timeout=30) == 7


def test_without_a_stop_the_worker_runs_as_before():
    with Work(threading.Event()):
        assert run_isolated(targets.echo, "x", timeout=30) == "x"


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    from media_fixtures import make_video

    return make_video(tmp_path_factory.mktemp("progress") / "clip.mp4", frames=40, fps=10)


def _load(clip, backend, isolate):
    from vl.processing.video import load_video

    return load_video(clip, norm_mean=(0.5,) * 3, norm_std=(0.5,) * 3, tile_size=32, max_frames=8, backend=backend,
                      isolate=isolate)


@pytest.mark.parametrize("isolate", [False, True], ids=["in_process", "sandboxed"])
@pytest.mark.parametrize("backend", ["decord", "pyav"])
def test_video_frames_are_reported_one_by_one(clip, backend, isolate):
    """Each sampled frame is reported as it is decoded, from a sandbox worker too; the frames are the ones an
    unwatched decode gives."""
    seen = []
    with Work(on_progress=lambda what, done, total: seen.append((what, done, total))):
        watched = _load(clip, backend, isolate)
    assert seen == [("video frames decoded", i, 8) for i in range(1, 9)], seen
    plain = _load(clip, backend, isolate)
    assert watched.backend == plain.backend == backend and watched.frame_indices == plain.frame_indices
    assert (watched.pixel_values == plain.pixel_values).all()


@pytest.mark.parametrize("isolate", [False, True], ids=["in_process", "sandboxed"])
@pytest.mark.parametrize("backend", ["decord", "pyav"])
def test_stop_during_video_decoding_ends_at_the_next_frame(clip, backend, isolate):
    cancel, seen = threading.Event(), []

    def progress(what, done, total):
        seen.append(done)
        if done == 3:
            cancel.set()  # the user presses Stop while the third frame is shown

    with pytest.raises(StoppedError), Work(cancel, progress):
        _load(clip, backend, isolate)
    assert seen == [1, 2, 3]  # no further frame reached the caller (a sandbox worker is killed at once)
    if isolate:
        assert run_isolated(targets.echo, 7, timeout=30) == 7  # the next call gets a working decoder
