"""Untrusted uploads are decoded where a decoder crash or hang cannot take the server down, and many requests
leak nothing (docs/reliability_policy.md rows I10, V7, and S11's resource criteria in-process).

- `vl app` builds its engine with `isolate=True` (every image, video and PDF decode runs in a sandbox worker of
  vl/processing/sandbox.py), confined to the upload folder and the bundled examples;
- per-request item caps are applied to the raw messages, before any image, video or PDF is decoded (I10);
- the app's processor decodes an ordinary two-video, two-audio clip, other videos, then the clip again, in one
  worker, all complete and identical (issue 52 item 3);
- 100 requests through `Processor(isolate=True)`, valid and bad ones mixed, leave the fd count, the temp folder,
  the number of worker processes and their threads where they were, and grow RSS (this process + workers) by
  under 10 % (issue 52: the isolated worker gained ~100 decoder threads per video call).
"""

from __future__ import annotations

import os
import tempfile

import psutil
import pytest
import torch
from media_fixtures import encode, make_av_clip, make_pdf, make_video, noise_image, png_header_only, red_square_page
from sandbox_targets import pid

import vl
from vl.errors import MediaError, TooManyItemsError
from vl.processing import processor as processor_module
from vl.processing.sandbox import run_isolated, shutdown_workers


# --- the app isolates decoding --------------------------------------------------------------------------------
def test_vl_app_builds_its_engine_with_sandboxed_decoding(monkeypatch, tmp_path, rel_tiny_dir):
    from ui import app
    from ui.limits import AppLimits
    from ui.runner import UIEngine

    captured = {}

    class Captured(Exception):
        pass

    def capture(path, **kwargs):
        captured.update(kwargs, path=path)
        raise Captured

    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "uploads"))
    monkeypatch.setattr(UIEngine, "from_pretrained", staticmethod(capture))
    with pytest.raises(Captured):
        app.main(["--model", str(rel_tiny_dir), "--examples-dir", str(tmp_path / "examples")])
    assert captured["isolate"] is True
    assert captured["limits"] == AppLimits().media
    roots = {os.path.realpath(r) for r in captured["allowed_roots"]}
    assert roots == {os.path.realpath(tmp_path / "uploads"), os.path.realpath(tmp_path / "examples")}


# --- I10: caps before decoding --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_processor(rel_tiny_dir):
    return vl.load_processor(rel_tiny_dir)


@pytest.fixture()
def decoded(monkeypatch):
    """Counts calls of the decoders the processor uses (PDFs: opened and checked, then rendered and tiled)."""
    calls = []
    for name in ("preprocess_image", "open_pdf_pages", "render_pdf_tiles", "load_video"):
        real = getattr(processor_module, name)
        monkeypatch.setattr(processor_module, name,
                            lambda *a, _real=real, _name=name, **k: (calls.append(_name), _real(*a, **k))[1])
    return calls


def _user(*parts):
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "What is this?"}]}]


def test_i10_one_item_over_a_cap_is_refused_before_anything_is_decoded(tiny_processor, decoded):
    png = encode(noise_image(32, 32), "PNG")
    pdf = make_pdf([red_square_page()] * 3)
    cases = {
        "image": _user(*[{"type": "image", "image": png}] * 5),
        "document": _user({"type": "pdf", "pdf": pdf}, {"type": "pdf", "pdf": bytes(bytearray(pdf))}),
        "video": _user({"type": "video", "video": b"\x00" * 64}, {"type": "video", "video": b"\x00" * 64}),
    }
    for kind, messages in cases.items():
        with pytest.raises(TooManyItemsError, match=f"at most 1 {kind}|at most 4 {kind}"):
            tiny_processor(messages)
    assert decoded == [], f"decoded before the cap was checked: {decoded}"
    # the same PDF object twice is two documents (it was counted once, by object identity)
    with pytest.raises(TooManyItemsError, match="at most 1 document"):
        tiny_processor(_user({"type": "pdf", "pdf": pdf}, {"type": "pdf", "pdf": pdf}))
    assert decoded == []
    # at the caps everything is accepted: the refusals above are the caps, not the inputs
    tiny_processor(_user(*[{"type": "image", "image": png}] * 4))
    tiny_processor(_user({"type": "pdf", "pdf": pdf}, {"type": "image", "image": png}))
    assert decoded.count("preprocess_image") == 4 + 1
    assert decoded.count("open_pdf_pages") == 1 and decoded.count("render_pdf_tiles") == 1  # 3 pages, one render


