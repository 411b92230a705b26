"""Untrusted video -> uniformly sampled frames, one normalized 512 px tile each, with timestamps.

Follows docs/format.md §9.1-9.3: sample at `target_fps` (default 2) capped at `max_frames` (default 128)
uniformly spaced frames; one tile per frame, squash-resized to S x S (aspect ratio not kept, no thumbnail);
the same bicubic resampling and `(x/255 - mean)/std` as images.py. Index choice follows vLLM's loader:
`n = clamp(floor(duration * target_fps), 1, max_frames)`, all frames when `n == num_frames`, else
`linspace(0, num_frames - 1, n)` truncated to int. vLLM's `duration = num_frames / fps` trusts the declared rate;
here the duration comes from the frames' presentation times (docs/video.md, "Frame rate and sampling"), which is
the same for an honest constant-rate file.

Timestamps (docs/video.md, "Timestamps"): by default ("exact") the prompt states the presentation time of the
frame actually shown, from the container's own pts, relative to the first displayed frame; exact for variable
frame rates too. `timestamp_convention="reference"` reproduces the public reference processors
(`index * int(1000 / fps) / 1000`, transformers `nemotron_h_omni` and vLLM `nano_nemotron_vl`), which drift
(frame 300 of a 30 fps clip is 9.90 s, not 10.00 s). The prompt text is built in chat.py.

Order of checks (docs/reliability_policy.md §0, §1.3): byte cap -> container sniffed and allowlisted
(video_formats.py: forced demuxer, file protocol only, no nested opens) -> header of the best video stream
(the one libavformat picks; no video stream, codec, encryption, resolution, duration, header frame count) ->
index pass over that stream's packets (presentation times of displayed frames: packets flagged discard, e.g.
cut by an MP4 edit list, and VP8/VP9 hidden frames are not frames; encrypted packets refuse the file; capped by
`max_video_frames`) -> decode only the sampled frames of that same stream. Every probe, cap and decode uses that
one stream, and one deadline (`MediaLimits.video_timeout_s`) bounds them all, in-process too.

Backends: decord (default, as the design names it) and PyAV. decord decodes whichever stream it likes, ignores
discard flags, mis-seeks some containers (MPEG-PS, MPEG-TS) and breaks 90-degree rotations, so it is used only
when the file is one it handles (`_decord_refusal`) and its output agrees with the container index (frame count,
per-frame timestamps, frame shape); otherwise the same call decodes with PyAV and says why in `backend_note`.
PyAV applies the display matrix (rotation/flip) as the `ffmpeg` command line does. decord can abort or segfault
the interpreter on bad streams (decord #25, #229), so servers should pass `isolate=True` (sandbox.py). Frames
the decoder cannot deliver (truncated files) are dropped and flagged `partial=True`; zero frames is an error.

Progress and stop (vl/processing/progress.py): both backends report "video frames decoded" i/n to the current
`Work` after each sampled frame, and a stop takes effect there, before the next frame is decoded. In a sandbox
worker the reports travel to the caller's `Work` (sandbox.py), whose stop kills the worker.
"""

import math
import os
import tempfile
import time
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from PIL import Image

from vl.errors import (
    CorruptMediaError,
    DecoderResourceError,
    DecodeTimeoutError,
    EncryptedMediaError,
    MediaTooLargeError,
    NoVideoStreamError,
    RemoteMediaError,
    VLError,
)
from vl.processing import video_formats
from vl.processing.images import RESAMPLE, normalize
from vl.processing.limits import DEFAULT_LIMITS, MediaLimits
from vl.processing.progress import Work
from vl.processing.sandbox import run_isolated

BACKENDS = ("decord", "pyav")
FRAMES_DECODED = "video frames decoded"  # the progress label, (frames decoded so far, frames sampled)
DECORD_CONTAINERS = ("mp4", "matroska")  # magic bytes no other demuxer outranks; decord checked correct on them
_SEEK_GAP_FRAMES = 64  # PyAV: seek (to the keyframe before the target) instead of decoding through a larger gap
# containers whose seeks land on the keyframe before the target (an index: MP4 sample tables, Matroska cues, AVI
# idx1; FLV and Ogg checked too). MPEG-PS/TS seeks are byte estimates: they land after the target (frames lost)
# or on a non-keyframe (MPEG-2 frames decoded without their references), so those files are decoded straight
# through (tests/processing/test_video_real_files.py, sparse sampling)
_SEEKABLE_CONTAINERS = ("mp4", "matroska", "avi", "flv", "ogg")
_DECODE_BATCH_BYTES = 256 << 20  # decord get_batch size: at most this much full-resolution RGB at once
_DECODER_THREADS = 4  # bounded so that a decode's threads and memory do not grow with the core count
_RATE_AGREEMENT = 0.01  # a declared frame rate within 1 % of the presentation times' rate is the rate used
_now = time.monotonic  # the clock of the decode deadline (tests count with their own)


