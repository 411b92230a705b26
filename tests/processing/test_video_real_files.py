"""vl/processing/video.py against the ways real files differ from a clean single-stream MP4: several video
streams, MPEG-PS/TS and other containers, discard-flagged packets (MP4 edit lists), display-matrix rotation,
B-frames, non-zero start times; the prompt timestamps; and the video-path allowlist (image formats, playlists,
concat lists, codecs, nested opens).

Oracles are independent of the code under test: tiles are checked by the content painted into each source frame
(media_fixtures), timestamps against the container's own presentation times (`container_pts`, read with plain
PyAV), rotations against numpy's rot90/fliplr of the stored frame."""

import fractions
import inspect
import os
import struct
import sys

import av
import numpy as np
import pytest
from PIL import Image

sys.path.insert(0, os.path.dirname(__file__))
from media_fixtures import (  # noqa: E402
    container_pts,
    encode,
    encrypt_matroska_header,
    hls_playlist,
    make_cenc_mp4,
    make_multistream_video,
    make_video,
    make_vp9_with_hidden_frames,
    vp9_superframe,
)

from vl.errors import (  # noqa: E402
    EncryptedMediaError,
    MediaTooLargeError,
    RemoteMediaError,
    UnsupportedFormatError,
)
from vl.processing import video_formats  # noqa: E402
from vl.processing.limits import MediaLimits  # noqa: E402
from vl.processing.processor import Processor  # noqa: E402
from vl.processing.video import load_video  # noqa: E402

HALF = dict(norm_mean=(0.5, 0.5, 0.5), norm_std=(0.5, 0.5, 0.5))
BACKENDS = ["decord", "pyav"]


def _rgb(frames):
    """Mean (R, G, B) 0..255 of each tile."""
    x = frames.pixel_values * 0.5 + 0.5
    return (x.mean(dim=(2, 3)) * 255).numpy()


def _assert_times_are_the_containers(out, path, stream_index=None):
    pts = container_pts(path, stream_index)
    assert out.num_frames == len(pts)
    assert out.presentation_times_s == pytest.approx([pts[i] for i in out.frame_indices], abs=1e-6)
    assert out.timestamps_s == out.presentation_times_s  # the default prompt timestamps are the pts


# --- 1. several video streams ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_streams(tmp_path_factory):
    d = tmp_path_factory.mktemp("multi")
    return {  # stream 0: 64x48 at 25 fps, 50 frames; stream 1: 96x64 at 30 fps, 90 frames
        "second_is_default": make_multistream_video(d / "a.mp4", [(64, 48, 25, 50), (96, 64, 30, 90)], default=1),
        "first_is_default": make_multistream_video(d / "b.mp4", [(64, 48, 25, 50), (96, 64, 30, 90)], default=0),
    }


@pytest.mark.parametrize("backend", BACKENDS)
def test_1_multistream_probe_cap_and_decode_use_the_best_stream(two_streams, backend):
    path = two_streams["second_is_default"]
    with av.open(path) as c:
        best = c.streams.best("video").index  # libavformat's own choice
    assert best == 1
    out = load_video(path, tile_size=16, backend=backend, **HALF)
    meta = out.metadata
    assert (meta.stream_index, meta.width, meta.height, meta.video_streams) == (1, 96, 64, 2)
    assert out.fps == 30.0 and out.frame_indices == [0, 17, 35, 53, 71, 89]  # 3 s at 2 fps, from stream 1's 90 frames
    rgb = _rgb(out)
    assert np.allclose(rgb[:, 1], 60, atol=4)  # green 60: every tile is from stream 1
    assert np.allclose(rgb[:, 0], [(8 * i) % 256 for i in out.frame_indices], atol=4)
    _assert_times_are_the_containers(out, path, 1)
    if backend == "decord":
        assert out.backend == "pyav" and "2 video streams" in out.backend_note