# --- issue 52 item 3: the app's decoder survives an ordinary clip ------------------------------------------
def test_the_apps_processor_decodes_videos_in_a_row_in_one_worker(rel_tiny_dir, tmp_path):
    """In a fresh `vl app`, a 13 s 320x180 MP4 with two video and two audio streams at 8 fps lost frames, the
    next two valid videos failed with "Internal error" and the clip asked again was called corrupt. The app's
    processor (sandboxed, the app's limits), the same sequence: every answer complete, the clip's prompt and
    pixels the same both times, one worker throughout."""
    from ui.limits import AppLimits

    proc = vl.load_processor(rel_tiny_dir, isolate=True, limits=AppLimits().media)
    clip = make_av_clip(tmp_path / "two_video_two_audio.mp4")
    others = [make_video(tmp_path / "a.mp4", frames=90, fps=30, size=(320, 240), noise=True),
              make_video(tmp_path / "b.mkv", frames=60, fps=25, size=(640, 360), noise=True)]
    shutdown_workers()
    worker = run_isolated(pid, timeout=120)
    answers = []
    for path, fps in [(clip, 8), (others[0], 2), (others[1], 2), (clip, 8)]:
        out = proc(_user({"type": "video", "video": path, "fps": fps}))
        assert not any("could not be decoded" in note for note in out.notes), out.notes
        answers.append(out)
    first, again = answers[0], answers[-1]
    assert first.pixel_values.shape[0] == 13 * 8 and first.text == again.text
    assert torch.equal(first.pixel_values, again.pixel_values)
    assert run_isolated(pid, timeout=30) == worker


# --- many isolated requests leak nothing --------------------------------------------------------------------
def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _workers() -> list[psutil.Process]:
    return [c for c in psutil.Process().children() if "vl.processing.sandbox" in " ".join(c.cmdline())]


def _worker_threads() -> int:
    total = 0
    for w in _workers():
        try:
            total += w.num_threads()
        except psutil.NoSuchProcess:
            pass
    return total


def _rss_tree() -> int:
    total = psutil.Process().memory_info().rss
    for w in _workers():
        try:
            total += w.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


@pytest.fixture()
def private_tmp(tmp_path, monkeypatch):
    """A temp folder of our own, inherited by the sandbox workers started from now on, so that only this
    test's temp files are counted (other tests may run beside us)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    shutdown_workers()
    yield tmp
    shutdown_workers()  # later workers go back to the normal temp folder


def test_many_isolated_requests_leak_no_fds_temp_files_workers_or_memory(rel_tiny_dir, tmp_path, private_tmp):
    from ui.limits import AppLimits

    proc = vl.load_processor(rel_tiny_dir, isolate=True, limits=AppLimits().media)
    png = encode(noise_image(200, 120), "PNG")
    pdf = make_pdf([red_square_page()] * 3)
    clip = make_video(tmp_path / "clip.mp4", frames=20, fps=10, size=(64, 48))
    valid = [
        _user({"type": "image", "image": png}),
        _user({"type": "pdf", "pdf": pdf}),
        _user({"type": "video", "video": clip, "max_frames": 8}),
        _user({"type": "video", "video": open(clip, "rb").read(), "max_frames": 4}),
    ]
    bad = [
        _user({"type": "image", "image": png[: len(png) // 2]}),  # truncated
        _user({"type": "image", "image": png_header_only(40000, 40000)}),  # bomb header
        _user({"type": "image", "image": pdf}),  # a PDF posing as an image
        _user({"type": "video", "video": os.urandom(2000)}),
        _user({"type": "pdf", "pdf": make_pdf([red_square_page()], user_password="s3cret")}),
        _user({"type": "pdf", "pdf": b"%PDF-1.7\n" + os.urandom(1500)}),
    ]

    def one_round():
        for messages in valid:
            out = proc(messages)
            assert out.pixel_values is not None and torch.isfinite(out.pixel_values).all()
        for messages in bad:
            with pytest.raises(MediaError):
                proc(messages)

    for _ in range(2):  # warm-up: libraries, allocator pools, one pooled worker
        one_round()
    fds, workers, rss, threads = _fds(), len(_workers()), _rss_tree(), _worker_threads()
    temp_entries = sorted(os.listdir(private_tmp))
    assert workers >= 1, "decoding must have happened in a sandbox worker"
    rounds = 10
    for _ in range(rounds):
        one_round()
    grown = (_rss_tree() - rss) / rss
    print(f"isolation: {rounds * (len(valid) + len(bad))} requests; fds {fds} -> {_fds()}, workers {workers} -> "
          f"{len(_workers())}, worker threads {threads} -> {_worker_threads()},"
          f" temp entries {len(temp_entries)} -> {len(os.listdir(private_tmp))}, "
          f"RSS (self + workers) {rss / 2**20:.0f} MiB -> {_rss_tree() / 2**20:.0f} MiB ({grown:+.1%})")
    assert _fds() == fds
    assert len(_workers()) <= workers
    assert _worker_threads() <= threads
    assert sorted(os.listdir(private_tmp)) == temp_entries
    assert grown < 0.10