@dataclass(frozen=True)
class VideoMetadata:
    width: int  # coded size of the decoded stream (before any display rotation)
    height: int
    fps: float | None  # container's average frame rate; None when missing or absurd
    duration_s: float | None
    header_frames: int  # as declared by the container (0 = not declared); never trusted for indexing
    codec: str
    container: str = ""  # sniffed container (video_formats.CONTAINERS)
    stream_index: int = 0  # the best video stream: probed, capped and decoded
    video_streams: int = 1  # video streams in the file


@dataclass
class VideoFrames:
    pixel_values: "object"  # torch.FloatTensor (T, 3, S, S), one tile per frame
    frame_indices: list[int]  # source frame numbers (0-based, presentation order, displayed frames only)
    timestamps_s: list[float]  # by `timestamp_convention`: the frames' presentation times by default
    presentation_times_s: list[float]  # container pts of the frames shown, relative to the first displayed frame
    fps: float  # source fps used for sampling (and for the "reference" timestamps)
    num_frames: int  # displayed frames found by the index pass (real count, not the header's)
    metadata: VideoMetadata
    partial: bool  # some sampled frames could not be decoded (truncated/corrupt stream)
    backend: str  # the backend that decoded the frames
    backend_note: str = ""  # why decord was not used when it was asked for


def sample_frame_indices(num_frames: int, fps: float, target_fps: float = 2.0, max_frames: int = 128,
                         duration_s=None) -> list[int]:
    """Uniform frame indices at `target_fps`, at most `max_frames`, always within [0, num_frames).

    `duration_s` (a Fraction, exact) is how long the frames last by their presentation times; without it the
    duration is `num_frames / fps`, the reference's formula, which trusts the frame rate."""
    if num_frames <= 0 or not fps > 0:
        raise ValueError(f"need num_frames > 0 and fps > 0, found {num_frames}, {fps}")
    duration = Fraction(num_frames) / Fraction(fps) if duration_s is None else Fraction(duration_s)
    n = max(1, min(math.floor(duration * Fraction(target_fps)), max_frames, num_frames))
    if n == num_frames:
        return list(range(num_frames))
    return np.linspace(0, num_frames - 1, n, dtype=int).tolist()


def frame_timestamps(indices, fps: float, convention: str = "exact") -> list[float]:
    """Timestamps from frame numbers alone (constant frame rate). load_video's "exact" uses the pts instead."""
    if convention == "exact":
        return [i / fps for i in indices]
    if convention == "reference":
        frame_duration_ms = int(1000 / fps)
        return [i * frame_duration_ms / 1000 for i in indices]
    raise ValueError(f"timestamp_convention must be 'exact' or 'reference', found {convention!r}")


def _av_errors():
    """What PyAV raises for a file it cannot read. `av.error.MemoryError` (ENOMEM) is one of them but is never
    the file's verdict: every handler re-raises `MemoryError` first, so a memory cap is never called corruption."""
    import av

    return (av.error.FFmpegError, OSError, ValueError, IndexError, EOFError)


class _Deadline:
    """The decode deadline, `MediaLimits.video_timeout_s` from the start of the decode, checked between packets
    and frames (in-process as in a sandbox worker, whose parent also kills it at the same time)."""

    def __init__(self, seconds: float):
        self.seconds, self.end = seconds, _now() + seconds

    def check(self, where: str) -> None:
        if _now() > self.end:
            raise DecodeTimeoutError(
                f"decoding the video did not finish within {self.seconds:g} s (MediaLimits.video_timeout_s) and was "
                f"stopped {where}; send a shorter or smaller video, or raise the limit."
            )