@pytest.mark.parametrize("backend", BACKENDS)
def test_1_frame_size_cap_applies_to_the_decoded_stream(two_streams, backend):
    small = MediaLimits(max_video_frame_pixels=64 * 48)  # admits stream 0, not stream 1
    with pytest.raises(MediaTooLargeError, match="96x64"):
        load_video(two_streams["second_is_default"], backend=backend, limits=small, **HALF)
    out = load_video(two_streams["first_is_default"], tile_size=16, backend=backend, limits=small, **HALF)
    assert out.metadata.stream_index == 0 and out.num_frames == 50
    assert np.allclose(_rgb(out)[:, 1], 0, atol=4)


def test_1_a_huge_second_stream_is_never_decoded(tmp_path):
    """A 64x64 default stream beside one above the frame-size cap (4160x4160): the small stream passes the caps
    and is the only one decoded (decord, which could pick the other stream and abort the process, is not used);
    with the large stream as default, the cap refuses the file."""
    path = make_multistream_video(tmp_path / "huge2.mp4", [(64, 64, 2, 4), (4160, 4160, 1, 1)], default=0)
    out = load_video(path, tile_size=16, backend="decord", **HALF)  # in-process, the Engine.chat default
    assert out.metadata.stream_index == 0 and (out.metadata.width, out.metadata.height) == (64, 64)
    assert out.backend == "pyav" and out.num_frames == 4
    big_first = make_multistream_video(tmp_path / "huge1.mp4", [(64, 64, 2, 4), (4160, 4160, 1, 1)], default=1)
    with pytest.raises(MediaTooLargeError, match="4160x4160"):  # above the default 4096 x 4096 cap
        load_video(big_first, backend="decord", **HALF)


# --- 2. containers decord mis-seeks; other containers and codecs ---------------------------------------------

CONTAINERS = {  # name: (muxer, codec, suffix, codec options)
    "mpeg_ps": ("mpeg", "mpeg2video", ".mpg", None),
    "mpegts_h264": ("mpegts", "libx264", ".ts", None),
    "mp4_bframes": ("mp4", "libx264", ".mp4", {"preset": "ultrafast", "x264-params": "bframes=3:b-adapt=0"}),
    "mkv_bframes": ("matroska", "libx264", ".mkv", {"preset": "ultrafast", "x264-params": "bframes=3:b-adapt=0"}),
    "webm_vp9": ("webm", "libvpx-vp9", ".webm", None),
    "avi_mpeg4": ("avi", "mpeg4", ".avi", None),
    "mov_mjpeg": ("mov", "mjpeg", ".mov", None),
    "mp4_hevc": ("mp4", "libx265", ".mp4", {"x265-params": "log-level=error:pools=none:frame-threads=1"}),
    "ogg_vp8": ("ogg", "libvpx", ".ogv", None),
    "flv": ("flv", "flv", ".flv", None),
}


@pytest.fixture(scope="module")
def containers(tmp_path_factory):
    d = tmp_path_factory.mktemp("containers")
    out = {}
    for name, (muxer, codec, suffix, options) in CONTAINERS.items():
        out[name] = make_video(d / f"{name}{suffix}", frames=90, fps=25, size=(64, 48), codec=codec,
                               container_format=muxer, codec_options=options)
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(CONTAINERS))
def test_2_frames_by_content_and_times_by_container_pts(containers, name, backend):
    """MPEG-PS is the reported case (decord returned frames 2, 4, 6, 8, 18, 72 for 14..84, with times near
    1e14 s); decord also returns wrong frames with plausible times on MPEG-TS, so it never decodes either."""
    path = containers[name]
    out = load_video(path, tile_size=16, target_fps=4, backend=backend, **HALF)
    assert out.frame_indices == [0, 6, 13, 20, 27, 34, 41, 47, 54, 61, 68, 75, 82, 89]  # 3.6 s at 4 fps: 14
    assert np.allclose(_rgb(out)[:, 0], [(8 * i) % 256 for i in out.frame_indices], atol=6)
    _assert_times_are_the_containers(out, path)
    assert not out.partial
    if backend == "decord" and name in ("mpeg_ps", "mpegts_h264", "avi_mpeg4", "ogg_vp8", "flv"):
        assert out.backend == "pyav" and "not used for" in out.backend_note


