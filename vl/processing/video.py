"""Untrusted video -> uniformly sampled frames, one normalized 512 px tile each, with timestamps.

Follows nemotron_nano_v2_vl.md §6.1-6.3: sample at `target_fps` (default 2) capped at `max_frames` (default 128)
uniformly spaced frames; one tile per frame, squash-resized to S x S (aspect ratio not kept, no thumbnail);
the same bicubic resampling and `(x/255 - mean)/std` as images.py. Index choice follows vLLM's loader:
`n = clamp(floor(duration * target_fps), 1, max_frames)` with `duration = num_frames / fps`, all frames when
`n == num_frames`, else `linspace(0, num_frames - 1, n)` truncated to int.

Timestamps: `timestamps_s[i] = frame_indices[i] / fps` (exact, "exact" convention, the default). The reference
prompt code uses `frame_duration_ms = int(1000 / fps)`, `t = index * frame_duration_ms / 1000` (§6.3), which
drifts (frame 300 of a 30 fps clip is 9.90 s, not 10.00 s); `timestamp_convention="reference"` reproduces it
for prompt-for-prompt parity with vLLM. `presentation_times_s` are the decoder's own pts, exact even for
variable-frame-rate files. The prompt text ("Frame {i} sampled at {t:.2f} seconds: ") is built in chat.py.

Order of checks (reliability_matrix.md §0, §1.3): byte cap -> container header via PyAV (no video stream,
resolution, duration, header frame count) -> index pass over packets (real frame count, capped by
`max_video_frames`; header counts are distrusted, e.g. stream-copied cuts) -> decode only the sampled frames.
Backends: decord (default, as the design names it) and PyAV; decord can abort or segfault the interpreter on bad
streams (decord #25, #229), so servers should pass `isolate=True` (sandbox.py) for untrusted files. Frames the
decoder cannot deliver (truncated files) are dropped and flagged `partial=True`; zero frames is an error.
"""

import math
import os
import tempfile
from dataclasses import dataclass

import numpy as np
from PIL import Image

from vl.errors import CorruptMediaError, MediaTooLargeError, NoVideoStreamError, RemoteMediaError, VLError
from vl.processing.images import RESAMPLE, normalize
from vl.processing.limits import DEFAULT_LIMITS, MediaLimits

BACKENDS = ("decord", "pyav")
_SEEK_GAP_FRAMES = 64  # PyAV: seek (to the keyframe before the target) instead of decoding through a larger gap
_DECODE_BATCH_BYTES = 256 << 20  # decord get_batch size: at most this much full-resolution RGB at once
_DECODER_THREADS = 4  # bounded so that a worker's address space (RLIMIT_AS) does not grow with the core count


@dataclass(frozen=True)
class VideoMetadata:
    width: int
    height: int
    fps: float | None  # container's average frame rate; None when missing or absurd
    duration_s: float | None
    header_frames: int  # as declared by the container (0 = not declared); never trusted for indexing
    codec: str


@dataclass
class VideoFrames:
    pixel_values: "object"  # torch.FloatTensor (T, 3, S, S), one tile per frame
    frame_indices: list[int]  # source frame numbers (0-based, presentation order)
    timestamps_s: list[float]  # by `timestamp_convention`, from frame_indices and fps
    presentation_times_s: list[float]  # decoder pts relative to the first frame
    fps: float  # source fps used for sampling and timestamps
    num_frames: int  # frames found by the index pass (real count, not the header's)
    metadata: VideoMetadata
    partial: bool  # some sampled frames could not be decoded (truncated/corrupt stream)
    backend: str


def sample_frame_indices(num_frames: int, fps: float, target_fps: float = 2.0, max_frames: int = 128) -> list[int]:
    """Uniform frame indices at `target_fps`, at most `max_frames`, always within [0, num_frames)."""
    if num_frames <= 0 or not fps > 0:
        raise ValueError(f"need num_frames > 0 and fps > 0, found {num_frames}, {fps}")
    duration = num_frames / fps
    n = max(1, min(math.floor(duration * target_fps), max_frames, num_frames))
    if n == num_frames:
        return list(range(num_frames))
    return np.linspace(0, num_frames - 1, n, dtype=int).tolist()


def frame_timestamps(indices, fps: float, convention: str = "exact") -> list[float]:
    if convention == "exact":
        return [i / fps for i in indices]
    if convention == "reference":
        frame_duration_ms = int(1000 / fps)
        return [i * frame_duration_ms / 1000 for i in indices]
    raise ValueError(f"timestamp_convention must be 'exact' or 'reference', found {convention!r}")


def _av_errors():
    import av

    return (av.error.FFmpegError, OSError, ValueError, IndexError, EOFError)


