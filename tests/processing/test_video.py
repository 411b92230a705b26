"""vl/processing/video.py: frame sampling (docs/format.md §9.1-9.3), both backends, caps before decode, and the bad-input
rows V1-V8 of docs/reliability_policy.md. Videos are encoded in the tests with PyAV; the grey level of frame i is
8*i mod 256, so every decoded tile tells which source frame it came from."""

import dataclasses
import fractions
import gc
import itertools
import os
import sys
import tempfile
import threading

import av
import numpy as np
import psutil
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
import sandbox_targets as targets  # noqa: E402
from media_fixtures import make_audio_only, make_av_clip, make_video  # noqa: E402

import vl.processing.video as video  # noqa: E402
from vl.errors import (  # noqa: E402
    CorruptMediaError,
    DecoderCrashedError,
    DecoderResourceError,
    DecodeTimeoutError,
    MediaError,
    MediaTooLargeError,
    NoVideoStreamError,
    RemoteMediaError,
    UnsupportedFormatError,
)
from vl.processing.limits import MediaLimits  # noqa: E402
from vl.processing.progress import Work  # noqa: E402
from vl.processing.sandbox import run_isolated, shutdown_workers  # noqa: E402
from vl.processing.video import frame_timestamps, load_video, probe_video, sample_frame_indices  # noqa: E402

HALF = dict(norm_mean=(0.5, 0.5, 0.5), norm_std=(0.5, 0.5, 0.5))
BACKENDS = ["decord", "pyav"]