LONG = {"mpeg": "mpeg2video", "mpegts": "libx264", "matroska": "libx264", "avi": "mpeg4", "ogg": "libvpx",
        "flv": "flv"}


@pytest.fixture(scope="module")
def long_clips(tmp_path_factory):
    d = tmp_path_factory.mktemp("long")
    return {muxer: make_video(d / f"long.{muxer}", frames=900, fps=30, size=(64, 48), codec=codec,
                              container_format=muxer) for muxer, codec in LONG.items()}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("muxer", list(LONG))
def test_2_sparse_sampling_across_long_gaps(long_clips, muxer, backend):
    """8 frames of 900 (gaps of ~128 frames, where PyAV seeks): MPEG-PS/TS seeks are byte estimates that
    landed past the target or on a non-keyframe (lost frames, MPEG-2 frames without their references)."""
    path = long_clips[muxer]
    out = load_video(path, tile_size=16, max_frames=8, backend=backend, **HALF)
    assert out.frame_indices == [0, 128, 256, 385, 513, 642, 770, 899] and not out.partial
    assert np.allclose(_rgb(out)[:, 0], [(8 * i) % 256 for i in out.frame_indices], atol=6)
    _assert_times_are_the_containers(out, path)


@pytest.mark.parametrize("backend", BACKENDS)
def test_2_audio_stream_first(tmp_path, backend):
    """Stream 0 is audio: the video stream (index 1) is the one probed and decoded."""
    path = str(tmp_path / "av.mkv")
    with av.open(path, "w") as c:
        audio = c.add_stream("aac", rate=16000)
        v = c.add_stream("libx264", rate=10, options={"preset": "ultrafast"})
        v.width, v.height, v.pix_fmt = 64, 48, "yuv420p"
        for i in range(20):
            for packet in v.encode(av.VideoFrame.from_ndarray(np.full((48, 64, 3), 8 * i, np.uint8), "rgb24")):
                c.mux(packet)
        for packet in v.encode():
            c.mux(packet)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
        frame.sample_rate = 16000
        for packet in [*audio.encode(frame), *audio.encode()]:
            c.mux(packet)
    out = load_video(path, tile_size=16, backend=backend, **HALF)
    assert out.metadata.stream_index == 1 and out.num_frames == 20
    assert np.allclose(_rgb(out)[:, 0], [8 * i for i in out.frame_indices], atol=4)
    _assert_times_are_the_containers(out, path, 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_2_nonzero_start_time(tmp_path, backend):
    """A stream whose first frame is at 2 s (an MP4 start delay): times count from the first displayed frame."""
    tb = fractions.Fraction(1, 25)
    path = make_video(tmp_path / "late.mp4", frames=40, fps=25, pts_list=list(range(50, 90)), time_base=tb)
    with av.open(path) as c:
        assert c.streams.video[0].start_time > 0
    out = load_video(path, tile_size=16, backend=backend, **HALF)
    assert out.num_frames == 40 and out.presentation_times_s[0] == 0.0
    _assert_times_are_the_containers(out, path)
    assert np.allclose(_rgb(out)[:, 0], [(8 * i) % 256 for i in out.frame_indices], atol=4)


# --- 3. discard-flagged packets --------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_3_discarded_packets_are_not_frames(tmp_path, backend):
    """30 packets written with pts -5..24: the MP4 edit list makes the demuxer flag the first 5 (the first
    keyframe among them) discard; 25 frames are displayed, the first being written frame 5."""
    tb = fractions.Fraction(1, 25)
    path = make_video(tmp_path / "edit.mp4", frames=30, fps=25, pts_list=list(range(-5, 25)), time_base=tb)
    with av.open(path) as c:
        flags = [p.is_discard for p in c.demux(c.streams.video[0]) if p.size]
    assert flags[:5] == [True] * 5 and not any(flags[5:]) and len(flags) == 30
    out = load_video(path, tile_size=16, target_fps=25, backend=backend, **HALF)
    assert out.num_frames == 25 and out.frame_indices == list(range(25)) and not out.partial
    assert np.allclose(_rgb(out)[:, 0], [8 * (i + 5) for i in out.frame_indices], atol=4)
    _assert_times_are_the_containers(out, path)
    assert out.timestamps_s[24] == pytest.approx(0.96)
    if backend == "decord":
        assert out.backend == "pyav" and "30 frames" in out.backend_note


# --- 4. display-matrix rotation ---------------------------------------------------------------------------------

ROTATIONS = [(90, False), (-90, False), (180, False), (90, True), (0, True), (270, True)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("degrees,hflip", ROTATIONS)
def test_4_rotation_applied_whatever_the_backend(tmp_path, backend, degrees, hflip):
    path = make_video(tmp_path / "rot.mp4", frames=4, fps=4, size=(64, 48), marker=True, rotation=degrees,
                      hflip=hflip)
    out = load_video(path, tile_size=32, backend=backend, **HALF)
    stored = np.full((48, 64, 3), 0, np.uint8)  # frame 0 as written: grey 0, red block at the top-left
    stored[:8, :8] = (255, 0, 0)
    shown = np.rot90(stored, k=(degrees // 90) % 4)  # PyAV: counter-clockwise degrees, then the mirror
    shown = np.fliplr(shown) if hflip else shown
    want = np.asarray(Image.fromarray(np.ascontiguousarray(shown)).resize((32, 32), Image.Resampling.BICUBIC))
    got = ((out.pixel_values[0] * 0.5 + 0.5) * 255).permute(1, 2, 0).numpy()
    assert np.abs(got - want).mean() < 4, (degrees, hflip)
    assert _red_corner(got) == _red_corner(want)


def _red_corner(a) -> int:
    """Which quadrant (0 top-left, 1 top-right, 2 bottom-left, 3 bottom-right) holds the red marker."""
    red = a[..., 0].astype(float) - a[..., 1]
    h, w = red.shape[0] // 2, red.shape[1] // 2
    return int(np.argmax([red[:h, :w].mean(), red[:h, w:].mean(), red[h:, :w].mean(), red[h:, w:].mean()]))


# --- 5. prompt timestamps -----------------------------------------------------------------------------------------


def test_5_default_timestamps_are_the_presentation_times(tmp_path):
    path = make_video(tmp_path / "60.mp4", frames=150, fps=60, size=(32, 32))
    out = load_video(path, tile_size=16, backend="pyav", **HALF)
    assert out.frame_indices == [0, 37, 74, 111, 149]
    _assert_times_are_the_containers(out, path)
    assert out.timestamps_s[-1] == pytest.approx(149 / 60)  # 2.48 s in the prompt
    ref = load_video(path, tile_size=16, backend="pyav", timestamp_convention="reference", **HALF)
    assert ref.timestamps_s[-1] == pytest.approx(149 * 16 / 1000)  # 2.38 s: int(1000/60) = 16 ms per frame
    assert inspect.signature(Processor).parameters["timestamp_convention"].default == "exact"
    assert inspect.signature(load_video).parameters["timestamp_convention"].default == "exact"


# --- 9. the video path admits video containers and codecs only ---------------------------------------------------


def _image_files():
    im = Image.new("RGB", (32, 32), (10, 200, 30))
    files = {fmt: encode(im, fmt) for fmt in ("TIFF", "TGA", "DDS", "PNG", "JPEG", "BMP", "GIF", "WEBP", "ICO")}
    try:
        files["JPEG2000"] = encode(im, "JPEG2000")
    except (OSError, KeyError):  # Pillow built without OpenJPEG
        files["JPEG2000"] = b"\x00\x00\x00\x0cjP  \r\n\x87\n" + bytes(64)
    files["PSD"] = b"8BPS\x00\x01" + bytes(64)
    files["AVIF"] = b"\x00\x00\x00\x1cftypavif\x00\x00\x00\x00avifmif1miaf" + bytes(64)
    files["HEIC"] = b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic" + bytes(64)
    return files


@pytest.mark.parametrize("backend", BACKENDS)
def test_9_image_files_are_refused_on_the_video_path(tmp_path, backend):
    for fmt, data in _image_files().items():
        path = tmp_path / f"x.{fmt.lower()}"
        path.write_bytes(data)
        with pytest.raises(UnsupportedFormatError):
            load_video(str(path), backend=backend, **HALF)
        with pytest.raises(UnsupportedFormatError):
            load_video(data, backend=backend, isolate=True, **HALF)


@pytest.mark.parametrize("backend", BACKENDS)
def test_9_still_image_codecs_in_a_video_container_are_refused(tmp_path, backend):
    path = tmp_path / "png.mov"
    with av.open(str(path), "w") as c:
        s = c.add_stream("png", rate=1)
        s.width, s.height, s.pix_fmt = 16, 16, "rgb24"
        for p in s.encode(av.VideoFrame.from_ndarray(np.zeros((16, 16, 3), np.uint8), format="rgb24")):
            c.mux(p)
        for p in s.encode():
            c.mux(p)
    with pytest.raises(UnsupportedFormatError, match="'png'"):
        load_video(str(path), backend=backend, **HALF)


@pytest.fixture
def outside_segment(tmp_path):
    """An allowed root holding an HLS playlist and an ffconcat list that both name a .ts file outside it."""
    root, secret = tmp_path / "allowed", tmp_path / "secret"
    root.mkdir()
    secret.mkdir()
    segment = make_video(secret / "seg.ts", frames=25, fps=25, container_format="mpegts")
    concat = root / "list.ffconcat"
    concat.write_text(f"ffconcat version 1.0\nfile '{segment}'\n")
    return root, segment, hls_playlist(root, segment), str(concat)


@pytest.mark.parametrize("isolate", [False, True])
@pytest.mark.parametrize("backend", BACKENDS)
def test_9_playlists_and_lists_are_never_followed(outside_segment, backend, isolate):
    root, segment, playlist, concat = outside_segment
    for path in (playlist, concat):
        with pytest.raises(UnsupportedFormatError, match="never followed"):
            load_video(path, backend=backend, isolate=isolate, **HALF)
    proc = Processor.__new__(Processor)  # only the path check of the processor, no tokenizer needed
    proc.allowed_roots = [root.resolve()]
    assert proc._check_source(playlist) == playlist  # inside the root: the video path must refuse it
    with pytest.raises(RemoteMediaError):
        proc._check_source(segment)


def test_9_every_nested_open_goes_through_the_guard(outside_segment):
    """Even a demuxer that opens other files (HLS, forced here on purpose) only reaches them through the guard,
    which admits the top-level file alone."""
    _, segment, playlist, _ = outside_segment
    guard = video_formats.NestedOpenGuard(playlist)
    try:
        with av.open(playlist, format="hls", io_open=guard, options={"protocol_whitelist": "file"}) as c:
            list(c.demux())
    except (av.error.FFmpegError, OSError):
        pass  # the segment could not be opened: the point of the guard
    assert guard.refused and all(os.path.basename(segment) in url for url in guard.refused)


def test_9_sniffing_ignores_the_file_name(containers, tmp_path):
    named = tmp_path / "movie.m3u8"  # a real MPEG-PS file under a playlist's name decodes as MPEG-PS
    named.write_bytes(open(containers["mpeg_ps"], "rb").read())
    out = load_video(str(named), tile_size=16, backend="pyav", **HALF)
    assert out.metadata.container == "mpeg-ps" and out.num_frames == 90


# --- 10. issue 52: encrypted files, declared rates, hidden frames, streams without a decoder ----------------------


@pytest.mark.parametrize("isolate", [False, True])
@pytest.mark.parametrize("backend", BACKENDS)
def test_10_cenc_mp4_is_refused(tmp_path, backend, isolate):
    """A Common Encryption MP4 (FFmpeg's muxer, AES-CTR) decoded to garbage that differed from run to run and
    came back OK (or, with these flat frames, as corrupt_media). Refused by one code, before decoding."""
    path = make_cenc_mp4(tmp_path / "cenc.mp4", frames=30, fps=10, size=(160, 120), noise=True)
    with pytest.raises(EncryptedMediaError, match="'encv' sample entry"):
        load_video(path, backend=backend, isolate=isolate, **HALF)


def test_10_cenc_packets_are_refused_without_the_box_scan(tmp_path, monkeypatch):
    """The second signal on its own: packets that carry encryption side data (what FFmpeg attaches to CENC
    samples it was given no key for) refuse the file in the index pass."""
    path = make_cenc_mp4(tmp_path / "cenc.mp4", frames=10, fps=10)
    monkeypatch.setattr(video_formats, "encryption_box", lambda path: "")
    with pytest.raises(EncryptedMediaError, match="packets carry encryption data"):
        load_video(path, backend="pyav", **HALF)


@pytest.mark.parametrize("backend", BACKENDS)
def test_10_matroska_content_encryption_is_refused_by_the_same_code(tmp_path, backend):
    path = make_video(tmp_path / "clear.mkv", frames=20, fps=10, container_format="matroska")
    assert load_video(path, backend=backend, tile_size=16, **HALF).num_frames == 20
    encrypt_matroska_header(path)
    with pytest.raises(EncryptedMediaError, match="Matroska ContentEncryption") as refused:
        load_video(path, backend=backend, **HALF)
    assert refused.value.code == "encrypted_media"


def test_10_mp4_box_scan_finds_every_marker(tmp_path):
    """`encryption_box` on the real CENC file, on a clear one, and on boxes it must find inside moov/moof."""
    cenc = make_cenc_mp4(tmp_path / "cenc.mp4", frames=5, fps=5)
    assert video_formats.encryption_box(cenc) == "an 'encv' sample entry"
    assert video_formats.encryption_box(make_video(tmp_path / "clear.mp4", frames=5, fps=5)) == ""

    def box(kind, body=b""):
        return struct.pack(">I4s", 8 + len(body), kind) + body

    for layout, found in [(box(b"moov", box(b"pssh", b"x" * 20)), "a 'pssh' box"),
                          (box(b"moof", box(b"traf", box(b"senc", b"x" * 8))), "a 'senc' box"),
                          (box(b"moov", box(b"trak", box(b"mdia", box(b"minf", box(b"stbl", box(
                              b"stsd", b"\0" * 8 + box(b"enca", b"\0" * 28))))))), "an 'enca' sample entry")]:
        (tmp_path / "boxes.mp4").write_bytes(box(b"ftyp", b"isom\0\0\0\0") + layout + box(b"mdat", b"\0" * 16))
        assert video_formats.encryption_box(str(tmp_path / "boxes.mp4")) == found


# declared rate, container: some MKV/FLV files declare 1000 or 60 fps for frames 1/30 s apart
WRONG_RATES = [(1000, "matroska"), (60, "matroska"), (60, "flv")]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("declared,muxer", WRONG_RATES)
def test_10_sampling_follows_presentation_times_not_the_declared_rate(tmp_path, declared, muxer, backend):
    """A 30 s clip of frames every 1/30 s sampled at 2 fps is 60 frames 0.5 s apart, whatever rate the header
    declares (trusting it took 1 frame of 30 s at 1000 fps, 30 at 60 fps)."""
    tb = fractions.Fraction(1, 1000)
    path = make_video(tmp_path / f"wrong.{muxer}", frames=900, fps=declared, size=(32, 24), time_base=tb,
                      pts_list=[round(i * 1000 / 30) for i in range(900)], container_format=muxer)
    with av.open(path) as c:
        assert float(c.streams.video[0].average_rate) == declared  # the file does declare the wrong rate
    out = load_video(path, backend=backend, tile_size=16, **HALF)
    assert out.num_frames == 900 and len(out.frame_indices) == 60 and out.fps == pytest.approx(30.0)
    _assert_times_are_the_containers(out, path)
    assert np.allclose(np.diff(out.timestamps_s), 0.5, atol=0.035)  # linspace over 900 frames: within a frame
    assert np.allclose(_rgb(out)[:, 0], [(8 * i) % 256 for i in out.frame_indices], atol=4)


@pytest.mark.skipif("libvpx-vp9" not in av.codecs_available, reason="this PyAV build has no libvpx-vp9 encoder "
                    "to write the VP9 file with hidden frames")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("separate", [True, False], ids=["own-packets", "superframes"])
def test_10_vp9_hidden_frames_are_not_counted_or_timed(tmp_path, separate, backend):
    """VP9 alt-ref (hidden) frames stored in packets of their own were counted as frames (80 where 72 are shown),
    so the sampled times drifted. Only shown frames count, are sampled and are timed; superframes (hidden and
    shown frame in one packet) are one frame."""
    path = make_vp9_with_hidden_frames(tmp_path / "hidden.webm", separate=separate)
    with av.open(path) as c:
        assert sum(1 for p in c.demux(video=0) if p.size) == (80 if separate else 72)
    with av.open(path) as c:
        shown = [f.pts for f in c.decode(video=0)]
    assert len(shown) == 72
    out = load_video(path, backend=backend, tile_size=16, target_fps=6, **HALF)  # 3 s at 6 fps: 18 frames
    assert out.num_frames == 72 and len(out.frame_indices) == 18 and not out.partial
    base = shown[0]
    assert out.presentation_times_s == pytest.approx([(shown[i] - base) / 1000 for i in out.frame_indices])
    assert np.allclose(_rgb(out)[:, 0], [(8 * i) % 256 for i in out.frame_indices], atol=4)


def test_10_shown_frame_bits():
    """VP8 frame tag (RFC 6386 §9.1) and VP9 uncompressed header (spec §6.2), profiles 0 and 3, superframes."""
    assert video_formats.displayed("vp8", bytes([0x10, 0, 0])) and not video_formats.displayed("vp8", bytes(3))
    key, hidden_key = bytes([0b10000010, 0x49]), bytes([0b10000000, 0x49])
    assert video_formats.displayed("vp9", key) and not video_formats.displayed("vp9", hidden_key)
    assert video_formats.displayed("vp9", bytes([0b10001000]))  # show_existing_frame
    assert not video_formats.displayed("vp9", bytes([0b10110010]))  # profile 3: reserved bit, key, hidden
    assert video_formats.displayed("vp9", bytes([0b10110001]))  # profile 3, shown
    assert video_formats.displayed("vp9", vp9_superframe([hidden_key, key]))
    assert not video_formats.displayed("vp9", vp9_superframe([hidden_key, hidden_key]))
    assert video_formats.displayed("h264", b"")  # other codecs: a packet is a frame


def test_10_a_stream_without_a_decoder_is_unsupported_format(tmp_path):
    """An untyped AttributeError ('NoneType' object has no attribute 'codec') when FFmpeg has no decoder for the
    stream (issue 52: a Dolby Vision AV1 track). Here the Matroska codec id names a codec nobody has."""
    data = open(make_video(tmp_path / "v.mkv", frames=5, fps=5, container_format="matroska"), "rb").read()
    assert data.count(b"V_MPEG4/ISO/AVC") == 1
    (tmp_path / "unknown.mkv").write_bytes(data.replace(b"V_MPEG4/ISO/AVC", b"V_MPEG4/ISO/XYZ"))
    with av.open(str(tmp_path / "unknown.mkv")) as c:
        assert c.streams.video[0].codec_context is None  # PyAV has no decoder for it
    for isolate in (False, True):
        with pytest.raises(UnsupportedFormatError, match="no decoder here"):
            load_video(str(tmp_path / "unknown.mkv"), isolate=isolate, **HALF)