def probe_video(path: str, limits: MediaLimits = DEFAULT_LIMITS) -> VideoMetadata:
    """Container header only (PyAV), checked against `limits` before anything is decoded."""
    import av

    try:
        with av.open(path, metadata_errors="ignore") as container:
            if not container.streams.video:
                kinds = sorted({s.type for s in container.streams}) or ["none"]
                raise NoVideoStreamError(
                    f"expected a video stream, found only {'/'.join(kinds)} streams; send a file with video."
                )
            stream = container.streams.video[0]
            ctx = stream.codec_context
            rate = stream.average_rate or stream.guessed_rate or stream.base_rate
            fps = float(rate) if rate else None
            duration = None
            if stream.duration and stream.time_base:
                duration = float(stream.duration * stream.time_base)
            elif container.duration:
                duration = container.duration / av.time_base
            meta = VideoMetadata(ctx.width, ctx.height, fps if fps and 0 < fps <= 1000 else None,
                                 duration or None, int(stream.frames or 0), ctx.name or "unknown")
    except NoVideoStreamError:
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
    if meta.width * meta.height > limits.max_video_frame_pixels:
        raise MediaTooLargeError(
            f"video frames too large: {meta.width}x{meta.height}, the cap is {limits.max_video_frame_pixels:,} "
            "pixels per frame; downscale the video."
        )
    if meta.duration_s is not None and meta.duration_s > limits.max_video_duration_s:
        raise MediaTooLargeError(
            f"video too long: {meta.duration_s:.0f} s, the cap is {limits.max_video_duration_s:.0f} s; cut it."
        )
    if meta.header_frames > limits.max_video_frames:
        raise MediaTooLargeError(
            f"video declares {meta.header_frames} frames, the cap is {limits.max_video_frames}; cut it."
        )


def _to_tile(image: Image.Image, tile_size: int) -> np.ndarray:
    image = image if image.mode == "RGB" else image.convert("RGB")
    return np.asarray(image.resize((tile_size, tile_size), RESAMPLE))  # squash: aspect ratio not kept


def _fps_from_pts(pts_sorted, time_base) -> float | None:
    if len(pts_sorted) < 2 or pts_sorted[-1] <= pts_sorted[0]:
        return None
    return (len(pts_sorted) - 1) / float((pts_sorted[-1] - pts_sorted[0]) * time_base)


def _decode_pyav(path, meta, limits, tile_size, target_fps, max_frames):
    import av

    partial = False
    with av.open(path, metadata_errors="ignore") as container:  # index pass: packets only, no decoding
        stream = container.streams.video[0]
        time_base = stream.time_base
        pts = []
        try:
            for packet in container.demux(stream):
                if packet.size == 0:
                    continue
                stamp = packet.pts if packet.pts is not None else packet.dts
                if stamp is not None:
                    pts.append(stamp)
                if len(pts) > limits.max_video_frames:
                    raise MediaTooLargeError(
                        f"video has more than {limits.max_video_frames} frames (cap); cut it or lower its fps."
                    )
        except VLError:
            raise
        except _av_errors():
            partial = True  # unreadable tail: index what was readable
    pts.sort()
    if not pts:
        raise CorruptMediaError("the video stream has no readable frames; re-encode it.")
    fps = meta.fps or _fps_from_pts(pts, time_base)
    if not fps:
        raise CorruptMediaError("the video declares no frame rate and it cannot be measured; re-encode it.")
    indices = sample_frame_indices(len(pts), fps, target_fps, max_frames)
    position = {p: k for k, p in enumerate(pts)}
    wanted = [pts[i] for i in indices]
    with av.open(path, metadata_errors="ignore") as container:  # decode pass, fresh demuxer state
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        stream.thread_count = _DECODER_THREADS
        got, partial = _decode_wanted(container, stream, sorted(set(wanted)), position, tile_size, partial)
    kept = [i for i, p in zip(indices, wanted) if p in got]
    pts_s = [float((pts[i] - pts[0]) * time_base) for i in kept]
    return kept, [got[pts[i]] for i in kept], pts_s, fps, len(pts), partial


def _decode_wanted(container, stream, wanted, position, tile_size, partial):
    """Decode the frames whose pts are in `wanted` (sorted), seeking over gaps larger than _SEEK_GAP_FRAMES.

    A seek happens at most once per target and only between frames the index knows, so odd pts (edit lists,
    decoder-invented timestamps) fall back to plain sequential decoding instead of looping.
    """
    got: dict[int, np.ndarray] = {}
    k, last, frames, seeked_for = 0, None, None, -1

    def far(k):
        here = -1 if last is None else position.get(last, position[wanted[k]])
        return position[wanted[k]] - here > _SEEK_GAP_FRAMES and seeked_for != k

    try:
        while k < len(wanted):
            if frames is None or far(k):
                if far(k):
                    container.seek(int(wanted[k]), stream=stream, backward=True, any_frame=False)
                    seeked_for = k
                frames = container.decode(stream)
            for frame in frames:
                if frame.pts is None:
                    continue
                last = frame.pts
                while k < len(wanted) and wanted[k] < last:
                    k, partial = k + 1, True  # the decoder never delivered it
                if k < len(wanted) and wanted[k] == last:
                    got[last] = _to_tile(frame.to_image(), tile_size)
                    k += 1
                if k >= len(wanted) or far(k):
                    break
            else:
                partial = partial or k < len(wanted)
                break
    except _av_errors():
        partial = True
    return got, partial