def _grey(frames) -> list[float]:
    """Mean grey level (0..255) of each tile's lower half (the fixtures put noise in the upper half)."""
    x = frames.pixel_values * 0.5 + 0.5  # undo HALF normalization -> [0, 1]
    return (x[:, :, x.shape[2] // 2 + 2 :, :].mean(dim=(1, 2, 3)) * 255).tolist()


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    d = tmp_path_factory.mktemp("clips")
    tb = fractions.Fraction(1, 1000)
    vfr_pts = np.cumsum([0] + [33, 33, 100, 33, 250, 33, 500, 33, 33, 66] * 3)[:30].tolist()
    return {
        "cfr": make_video(d / "cfr.mp4", frames=60, fps=30, size=(64, 48)),
        "short": make_video(d / "short.mp4", frames=3, fps=1, size=(64, 48)),
        "vfr": make_video(d / "vfr.mp4", frames=30, fps=30, size=(64, 48), pts_list=vfr_pts, time_base=tb),
        "faststart": make_video(d / "fs.mp4", frames=60, fps=30, size=(160, 120), noise=True,
                                options={"movflags": "faststart"}),
        "plain_noise": make_video(d / "noise.mp4", frames=60, fps=30, size=(160, 120), noise=True),
        "mkv": make_video(d / "v.mkv", frames=30, fps=10, size=(64, 48)),  # Matroska: no header frame count
        "long": make_video(d / "long.mp4", frames=2, fps=1, pts_list=[0, 7_200_000], time_base=tb),
        "audio": make_audio_only(d / "audio.mp4"),
    }


# --- sampling and timestamps -------------------------------------------------------------------------------


def test_sampling_rules():
    assert sample_frame_indices(60, 30.0) == [0, 19, 39, 59]  # 2 s at 2 fps -> 4 frames, linspace truncated
    assert sample_frame_indices(3, 1.0) == [0, 1, 2]  # fewer frames than asked: all of them
    assert sample_frame_indices(1, 25.0) == [0]
    capped = sample_frame_indices(1000, 10.0)  # 100 s -> 200 wanted, capped at 128
    assert len(capped) == 128 and capped[0] == 0 and capped[-1] == 999 and capped == sorted(set(capped))
    assert len(sample_frame_indices(10**6, 30.0, target_fps=2.0, max_frames=16)) == 16
    with pytest.raises(ValueError):
        sample_frame_indices(0, 30.0)


def test_timestamp_conventions():
    assert frame_timestamps([0, 15, 300], 30.0) == [0.0, 0.5, 10.0]
    assert frame_timestamps([0, 15, 300], 30.0, "reference") == [0.0, 0.495, 9.9]  # int(1000/30) = 33 ms
    assert frame_timestamps([50], 25.0, "reference") == [2.0]  # exact when 1000/fps is an integer
    with pytest.raises(ValueError):
        frame_timestamps([0], 30.0, "other")


@pytest.mark.parametrize("backend", BACKENDS)
def test_constant_fps_clip(clips, backend):
    out = load_video(clips["cfr"], tile_size=32, backend=backend, **HALF)
    assert out.pixel_values.shape == (4, 3, 32, 32)  # one squashed tile per frame, no thumbnail
    assert out.frame_indices == [0, 19, 39, 59] and out.num_frames == 60 and out.fps == 30.0
    assert out.timestamps_s == pytest.approx([0, 19 / 30, 39 / 30, 59 / 30])
    assert out.presentation_times_s == pytest.approx(out.timestamps_s, abs=1e-3)
    assert np.allclose(_grey(out), [(8 * i) % 256 for i in out.frame_indices], atol=3)
    assert not out.partial and out.backend == backend


def test_backends_agree(clips):
    a = load_video(clips["cfr"], tile_size=32, backend="decord", target_fps=10, **HALF)
    b = load_video(clips["cfr"], tile_size=32, backend="pyav", target_fps=10, **HALF)
    assert a.frame_indices == b.frame_indices
    assert (a.pixel_values - b.pixel_values).abs().max() < 0.05


@pytest.mark.parametrize("backend", BACKENDS)
def test_short_clip_returns_all_frames(clips, backend):
    out = load_video(clips["short"], tile_size=32, backend=backend, **HALF)
    assert out.frame_indices == [0, 1, 2] and out.timestamps_s == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_sparse_sampling_with_seeks_delivers_the_right_frames(tmp_path, backend):
    path = make_video(tmp_path / "long.mp4", frames=900, fps=30, size=(64, 48))
    out = load_video(path, tile_size=32, backend=backend, max_frames=8, **HALF)
    assert out.frame_indices == [0, 128, 256, 385, 513, 642, 770, 899]
    assert np.allclose(_grey(out), [(8 * i) % 256 for i in out.frame_indices], atol=3)


def test_bytes_and_file_object_sources(clips):
    data = open(clips["cfr"], "rb").read()
    a = load_video(data, tile_size=32, backend="pyav", **HALF)
    with open(clips["cfr"], "rb") as f:
        b = load_video(f, tile_size=32, backend="pyav", **HALF)
    assert torch.equal(a.pixel_values, b.pixel_values)
    with pytest.raises(RemoteMediaError):
        load_video("https://example.com/v.mp4", **HALF)
    with pytest.raises(MediaTooLargeError):
        load_video(data, limits=MediaLimits(max_video_bytes=len(data) - 1), **HALF)


# --- V1-V8 -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_v1_empty_and_random_bytes(tmp_path, backend):
    # empty: corrupt; random bytes: no video container by content (the name says .mp4, the bytes do not)
    for name, data, error in [("empty.mp4", b"", CorruptMediaError),
                              ("random.mp4", b"\x00" + os.urandom(99), UnsupportedFormatError)]:
        (tmp_path / name).write_bytes(data)
        with pytest.raises(error):
            load_video(str(tmp_path / name), backend=backend, **HALF)
        with pytest.raises(error):
            load_video(data, backend=backend, **HALF)


@pytest.mark.parametrize("backend", BACKENDS)
def test_v2_moov_missing(clips, backend):
    data = open(clips["plain_noise"], "rb").read()  # moov at the end: cutting it off leaves no index
    with pytest.raises(CorruptMediaError):
        load_video(data[: len(data) // 2], backend=backend, isolate=True, **HALF)


def test_v2_v3_mdat_truncated_partial_decode_indices_in_range(clips):
    """faststart file cut in half: the header still declares 60 frames, about half exist."""
    data = open(clips["faststart"], "rb").read()
    out = load_video(data[: len(data) // 2], backend="pyav", target_fps=30, tile_size=32, isolate=True, **HALF)
    assert out.metadata.header_frames == 60 and 0 < out.num_frames < 60
    assert out.partial and 0 < len(out.frame_indices) <= out.num_frames
    assert all(0 <= i < out.num_frames for i in out.frame_indices)
    assert out.pixel_values.shape[0] == len(out.frame_indices) == len(out.timestamps_s)


def test_v2_v3_decord_on_truncated_file_fails_cleanly(clips):
    data = open(clips["faststart"], "rb").read()
    try:
        out = load_video(data[: len(data) // 2], backend="decord", target_fps=30, isolate=True, **HALF)
    except MediaError:
        return  # decord refuses the file: a clear error is a pass
    assert all(0 <= i < out.num_frames for i in out.frame_indices)


@pytest.fixture(scope="module")
def huge_frame_video(tmp_path_factory):
    path = tmp_path_factory.mktemp("huge") / "huge.mp4"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=1, options={"preset": "ultrafast"})
        stream.width = stream.height = 8192
        stream.pix_fmt = "yuv420p"
        for packet in stream.encode(av.VideoFrame(8192, 8192, "yuv420p")):
            container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return str(path)


@pytest.mark.parametrize("backend", BACKENDS)
def test_v4_frame_pixel_cap_before_decoding(huge_frame_video, monkeypatch, backend):
    def refuse(*a, **k):
        raise AssertionError("decoding started before the frame-size cap was checked")

    monkeypatch.setattr(video, "_decode_pyav", refuse)
    monkeypatch.setattr(video, "_decode_decord", refuse)
    with pytest.raises(MediaTooLargeError, match="8192x8192"):
        load_video(huge_frame_video, backend=backend, **HALF)


def test_v4_exact_boundary(clips):
    assert load_video(clips["cfr"], tile_size=16, limits=MediaLimits(max_video_frame_pixels=64 * 48), **HALF)
    with pytest.raises(MediaTooLargeError):
        load_video(clips["cfr"], limits=MediaLimits(max_video_frame_pixels=64 * 48 - 1), **HALF)


@pytest.mark.parametrize("backend", BACKENDS)
def test_v5_duration_cap(clips, backend):
    assert probe_video(clips["long"], MediaLimits(max_video_duration_s=10_000)).duration_s > 7000
    before = psutil.Process().memory_info().rss
    with pytest.raises(MediaTooLargeError, match="too long"):
        load_video(clips["long"], backend=backend, **HALF)
    assert psutil.Process().memory_info().rss - before < 50 << 20


@pytest.mark.parametrize("backend", BACKENDS)
def test_v5_frame_walk_cap_when_the_header_has_no_count(clips, backend):
    assert probe_video(clips["mkv"]).header_frames == 0
    with pytest.raises(MediaTooLargeError, match="cap"):
        load_video(clips["mkv"], backend=backend, limits=MediaLimits(max_video_frames=10), **HALF)
    assert load_video(clips["mkv"], backend=backend, tile_size=16, limits=MediaLimits(max_video_frames=30), **HALF)


@pytest.mark.parametrize("backend", BACKENDS)
def test_v6_audio_only(clips, backend):
    with pytest.raises(NoVideoStreamError, match="audio"):
        load_video(clips["audio"], backend=backend, **HALF)


@pytest.mark.parametrize("backend", BACKENDS)
def test_v6_variable_frame_rate(clips, backend):
    out = load_video(clips["vfr"], tile_size=32, backend=backend, **HALF)
    assert 0 < out.fps < 30 and out.num_frames == 30
    assert out.frame_indices == sorted(out.frame_indices) and out.frame_indices[-1] == 29
    pts = out.presentation_times_s
    assert pts[0] == 0.0 and all(b > a for a, b in zip(pts, pts[1:]))
    assert np.allclose(_grey(out), [(8 * i) % 256 for i in out.frame_indices], atol=3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_v6_missing_fps_is_measured(clips, monkeypatch, backend):
    real_probe = video.probe_video
    monkeypatch.setattr(video, "probe_video", lambda *a: dataclasses.replace(real_probe(*a), fps=None))
    out = load_video(clips["cfr"], tile_size=16, backend=backend, **HALF)
    assert out.fps == pytest.approx(30.0, rel=0.02) and out.frame_indices[-1] == 59


def _fds():
    return len(os.listdir("/proc/self/fd"))


def _tmp_dirs():
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("vl-video-")}


def test_v7_repeated_opens_leak_nothing(clips):
    for backend in BACKENDS:  # warm up libraries and allocator pools
        load_video(clips["cfr"], tile_size=16, backend=backend, **HALF)
    fds, dirs, rss = _fds(), _tmp_dirs(), psutil.Process().memory_info().rss
    for _ in range(200):
        probe_video(clips["cfr"])
    data = open(clips["cfr"], "rb").read()
    for k in range(40):
        load_video(data, tile_size=16, backend=BACKENDS[k % 2], **HALF)
    for _ in range(10):
        with pytest.raises(MediaError):
            load_video(b"junk" * 30, **HALF)
    assert _fds() == fds and _tmp_dirs() == dirs
    assert psutil.Process().memory_info().rss - rss < 60 << 20


def test_v7_isolated_calls_leave_no_temp_files(clips):
    data = open(clips["cfr"], "rb").read()
    load_video(data, tile_size=16, backend="pyav", isolate=True, **HALF)
    fds, dirs = _fds(), _tmp_dirs()
    for _ in range(20):
        load_video(data, tile_size=16, backend="pyav", isolate=True, **HALF)
    assert _fds() == fds and _tmp_dirs() == dirs


def test_v8_worker_killed_mid_decode_then_next_request_ok(tmp_path):
    """The killer SIGKILLs every worker it sees until the call fails (it needs far longer than one sweep: 128
    frames decoded and resized), so the kill lands mid-decode on any machine; the next request is served."""
    path = make_video(tmp_path / "busy.mp4", frames=150, fps=30, size=(320, 240), noise=True)
    me, done, killed = psutil.Process(), threading.Event(), []

    def killer():
        while not done.is_set():
            for child in me.children():
                try:
                    child.kill()
                    killed.append(child.pid)
                except psutil.NoSuchProcess:
                    pass
            done.wait(0.01)

    thread = threading.Thread(target=killer)
    thread.start()
    try:
        with pytest.raises(DecoderCrashedError, match="SIGKILL"):
            load_video(path, backend="decord", target_fps=100, isolate=True, **HALF)
    finally:
        done.set()
        thread.join()
    assert killed
    assert load_video(path, backend="pyav", tile_size=16, isolate=True, **HALF).num_frames == 150


def test_v8_timeout_then_next_request_ok(clips):
    with pytest.raises(DecodeTimeoutError):
        load_video(clips["cfr"], isolate=True, limits=MediaLimits(video_timeout_s=0.01), **HALF)
    assert load_video(clips["cfr"], tile_size=16, isolate=True, **HALF).num_frames == 60


# --- issue 52: one sandbox worker for many files; no leaks; resources are not the file's fault; one deadline ------


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def test_several_videos_in_a_row_through_one_sandbox_worker(tmp_path):
    """Issue 52 item 3, as a user of `vl app` met it: a 13 s 320x180 MP4 with two video and two audio streams at
    8 fps lost frames, the next two valid videos failed ("failed to map segment", "no attribute '_ffi'") and the
    first clip asked again was called corrupt. Here: that clip, three other valid videos, the clip again, all
    through one pooled worker, each equal to the same decode in this process; every sampled frame present; the
    worker's thread count back at its baseline after every call."""
    clip = make_av_clip(tmp_path / "two_video_two_audio.mp4")
    others = [make_video(tmp_path / "noise.mp4", frames=90, fps=30, size=(320, 240), noise=True),
              make_video(tmp_path / "wide.mkv", frames=60, fps=25, size=(640, 360), noise=True),
              make_video(tmp_path / "vp9.webm", frames=48, fps=24, size=(160, 120), codec="libvpx-vp9",
                         container_format="webm")]
    shutdown_workers()
    worker = run_isolated(targets.pid, timeout=120)
    baseline = run_isolated(targets.status, timeout=60)["Threads"]
    first = None
    for path, fps in [(clip, 8.0), *[(p, 2.0) for p in others], (clip, 8.0)]:
        out = load_video(path, target_fps=fps, tile_size=256, isolate=True, **HALF)  # decord first, as the app
        local = load_video(path, target_fps=fps, tile_size=256, **HALF)
        assert not out.partial and out.frame_indices == local.frame_indices
        assert out.timestamps_s == local.timestamps_s and torch.equal(out.pixel_values, local.pixel_values)
        if path == clip:
            assert out.num_frames == 390 and len(out.frame_indices) == 13 * 8  # every sampled frame decoded
            red = (out.pixel_values[:, 0, 64 + 8 :, :] * 0.5 + 0.5).mean(dim=(1, 2)) * 255  # below the noise band
            assert np.allclose(red.numpy(), [(8 * i) % 256 for i in out.frame_indices], atol=4)
            if first is None:
                first = out
            else:  # asked again: the same frames, the same pixels
                assert out.frame_indices == first.frame_indices and torch.equal(out.pixel_values, first.pixel_values)
        assert run_isolated(targets.pid, timeout=30) == worker  # one worker, never retired: it stayed healthy
        assert run_isolated(targets.status, timeout=30)["Threads"] <= baseline + 1


def test_decoding_leaves_no_decoder_threads_behind():
    """Issue 52: two calls on one small file took an isolated worker from 3 to 199 threads (2.09 GB of address
    space) until gc.collect(): every converted frame kept a swscale thread pool, and the frames lived on in a
    reference cycle with their side data. With the collector off, N decodes leave the thread count as it was."""
    path = make_video(os.path.join(tempfile.mkdtemp(), "threads.mp4"), frames=90, fps=30, size=(96, 64))
    for backend in BACKENDS:  # warm up: libraries may start their own pools once
        load_video(path, backend=backend, tile_size=16, **HALF)
    gc.collect()
    gc.disable()
    try:
        before = _threads()
        for k in range(6):
            out = load_video(path, backend=BACKENDS[k % 2], target_fps=30, tile_size=16, **HALF)
            assert len(out.frame_indices) == 90
            assert _threads() <= before + 1, f"call {k}: {_threads()} threads, {before} before"
    finally:
        gc.enable()


def test_an_allocation_failure_is_never_corrupt_media(clips, monkeypatch):
    """Issue 52 item 3: ENOMEM inside FFmpeg was taken for a bad file (frames silently dropped, then
    corrupt_media). It is ours: in a worker the memory cap's MediaTooLargeError (and a fresh worker), in-process
    DecoderResourceError."""
    worker = run_isolated(targets.pid, timeout=60)
    for _ in range(2):
        with pytest.raises(MediaTooLargeError, match="memory cap"):
            run_isolated(targets.decode_video_with_enomem, clips["cfr"], MediaLimits(), timeout=60)
        assert run_isolated(targets.pid, timeout=60) != worker

    def enomem(self, frame, tile_size, limits):
        av.error.err_check(-12)  # ENOMEM

    monkeypatch.setattr(video._Display, "tile", enomem)
    with pytest.raises(DecoderResourceError, match="ran out of memory"):
        load_video(clips["cfr"], backend="pyav", **HALF)


def test_a_decord_that_does_not_load_is_ours_not_the_files(clips, monkeypatch):
    """Issue 52 item 3: after a failed dlopen, `import decord` gave a half-initialized module ("module 'decord'
    has no attribute '_ffi'"), an untyped error. Both forms are a typed resource error."""
    import types

    monkeypatch.setitem(sys.modules, "decord", types.ModuleType("decord"))  # imported, without its _ffi
    with pytest.raises(DecoderResourceError, match="could not be loaded.*_ffi"):
        load_video(clips["cfr"], backend="decord", **HALF)
    monkeypatch.setitem(sys.modules, "decord", None)  # import fails
    with pytest.raises(DecoderResourceError, match="ModuleNotFoundError"):
        load_video(clips["cfr"], backend="decord", **HALF)


@pytest.mark.parametrize("backend", BACKENDS)
def test_in_process_deadline_while_indexing(clips, monkeypatch, backend):
    """Issue 52: no deadline in-process (`vl chat` took 62 s and 217 s on two long AV1 files). A clock that moves
    one second per reading, a 5 s deadline: the index pass stops within a few packets of the 60."""
    reads = itertools.count()
    monkeypatch.setattr(video, "_now", lambda: float(next(reads)))
    with pytest.raises(DecodeTimeoutError, match="within 5 s.*while indexing"):
        load_video(clips["cfr"], backend=backend, limits=MediaLimits(video_timeout_s=5), **HALF)
    assert next(reads) <= 8  # stopped at the first reading past the deadline, not after the file


@pytest.mark.parametrize("backend", BACKENDS)
def test_in_process_deadline_while_decoding(clips, monkeypatch, backend):
    """The clock moves 10 s per decoded frame (counted by the progress reports), the deadline is 25 s: the
    decode stops after the third frame of the 30 sampled, on either backend."""
    decoded = []
    monkeypatch.setattr(video, "_now", lambda: 10.0 * len(decoded))
    with Work(on_progress=lambda what, done, total: decoded.append(done)):
        with pytest.raises(DecodeTimeoutError, match="within 25 s.*after 3 of 30 sampled frames"):
            load_video(clips["cfr"], backend=backend, target_fps=15, limits=MediaLimits(video_timeout_s=25), **HALF)
    assert decoded == [1, 2, 3]
    monkeypatch.setattr(video, "_now", lambda: 0.0)  # a clock that never moves: the same call completes
    assert len(load_video(clips["cfr"], backend=backend, target_fps=15, tile_size=16,
                          limits=MediaLimits(video_timeout_s=25), **HALF).frame_indices) == 30


def test_duration_cap_applies_to_the_presentation_times(clips, monkeypatch):
    """A header that declares no duration (or less) does not let a longer file through: the frames' own span is
    checked against max_video_duration_s too."""
    monkeypatch.setattr(video, "_check_metadata", lambda meta, limits: None)  # the header passes, whatever it says
    with pytest.raises(MediaTooLargeError, match="frames span 2 s, the cap is 1 s"):
        load_video(clips["cfr"], limits=MediaLimits(max_video_duration_s=1.2), **HALF)
    assert load_video(clips["cfr"], tile_size=16, limits=MediaLimits(max_video_duration_s=2.0), **HALF)