def probe_video(path: str, limits: MediaLimits = DEFAULT_LIMITS) -> VideoMetadata:
    """Container header only (PyAV), checked against `limits` before anything is decoded.

    The container must pass video_formats' allowlist; the stream described is the best video stream, the one
    every later step decodes."""
    import av

    try:
        container, name = video_formats.open_video(path)
        with container:
            stream = video_formats.best_video_stream(container)
            if stream is None:
                kinds = sorted({s.type for s in container.streams}) or ["none"]
                raise NoVideoStreamError(
                    f"expected a video stream, found only {'/'.join(kinds)} streams; send a file with video."
                )
            codec = video_formats.check_codec(stream)
            video_formats.check_not_encrypted(path, name, stream)
            ctx = stream.codec_context
            rate = stream.average_rate or stream.guessed_rate or stream.base_rate
            fps = float(rate) if rate else None
            duration = None
            if stream.duration and stream.time_base:
                duration = float(stream.duration * stream.time_base)
            elif container.duration:
                duration = container.duration / av.time_base
            meta = VideoMetadata(ctx.width, ctx.height, fps if fps and 0 < fps <= 1000 else None,
                                 duration or None, int(stream.frames or 0), codec, name, stream.index,
                                 len(container.streams.video))
    except (VLError, MemoryError):
        raise
    except _av_errors() as e:
        raise CorruptMediaError(f"cannot open the video ({_describe(e)}); re-encode it.") from None
    _check_metadata(meta, limits)
    return meta


def _describe(e: BaseException) -> str:
    """Error text without file paths (FFmpeg errors carry the file name; clients must not see server paths)."""
    return f"{type(e).__name__}: {getattr(e, 'strerror', None) or 'unreadable'}"


def _check_metadata(meta: VideoMetadata, limits: MediaLimits) -> None:
    if meta.width <= 0 or meta.height <= 0:
        raise CorruptMediaError(f"expected a positive frame size, found {meta.width}x{meta.height}.")
    _check_frame_size(meta.width, meta.height, limits)
    if meta.duration_s is not None and meta.duration_s > limits.max_video_duration_s:
        raise MediaTooLargeError(
            f"video too long: {meta.duration_s:.0f} s, the cap is {limits.max_video_duration_s:.0f} s; cut it."
        )
    if meta.header_frames > limits.max_video_frames:
        raise MediaTooLargeError(
            f"video declares {meta.header_frames} frames, the cap is {limits.max_video_frames}; cut it."
        )


def _check_frame_size(width: int, height: int, limits: MediaLimits) -> None:
    if width * height > limits.max_video_frame_pixels:
        raise MediaTooLargeError(
            f"video frames too large: {width}x{height}, the cap is {limits.max_video_frame_pixels:,} "
            "pixels per frame; downscale the video."
        )


def _to_tile(image: Image.Image, tile_size) -> np.ndarray:
    image = image if image.mode == "RGB" else image.convert("RGB")
    if callable(tile_size):  # the caller's own per-frame resize (omni_video.py: aspect-kept, normalised float)
        return tile_size(image)
    return np.asarray(image.resize((tile_size, tile_size), RESAMPLE))  # squash: aspect ratio not kept