def _decode_decord(path, meta, limits, tile_size, target_fps, max_frames):
    import decord

    try:
        reader = decord.VideoReader(path, ctx=decord.cpu(0), num_threads=_DECODER_THREADS)
    except (RuntimeError, decord._ffi.base.DECORDError) as e:
        raise CorruptMediaError(f"decord cannot open the video ({type(e).__name__}); re-encode it.") from None
    try:
        n = len(reader)
        if n == 0:
            raise CorruptMediaError("the video stream has no readable frames; re-encode it.")
        if n > limits.max_video_frames:
            raise MediaTooLargeError(f"video has {n} frames, the cap is {limits.max_video_frames}; cut it.")
        fps = meta.fps or float(reader.get_avg_fps() or 0) or None
        if not fps:
            raise CorruptMediaError("the video declares no frame rate; re-encode it.")
        indices = sample_frame_indices(n, fps, target_fps, max_frames)
        tiles = []
        step = max(1, min(32, _DECODE_BATCH_BYTES // (3 * meta.width * meta.height)))
        for start in range(0, len(indices), step):
            batch = reader.get_batch(indices[start : start + step]).asnumpy()  # (b, H, W, 3)
            tiles += [_to_tile(Image.fromarray(a), tile_size) for a in batch]
        stamps = reader.get_frame_timestamp(indices)[:, 0]
        first = float(reader.get_frame_timestamp([0])[0, 0])
    except (RuntimeError, decord._ffi.base.DECORDError) as e:
        raise CorruptMediaError(f"decord failed to decode the video ({type(e).__name__}); re-encode it.") from None
    finally:
        del reader
    return indices, tiles, [float(t) - first for t in stamps], fps, n, False


def decode_video_file(path: str, limits: MediaLimits, tile_size: int, target_fps: float, max_frames: int, backend: str):
    """Probe, check, index and decode; returns plain data (uint8 tiles) so it can run in a sandbox worker."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, found {backend!r}")
    meta = probe_video(path, limits)
    decode = _decode_decord if backend == "decord" else _decode_pyav
    indices, tiles, pts_s, fps, n, partial = decode(path, meta, limits, tile_size, target_fps, max_frames)
    if not tiles:
        raise CorruptMediaError("none of the sampled video frames could be decoded; the file is corrupt.")
    return {"indices": indices, "tiles": np.stack(tiles), "pts_s": pts_s, "fps": fps, "num_frames": n,
            "partial": partial, "metadata": meta}


def load_video(
    source,
    *,
    norm_mean,
    norm_std,
    tile_size: int = 512,
    target_fps: float = 2.0,
    max_frames: int = 128,
    backend: str = "decord",
    timestamp_convention: str = "exact",
    limits: MediaLimits = DEFAULT_LIMITS,
    isolate: bool = False,
) -> VideoFrames:
    """Untrusted video (local path, bytes or binary file object) -> `VideoFrames`.

    `isolate=True` runs probe + decode + resize in a sandbox worker with `limits.video_timeout_s` and
    `limits.worker_memory_mb`; normalization stays in this process.
    """
    if not target_fps > 0 or max_frames < 1:
        raise ValueError(f"need target_fps > 0 and max_frames >= 1, found {target_fps}, {max_frames}")
    frame_timestamps([], 1.0, timestamp_convention)  # validate the name before any work
    with tempfile.TemporaryDirectory(prefix="vl-video-") as tmp:
        path = _local_path(source, limits, tmp)
        args = (path, limits, tile_size, target_fps, max_frames, backend)
        if isolate:
            from vl.processing.sandbox import run_isolated

            out = run_isolated(decode_video_file, *args, timeout=limits.video_timeout_s,
                               memory_mb=limits.worker_memory_mb)
        else:
            out = decode_video_file(*args)
    return VideoFrames(
        pixel_values=normalize(out["tiles"], norm_mean, norm_std),  # (T, 3, S, S)
        frame_indices=out["indices"],
        timestamps_s=frame_timestamps(out["indices"], out["fps"], timestamp_convention),
        presentation_times_s=out["pts_s"],
        fps=out["fps"],
        num_frames=out["num_frames"],
        metadata=out["metadata"],
        partial=out["partial"],
        backend=backend,
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