def _pts_duration(pts_sorted, time_base) -> Fraction | None:
    """How long the displayed frames last by their presentation times (exact): first to last, plus the median
    interval for the last frame's own display time. None for a single frame."""
    gaps = sorted(b - a for a, b in zip(pts_sorted, pts_sorted[1:]) if b > a)
    if not gaps:
        return None
    return (pts_sorted[-1] - pts_sorted[0] + gaps[len(gaps) // 2]) * Fraction(time_base)


def _sampling_rate(declared: float | None, num_frames: int, duration: Fraction | None) -> float | None:
    """The frame rate the frames' presentation times show; the declared one only when it agrees within 1 %
    (then it is exact, e.g. 30.0 for a Matroska file's millisecond times). Some MKV/FLV files declare 1000 or
    60 fps for frames 1/30 s apart: trusting them samples a 60 s clip at 2 fps as 3 frames instead of 120."""
    if duration is None:
        return declared
    measured = float(num_frames / duration)
    if declared and abs(declared - measured) <= _RATE_AGREEMENT * measured:
        return declared
    return measured


@dataclass
class _Index:
    pts: list[int]  # sorted presentation times of the displayed frames, in stream time_base units
    time_base: object  # fractions.Fraction
    partial: bool  # the packet walk stopped at an unreadable tail


def _stream(container, meta: VideoMetadata):
    return container.streams[meta.stream_index]


def index_video(path: str, meta: VideoMetadata, limits: MediaLimits, deadline: _Deadline | None = None) -> _Index:
    """Packets only, no decoding: the presentation times of the frames a player would display.

    Packets flagged discard (AV_PKT_FLAG_DISCARD: cut by an MP4 edit list, for example) are decoded by FFmpeg
    for reference but never output, so they are not frames here either; nor are VP8/VP9 packets that hold only
    hidden frames (alt-ref: decoded for reference, never shown). A packet carrying encryption side data (MP4
    Common Encryption) refuses the file.
    """
    partial = False
    pts = []
    deadline = deadline or _Deadline(limits.video_timeout_s)
    container, _ = video_formats.open_video(path)
    with container:
        stream = _stream(container, meta)
        time_base = stream.time_base
        try:
            for packet in container.demux(stream):
                deadline.check("while indexing its frames")
                if packet.size == 0 or packet.is_discard:
                    continue
                if packet.has_sidedata("encryption_info") or packet.has_sidedata("encryption_init_info"):
                    raise EncryptedMediaError(video_formats.ENCRYPTED_MESSAGE.format(what="packets carry "
                                                                                     "encryption data"))
                if not video_formats.displayed(meta.codec, packet):
                    continue
                stamp = packet.pts if packet.pts is not None else packet.dts
                if stamp is not None:
                    pts.append(stamp)
                if len(pts) > limits.max_video_frames:
                    raise MediaTooLargeError(
                        f"video has more than {limits.max_video_frames} frames (cap); cut it or lower its fps."
                    )
        except (VLError, MemoryError):
            raise
        except _av_errors():
            partial = True  # unreadable tail: index what was readable
    pts.sort()
    if not pts:
        raise CorruptMediaError("the video stream has no readable frames; re-encode it.")
    return _Index(pts, time_base, partial)


def _decode_pyav(path, meta, limits, tile_size, index, indices, deadline: _Deadline | None = None):
    wanted = [index.pts[i] for i in indices]
    position = {p: k for k, p in enumerate(index.pts)}
    container, _ = video_formats.open_video(path)  # decode pass, fresh demuxer state
    with container:
        stream = _stream(container, meta)
        stream.thread_type = "AUTO"
        stream.thread_count = _DECODER_THREADS
        gap = _SEEK_GAP_FRAMES if meta.container in _SEEKABLE_CONTAINERS else len(index.pts)  # no seeks
        got, partial = _decode_wanted(container, stream, sorted(set(wanted)), position, tile_size, limits,
                                      index.partial, gap, Work.current(), deadline)
    kept = [i for i, p in zip(indices, wanted) if p in got]
    return kept, got.stacked([index.pts[i] for i in kept]), partial


class _FrameStack:
    """Tiles copied, as they are decoded, into one array allocated at the first for every sampled frame: frames are
    never held one by one and stacked at the same time (80 normalised Omni frames are 250 MB of float32), and no
    frame-sized blocks are left between the decode's temporaries in the heap. Keyed by frame (pts or position)."""

    def __init__(self, capacity: int):
        self.capacity, self.array, self.slots = capacity, None, {}

    def __len__(self) -> int:
        return len(self.slots)

    def __contains__(self, key) -> bool:
        return key in self.slots

    def put(self, key, tile) -> None:
        tile = np.asarray(tile)
        if self.array is None:
            self.array = np.empty((self.capacity,) + tile.shape, tile.dtype)
        if tile.shape != self.array.shape[1:] or tile.dtype != self.array.dtype:
            raise ValueError(f"frame tiles must share one shape and dtype: {tile.dtype} {tile.shape} after "
                             f"{self.array.dtype} {self.array.shape[1:]}")
        self.array[len(self.slots)] = tile
        self.slots[key] = len(self.slots)

    def stacked(self, keys) -> np.ndarray | None:
        """The tiles of `keys`, in that order: a view where that is the order they came in (None: no tile)."""
        rows = [self.slots[k] for k in keys]
        if self.array is None or not rows:
            return None
        return self.array[:len(rows)] if rows == list(range(len(rows))) else self.array[rows]


class _Display:
    """How frames are shown: the display matrix of the first decoded frame (the one the `ffmpeg` command line
    configures its auto-rotation from), read once. Reading a frame's side data ties the frame and its side data
    in a reference cycle that only the garbage collector frees, so it is done once per decode, not per frame."""

    def __init__(self):
        self.transpose, self.known = None, False

    def tile(self, frame, tile_size: int, limits: MediaLimits) -> np.ndarray:
        """Decoded frame -> tile; the frame-size cap applies to what was decoded (a stream may change resolution
        after its header)."""
        _check_frame_size(frame.width, frame.height, limits)
        if not self.known:
            self.transpose = video_formats.display_transpose(video_formats.frame_display_matrix(frame))
            self.known = True
        # one conversion thread: swscale's default starts a thread pool per frame, sized by the core count
        image = frame.to_image(threads=1)
        if self.transpose is not None:
            image = image.transpose(self.transpose)
        return _to_tile(image, tile_size)


def _decode_wanted(container, stream, wanted, position, tile_size, limits, partial, seek_gap=_SEEK_GAP_FRAMES,
                   work: Work | None = None, deadline: _Deadline | None = None):
    """Decode the frames whose pts are in `wanted` (sorted), seeking over gaps larger than `seek_gap` frames.

    A seek happens at most once per target and only between frames the index knows, so odd pts (edit lists,
    decoder-invented timestamps) fall back to plain sequential decoding instead of looping. Each decoded frame
    is reported to `work` ("video frames decoded" i/n), which is also where a stop takes effect; the deadline
    is checked after every frame the decoder delivers, wanted or not.
    """
    work = work or Work()
    deadline = deadline or _Deadline(limits.video_timeout_s)
    display = _Display()
    got = _FrameStack(len(wanted))
    k, last, frames, seeked_for = 0, None, None, -1

    def far(k):
        here = -1 if last is None else position.get(last, position[wanted[k]])
        return position[wanted[k]] - here > seek_gap and seeked_for != k

    try:
        while k < len(wanted):
            if frames is None or far(k):
                if far(k):
                    container.seek(int(wanted[k]), stream=stream, backward=True, any_frame=False)
                    seeked_for = k
                frames = container.decode(stream)
            for frame in frames:
                deadline.check(f"after {len(got)} of {len(wanted)} sampled frames")
                if frame.pts is None:
                    continue
                last = frame.pts
                while k < len(wanted) and wanted[k] < last:
                    k, partial = k + 1, True  # the decoder never delivered it
                if k < len(wanted) and wanted[k] == last:
                    got.put(last, display.tile(frame, tile_size, limits))
                    k += 1
                    work.report(FRAMES_DECODED, len(got), len(wanted))
                if k >= len(wanted) or far(k):
                    break
            else:
                partial = partial or k < len(wanted)
                break
    except (VLError, MemoryError):
        raise
    except _av_errors():
        partial = True
    return got, partial


def _decord_refusal(path: str, meta: VideoMetadata) -> str:
    """Why decord must not decode this file ("" when it may)."""
    if meta.container not in DECORD_CONTAINERS:
        return (f"decord is not used for {meta.container} files (it returns wrong frames from MPEG-PS and MPEG-TS; "
                f"only {' and '.join(DECORD_CONTAINERS)} files are checked against it)")
    if meta.video_streams != 1:
        return f"the file has {meta.video_streams} video streams and decord cannot be told which one to decode"
    container, _ = video_formats.open_video(path)
    with container:
        try:
            frame = next(container.decode(_stream(container, meta)), None)
        except MemoryError:
            raise
        except _av_errors():
            frame = None
    matrix = None if frame is None else video_formats.frame_display_matrix(frame)
    del frame  # with its side data it is a reference cycle; see _Display
    if video_formats.display_transpose(matrix) is not None:
        return "the stream has a rotation/flip display matrix, which decord does not apply correctly"
    return ""


def _import_decord():
    """decord, or `DecoderResourceError`: a library that does not load (a failed `dlopen`, a half-imported
    module) is this machine's fault, not the file's."""
    try:
        import decord

        return decord, (RuntimeError, decord._ffi.base.DECORDError)
    except (ImportError, OSError, AttributeError) as e:
        raise DecoderResourceError(
            f"the decord video library could not be loaded ({type(e).__name__}: {e}); the file was not read; "
            "retry (a sandboxed decoder is replaced), or decode with backend='pyav'."
        ) from None


def _decode_decord(path, meta, limits, tile_size, index, indices, deadline: _Deadline | None = None):
    """decord's frames, or the reason they cannot be trusted (a str): its frame count, per-frame timestamps and
    frame shape must agree with the container index (each timestamp nearer to its own pts than to a
    neighbour's)."""
    decord, decord_errors = _import_decord()
    deadline = deadline or _Deadline(limits.video_timeout_s)
    try:
        reader = decord.VideoReader(path, ctx=decord.cpu(0), num_threads=_DECODER_THREADS)
    except decord_errors as e:
        return f"decord cannot open the video ({type(e).__name__})"
    try:
        n = len(reader)
        if n != len(index.pts):
            return f"decord counts {n} frames where the container displays {len(index.pts)}"
        first = float(reader.get_frame_timestamp([0])[0, 0])
        stamps = reader.get_frame_timestamp(indices)[:, 0].astype(np.float64) - first
        pts_s = _pts_seconds(index, range(len(index.pts)))
        for i, t in zip(indices, stamps):
            gaps = [abs(pts_s[j] - pts_s[i]) for j in (i - 1, i + 1) if 0 <= j < len(pts_s)]
            tolerance = max(min(gaps) / 2 if gaps else 1.0, 1e-6)
            if not (math.isfinite(t) and abs(t - pts_s[i]) < tolerance):
                return (f"decord places frame {i} at {t:.3f} s where the container says {pts_s[i]:.3f} s")
        tiles, work = _FrameStack(len(indices)), Work.current()
        # watched: one frame per call, so that progress is per frame and a stop comes before the next frame
        # (decord seeks per index inside a batch anyway, so single-frame calls decode the same frames)
        step = 1 if work.watched else max(1, min(32, _DECODE_BATCH_BYTES // (3 * meta.width * meta.height)))
        for start in range(0, len(indices), step):
            deadline.check(f"after {len(tiles)} of {len(indices)} sampled frames")
            batch = reader.get_batch(indices[start : start + step]).asnumpy()  # (b, H, W, 3)
            if batch.shape[1:] != (meta.height, meta.width, 3):
                return f"decord decoded frames of shape {batch.shape[1:]}, the stream is {meta.width}x{meta.height}"
            for a in batch:
                tiles.put(len(tiles), _to_tile(Image.fromarray(a), tile_size))
            del batch
            work.report(FRAMES_DECODED, len(tiles), len(indices))
    except decord_errors as e:
        return f"decord failed to decode the video ({type(e).__name__})"
    finally:
        del reader
    return indices, tiles.stacked(range(len(indices))), index.partial


def _pts_seconds(index: _Index, which) -> list[float]:
    return [float((index.pts[i] - index.pts[0]) * index.time_base) for i in which]


def decode_video_file(path: str, limits: MediaLimits, tile_size: int, target_fps: float, max_frames: int, backend: str):
    """Probe, check, index and decode; returns plain data (uint8 tiles) so it can run in a sandbox worker."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, found {backend!r}")
    deadline = _Deadline(limits.video_timeout_s)
    meta = probe_video(path, limits)
    try:
        index = index_video(path, meta, limits, deadline)
    except (VLError, MemoryError):
        raise
    except _av_errors() as e:
        raise CorruptMediaError(f"cannot read the video ({_describe(e)}); re-encode it.") from None
    duration = _pts_duration(index.pts, index.time_base)
    fps = _sampling_rate(meta.fps, len(index.pts), duration)
    if not fps:
        raise CorruptMediaError("the video declares no frame rate and it cannot be measured; re-encode it.")
    if duration is not None and duration > limits.max_video_duration_s:
        raise MediaTooLargeError(f"video too long: its frames span {float(duration):.0f} s, the cap is "
                                 f"{limits.max_video_duration_s:.0f} s; cut it.")
    indices = sample_frame_indices(len(index.pts), fps, target_fps, max_frames, duration)
    note, result = "", None
    if backend == "decord":
        try:
            note = _decord_refusal(path, meta)
        except MemoryError:
            raise
        except _av_errors() as e:
            note = f"PyAV could not read the first frame ({_describe(e)})"
        if not note:
            result = _decode_decord(path, meta, limits, tile_size, index, indices, deadline)
            if isinstance(result, str):
                note, result = result, None
    if result is None:
        try:
            result = _decode_pyav(path, meta, limits, tile_size, index, indices, deadline)
        except (VLError, MemoryError):
            raise
        except _av_errors() as e:
            raise CorruptMediaError(f"cannot decode the video ({_describe(e)}); re-encode it.") from None
    kept, tiles, partial = result
    if not len(kept):
        raise CorruptMediaError("none of the sampled video frames could be decoded; the file is corrupt.")
    return {"indices": kept, "tiles": tiles, "pts_s": _pts_seconds(index, kept), "fps": fps,
            "num_frames": len(index.pts), "partial": partial, "metadata": meta,
            "backend": "pyav" if note or backend == "pyav" else "decord", "backend_note": note}


def load_video(
    source,
    *,
    norm_mean,
    norm_std,
    tile_size=512,  # int: square uint8 tiles, normalised here; or a picklable callable RGB frame -> final array
    target_fps: float = 2.0,
    max_frames: int = 128,
    backend: str = "decord",
    timestamp_convention: str = "exact",  # "exact": pts of the frame shown; "reference": see the docstring
    limits: MediaLimits = DEFAULT_LIMITS,
    isolate: bool = False,
) -> VideoFrames:
    """Untrusted video (local path, bytes or binary file object) -> `VideoFrames`.

    `isolate=True` runs probe + decode + resize in a sandbox worker with `limits.video_timeout_s` and
    `limits.worker_memory_mb`; normalization stays in this process. The same `video_timeout_s` deadline holds
    in-process (`DecodeTimeoutError`), and running out of memory there is `DecoderResourceError`.
    """
    import torch

    if not target_fps > 0 or max_frames < 1:
        raise ValueError(f"need target_fps > 0 and max_frames >= 1, found {target_fps}, {max_frames}")
    frame_timestamps([], 1.0, timestamp_convention)  # validate the name before any work
    with tempfile.TemporaryDirectory(prefix="vl-video-") as tmp:
        path = _local_path(source, limits, tmp)
        args = (path, limits, tile_size, target_fps, max_frames, backend)
        if isolate:
            out = run_isolated(decode_video_file, *args, timeout=limits.video_timeout_s,
                               memory_mb=limits.worker_memory_mb)
        else:
            try:
                out = decode_video_file(*args)
            except MemoryError:
                raise DecoderResourceError(
                    "this process ran out of memory while decoding the video; the file was not judged; send a "
                    "smaller video, or decode in a sandbox worker (isolate=True), which has its own memory cap."
                ) from None
    return VideoFrames(
        pixel_values=(torch.from_numpy(out["tiles"]) if callable(tile_size)  # the callable's arrays, as they are
                      else normalize(out["tiles"], norm_mean, norm_std)),  # (T, 3, S, S)
        frame_indices=out["indices"],
        timestamps_s=(list(out["pts_s"]) if timestamp_convention == "exact"
                      else frame_timestamps(out["indices"], out["fps"], timestamp_convention)),
        presentation_times_s=out["pts_s"],
        fps=out["fps"],
        num_frames=out["num_frames"],
        metadata=out["metadata"],
        partial=out["partial"],
        backend=out["backend"],
        backend_note=out["backend_note"],
    )


def _local_path(source, limits: MediaLimits, tmp: str) -> str:
    """A local file path for `source`; bytes and file objects are written into `tmp` (removed by the caller)."""
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if str(path).split(":", 1)[0].lower() in ("http", "https", "ftp", "rtsp", "rtmp", "data", "file"):
            raise RemoteMediaError(f"expected a local video file or bytes, found a URL ({str(path)[:40]!r}).")
        try:
            size = os.stat(path).st_size
        except OSError as e:
            raise CorruptMediaError(f"cannot read the video file: {e.strerror}; check the path.") from None
        if size > limits.max_video_bytes:
            raise MediaTooLargeError(_too_big(size, limits.max_video_bytes))
        if size == 0:
            raise CorruptMediaError("the video file is empty.")
        return path
    if hasattr(source, "read"):
        source = source.read(limits.max_video_bytes + 1)
    if not isinstance(source, (bytes, bytearray, memoryview)):
        raise TypeError(f"expected a path, bytes or a binary file object for the video, found {type(source)}")
    if len(source) > limits.max_video_bytes:
        raise MediaTooLargeError(_too_big(len(source), limits.max_video_bytes))
    if len(source) == 0:
        raise CorruptMediaError("the video file is empty.")
    path = os.path.join(tmp, "input")
    with open(path, "wb") as f:
        f.write(source)
    return path


def _too_big(size: int, cap: int) -> str:
    return f"the video is larger than the {cap / 2**20:.0f} MiB cap (found {size / 2**20:.1f} MiB); send a smaller file."
