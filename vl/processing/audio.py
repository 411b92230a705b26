"""Untrusted audio (a file, or the sound track of a video) -> a 16 kHz mono float32 waveform, through PyAV.

What the Omni processor of transformers receives: a waveform at 16 kHz, mono. Channels are averaged (as
transformers' soundfile backend, librosa and NeMo's training loader do); FFmpeg's own downmix would weight a
stereo pair by 1/sqrt(2) each, 3 dB louder. The rate is converted by FFmpeg's resampler (swresample), segment by
segment; transformers resamples with soxr or torchaudio, so waveforms agree to the resamplers' accuracy, not bit
for bit (docs/audio.md).

Order of checks (docs/reliability_policy.md §0 rule 1, as video.py): byte cap -> container sniffed from the
magic bytes (never the name) and allowlisted, opened with that demuxer forced, the file protocol only and no
nested opens (video_formats: playlists, concat lists and data references are never followed) -> the best audio
stream's header (no audio stream, codec, encryption, sample rate, channels, duration) -> decode that stream only,
where the decoded samples are counted against the duration cap again (headers may lie) and every frame's rate and
channels against their caps. One deadline (`MediaLimits.audio_timeout_s`) bounds probe and decode, in-process
(checked between packets) and in a sandbox worker (which is also killed at it).

Time: frames are placed by their presentation times. A stretch the stream skips (a pts jump, or packets the
decoder refused, e.g. a damaged region) becomes silence of the same length, so sample k of the waveform is always
at `start_s + k / 16000` s; `partial` and `gaps_s` say that it happened. `start_s` is on the time axis of
the video path's frame timestamps (relative to the video stream's start) for a video, 0 for an audio file.

Progress and stop (vl/processing/progress.py): "audio decoded" (seconds so far, seconds in the header or 0) after
each decoded second; a stop takes effect there.
"""

import os
import tempfile
import time
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from vl.errors import (
    AudioTooShortError,
    CorruptMediaError,
    DecoderCrashedError,
    DecoderResourceError,
    DecodeTimeoutError,
    EncryptedMediaError,
    MediaError,
    MediaTooLargeError,
    NoAudioStreamError,
    RemoteMediaError,
    UnsupportedFormatError,
    VLError,
)
from vl.processing import video_formats
from vl.processing.limits import DEFAULT_LIMITS, MediaLimits
from vl.processing.progress import Work
from vl.processing.sandbox import run_isolated

SAMPLE_RATE = 16_000  # what the Parakeet features expect
DECODED = "audio decoded"  # the progress label: (seconds decoded so far, seconds the header declares or 0)
# sniffed name -> FFmpeg demuxer forced at open: audio files, then every video container (a sound track)
CONTAINERS = {"wav": "wav", "flac": "flac", "mp3": "mp3", "adts": "aac", **video_formats.CONTAINERS}
# decoders of audio codecs (FFmpeg canonical names); speech codecs and exotic formats are refused
CODECS = frozenset({
    "pcm_s16le", "pcm_s16be", "pcm_s24le", "pcm_s24be", "pcm_s32le", "pcm_s32be", "pcm_f32le", "pcm_f32be",
    "pcm_f64le", "pcm_f64be", "pcm_u8", "pcm_s8", "pcm_alaw", "pcm_mulaw",
    "flac", "alac", "mp3", "mp2", "aac", "opus", "vorbis", "ac3", "eac3",
})
ENCRYPTED_MESSAGE = ("expected unencrypted audio, found an encrypted (DRM) file ({what}); without its key it cannot "
                     "be decoded; send the file without encryption.")
_GAP_S = 0.010  # a jump in presentation times larger than this (and than 2 time-base units) is filled with silence
_SHORT_S = 0.5  # decoded this much (or 2 %) short of the header's duration: the file's end is lost (partial)
_SILENCE_CHUNK = SAMPLE_RATE * 60  # silence is appended a minute at a time (a capped gap, never one huge array)
_now = time.monotonic  # the clock of the decode deadline (tests count with their own)


@dataclass(frozen=True)
class AudioMetadata:
    container: str  # sniffed (CONTAINERS)
    codec: str
    sample_rate: int  # the source's, before resampling
    channels: int
    duration_s: float | None  # as the header declares it
    start_time_s: float  # the audio stream's first presentation time in the container's timeline
    stream_index: int  # the best audio stream: probed, capped and decoded
    audio_streams: int
    video_start_s: float | None  # the best video stream's start time; None when the file has no video


@dataclass
class AudioClip:
    waveform: np.ndarray  # (N,) float32, mono, `sample_rate` Hz
    sample_rate: int
    start_s: float  # where waveform[0] lies: seconds after the video stream's start (a video), 0 (an audio file)
    metadata: AudioMetadata
    partial: bool  # stretches the decoder could not deliver were filled with silence (or the tail was lost)
    gaps_s: float  # seconds of silence filled in

    @property
    def duration_s(self) -> float:
        return len(self.waveform) / self.sample_rate


# --- what may reach FFmpeg --------------------------------------------------------------------------------


def _mpeg_audio_frame(head: bytes) -> bool:
    """An MPEG-1/2/2.5 layer I/II/III frame header: 11 sync bits, a valid version, layer, bit rate and rate."""
    if len(head) < 4 or head[0] != 0xFF or head[1] & 0xE0 != 0xE0:
        return False
    version, layer = (head[1] >> 3) & 3, (head[1] >> 1) & 3
    bitrate, rate = head[2] >> 4, (head[2] >> 2) & 3
    return version != 1 and layer != 0 and bitrate != 15 and rate != 3


def _adts_frame(head: bytes) -> bool:
    """An AAC ADTS header: 12 sync bits, layer 00, a valid sampling-frequency index."""
    return len(head) >= 7 and head[0] == 0xFF and head[1] & 0xF6 == 0xF0 and (head[2] >> 2) & 0xF < 13


def sniff_audio(head: bytes) -> str:
    """Container name (a key of CONTAINERS) from the first bytes of a file, or UnsupportedFormatError."""
    if head[:4] in (b"RIFF", b"RF64", b"BW64") and head[8:12] == b"WAVE":
        return "wav"
    if head.startswith(b"fLaC"):
        return "flac"
    if _mpeg_audio_frame(head):
        return "mp3"
    if _adts_frame(head):
        return "adts"
    try:
        return video_formats.sniff_container(head)
    except UnsupportedFormatError as e:
        what = _describe(head, str(e))
    raise UnsupportedFormatError(
        f"expected audio (WAV, FLAC, MP3, Ogg/Opus/Vorbis, M4A/AAC, or a video's sound track, by content), found "
        f"{what}; convert it to WAV, FLAC or MP3."
    )


def _describe(head: bytes, video_refusal: str) -> str:
    text = head.lstrip()[:16].lower()
    if text.startswith(b"[playlist]") or text.startswith(b"<asx") or text.startswith(b"#extm3u"):
        return "a playlist (playlists are never followed)"
    return video_refusal.split("found ", 1)[-1].split("; ", 1)[0]


def _id3_size(head: bytes) -> int:
    """Bytes of an ID3v2 tag at the start of a file (header, body and footer), 0 when there is none."""
    if len(head) < 10 or head[:3] != b"ID3" or any(b & 0x80 for b in head[6:10]):
        return 0
    body = (head[6] << 21) | (head[7] << 14) | (head[8] << 7) | head[9]  # syncsafe integer
    return 10 + body + (10 if head[5] & 0x10 else 0)


def sniff_file(path: str) -> str:
    """The container of a file, past a leading ID3v2 tag (MP3s, also AAC/FLAC, often start with one)."""
    with open(path, "rb") as f:
        head = f.read(4096)
        skip = _id3_size(head)
        if skip:
            f.seek(skip)
            head = f.read(4096)
    name = sniff_audio(head)
    if skip and name not in ("mp3", "adts", "flac"):
        raise UnsupportedFormatError(f"expected MP3, AAC or FLAC audio after the file's ID3 tag, found {name!r} "
                                     "data; convert it to WAV, FLAC or MP3.")
    return name


def open_audio(path: str):
    """av.open with the forced demuxer, the file protocol only and no nested opens; -> (container, name)."""
    import av

    name = sniff_file(path)
    container = av.open(path, format=CONTAINERS[name], options=video_formats.open_options(name),
                        metadata_errors="ignore", io_open=video_formats.NestedOpenGuard(path))
    return container, name


def _best_audio_stream(container):
    if not container.streams.audio:
        return None
    try:
        return container.streams.best("audio")
    except Exception:  # noqa: BLE001 - defensive: a PyAV without best() behaves like "first audio stream"
        return container.streams.audio[0]


def _check_codec(stream) -> str:
    codec = getattr(stream.codec_context, "codec", None)
    if codec is None:
        raise UnsupportedFormatError(
            f"expected an audio codec this decoder supports ({', '.join(sorted(CODECS))}), found an audio stream "
            "whose codec has no decoder here; convert it to WAV, FLAC or MP3."
        )
    name = codec.canonical_name
    if name not in CODECS:
        raise UnsupportedFormatError(
            f"expected an audio codec ({', '.join(sorted(CODECS))}), found {name!r}; convert it to WAV, FLAC or MP3."
        )
    return name


def _check_not_encrypted(path: str, container: str, stream) -> None:
    """MP4 Common Encryption (`enca` sample entries, `pssh`/`tenc`/`senc` boxes) and Matroska ContentEncryption;
    packets with encryption side data are refused while decoding."""
    if "enc_key_id" in {k.lower() for k in (stream.metadata or {})}:
        raise EncryptedMediaError(ENCRYPTED_MESSAGE.format(what="Matroska ContentEncryption"))
    if container == "mp4":
        found = video_formats.encryption_box(path)
        if found:
            raise EncryptedMediaError(ENCRYPTED_MESSAGE.format(what=f"MP4 Common Encryption: {found}"))


def _seconds(value, time_base) -> float | None:
    return float(value * time_base) if value is not None and time_base else None


def probe_audio(path: str, limits: MediaLimits = DEFAULT_LIMITS) -> AudioMetadata:
    """Container header only, checked against `limits` before anything is decoded."""
    import av

    try:
        container, name = open_audio(path)
        with container:
            stream = _best_audio_stream(container)
            if stream is None:
                kinds = sorted({s.type for s in container.streams}) or ["no"]
                raise NoAudioStreamError(f"expected an audio stream, found only {'/'.join(kinds)} streams; send a "
                                         "file with sound.")
            codec = _check_codec(stream)
            _check_not_encrypted(path, name, stream)
            ctx = stream.codec_context
            duration = _seconds(stream.duration, stream.time_base)
            if duration is None and container.duration:
                duration = container.duration / av.time_base
            video = video_formats.best_video_stream(container)
            meta = AudioMetadata(
                name, codec, int(ctx.sample_rate or 0), int(ctx.channels or 0), duration,
                _seconds(stream.start_time, stream.time_base) or 0.0, stream.index, len(container.streams.audio),
                None if video is None else (_seconds(video.start_time, video.time_base) or 0.0),
            )
    except (VLError, MemoryError):
        raise
    except _av_errors() as e:
        raise CorruptMediaError(f"cannot open the audio ({_why(e)}); re-encode it.") from None
    _check_header(meta, limits)
    return meta


def _check_header(meta: AudioMetadata, limits: MediaLimits) -> None:
    if meta.sample_rate <= 0:
        raise CorruptMediaError(f"expected a positive sample rate, found {meta.sample_rate}; re-encode the audio.")
    _check_format(meta.sample_rate, meta.channels, limits)
    if meta.duration_s is not None and meta.duration_s > limits.max_audio_duration_s:
        raise MediaTooLargeError(f"audio too long: {meta.duration_s:.0f} s, the cap is "
                                 f"{limits.max_audio_duration_s:.0f} s; cut it.")


def _check_format(sample_rate: int, channels: int, limits: MediaLimits) -> None:
    """The rate and channel caps, on the header and again on every decoded frame (streams may change them)."""
    if sample_rate > limits.max_audio_sample_rate:
        raise MediaTooLargeError(f"audio sample rate {sample_rate} Hz is over the cap of "
                                 f"{limits.max_audio_sample_rate} Hz; resample it.")
    if channels > limits.max_audio_channels:
        raise MediaTooLargeError(f"audio has {channels} channels, the cap is {limits.max_audio_channels}; mix it "
                                 "down.")


def _av_errors():
    """What PyAV raises for a file it cannot read (`MemoryError` is re-raised first everywhere, never the file's)."""
    import av

    return (av.error.FFmpegError, OSError, ValueError, IndexError, EOFError)


def _why(e: BaseException) -> str:
    """Error text without file paths (FFmpeg errors carry the file name; clients must not see server paths)."""
    return f"{type(e).__name__}: {getattr(e, 'strerror', None) or 'unreadable'}"


# --- decoding ---------------------------------------------------------------------------------------------


class _Deadline:
    def __init__(self, seconds: float):
        self.seconds, self.end = seconds, _now() + seconds

    def check(self) -> None:
        if _now() > self.end:
            raise DecodeTimeoutError(
                f"decoding the audio did not finish within {self.seconds:g} s (MediaLimits.audio_timeout_s) and was "
                "stopped; send a shorter file, or raise the limit."
            )


class _Timeline:
    """16 kHz mono samples placed by presentation time: decoded stretches resampled, skipped ones silent."""

    def __init__(self, limits: MediaLimits, header_s: float | None, work: Work, stream_start: Fraction | None):
        self.limits, self.work, self.header_s = limits, work, header_s
        self.stream_start = stream_start  # the stream's declared start: the origin unless a frame comes earlier
        self.chunks: list[np.ndarray] = []
        self.samples = 0  # output samples so far
        self.first: Fraction | None = None  # the time of waveform[0]
        self.end: Fraction | None = None  # where the next frame should start
        self.resampler, self.setup = None, None
        self.gap_samples, self.reported = 0, 0

    def add(self, frame, stream) -> None:
        import av

        _check_format(frame.sample_rate, frame.layout.nb_channels, self.limits)
        time_base = frame.time_base or stream.time_base
        start = (Fraction(frame.pts) * Fraction(time_base) if frame.pts is not None and time_base
                 else self.end if self.end is not None else Fraction(0))
        tolerance = max(Fraction(_GAP_S), 2 * Fraction(time_base or 0))
        if self.first is None:  # packets refused before the first frame become leading silence
            late = self.stream_start is not None and start - self.stream_start > tolerance
            self.first = self.end = self.stream_start if late else start
        if start - self.end > tolerance:
            self._flush()
            self._silence_until(start)
        setup = (frame.format.name, frame.layout.name, frame.sample_rate)
        if setup != self.setup:  # a new stream setup: a fresh resampler (PyAV's refuses frames of another setup)
            self._flush()
            self.resampler = av.AudioResampler(format="fltp", layout=frame.layout.name, rate=SAMPLE_RATE)
            self.setup = setup
        self.end = max(self.end, start + Fraction(frame.samples, frame.sample_rate))
        self._cap(self.end - self.first)
        for out in self.resampler.resample(frame):
            self._append(out.to_ndarray().mean(axis=0, dtype=np.float32))

    def _flush(self) -> None:
        if self.resampler is not None:
            for out in self.resampler.resample(None):
                self._append(out.to_ndarray().mean(axis=0, dtype=np.float32))
            self.resampler, self.setup = None, None

    def _silence_until(self, start: Fraction) -> None:
        self._cap(start - self.first)
        missing = round((start - self.first) * SAMPLE_RATE) - self.samples
        self.gap_samples += max(missing, 0)
        while missing > 0:
            n = min(missing, _SILENCE_CHUNK)
            self._append(np.zeros(n, np.float32))
            missing -= n

    def _cap(self, span: Fraction) -> None:
        if span > self.limits.max_audio_duration_s:
            raise MediaTooLargeError(
                f"audio too long: its samples span more than {self.limits.max_audio_duration_s:.0f} s (the cap) "
                "whatever its header says; cut it."
            )

    def _append(self, mono: np.ndarray) -> None:
        self.chunks.append(mono)
        self.samples += len(mono)
        seconds = self.samples // SAMPLE_RATE
        if seconds > self.reported:
            self.reported = seconds
            self.work.report(DECODED, seconds, round(self.header_s or 0))

    def finish(self) -> np.ndarray:
        self._flush()
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.float32)


def _decode_stream(container, stream, meta: AudioMetadata, limits: MediaLimits, deadline: _Deadline):
    """Every packet of the chosen stream through its decoder onto the timeline; -> (timeline, partial)."""
    stream.codec_context.thread_count = 1  # no decoder thread pool (audio decoders gain nothing from one)
    start = (Fraction(stream.start_time) * Fraction(stream.time_base)
             if stream.start_time is not None and stream.time_base else None)
    timeline, partial = _Timeline(limits, meta.duration_s, Work.current(), start), False
    decoded = refused = 0
    try:
        for packet in container.demux(stream):
            deadline.check()
            if packet.has_sidedata("encryption_info") or packet.has_sidedata("encryption_init_info"):
                raise EncryptedMediaError(ENCRYPTED_MESSAGE.format(what="packets carry encryption data"))
            try:
                frames = packet.decode()
            except (VLError, MemoryError):
                raise
            except _av_errors():
                refused += 1  # a packet the decoder refuses: its time becomes silence if later frames follow
                continue
            decoded += bool(packet.size)
            for frame in frames:
                timeline.add(frame, stream)
    except (VLError, MemoryError):
        raise
    except _av_errors():
        partial = True  # the demuxer stopped at an unreadable stretch: what was decoded before it is kept
    if refused > decoded:
        raise CorruptMediaError(f"the audio is mostly undecodable: the decoder refused {refused} of "
                                f"{refused + decoded} packets; re-encode it.")
    declared = _seconds(stream.duration, stream.time_base)  # the stream's own (a container's may be the video's)
    if declared and timeline.first is not None:  # a truncated file decodes short of its header: its end is lost
        partial = partial or float(timeline.end - timeline.first) < declared - max(_SHORT_S, 0.02 * declared)
    return timeline, partial or refused > 0


def decode_audio_file(path: str, limits: MediaLimits) -> dict:
    """Probe, check and decode the best audio stream; plain data (a numpy waveform), so it can run in a sandbox
    worker."""
    deadline = _Deadline(limits.audio_timeout_s)
    meta = probe_audio(path, limits)
    deadline.check()
    try:
        container, _ = open_audio(path)  # a fresh demuxer for the decode pass
        with container:
            timeline, partial = _decode_stream(container, container.streams[meta.stream_index], meta, limits,
                                               deadline)
            waveform = timeline.finish()
    except (VLError, MemoryError):
        raise
    except _av_errors() as e:
        raise CorruptMediaError(f"cannot decode the audio ({_why(e)}); re-encode it.") from None
    if timeline.first is None or not len(waveform):
        if not partial and not meta.duration_s:  # it declares no length and ends cleanly: empty, not broken
            raise AudioTooShortError("the audio holds no sound: its stream ends before its first sample (0 s); "
                                     "send a clip with sound.")
        raise CorruptMediaError("none of the audio could be decoded; the file (or its sound track) is corrupt.")
    first = float(timeline.first)
    start = first - meta.video_start_s if meta.video_start_s is not None else 0.0
    return {"waveform": waveform, "metadata": meta, "start_s": start, "first_s": first,
            "partial": partial or timeline.gap_samples > 0, "gaps_s": timeline.gap_samples / SAMPLE_RATE}


# --- entry points -----------------------------------------------------------------------------------------


def _load(source, limits: MediaLimits, isolate: bool, byte_cap: int, what: str) -> AudioClip:
    with tempfile.TemporaryDirectory(prefix="vl-audio-") as tmp:
        path = _local_path(source, byte_cap, tmp, what)
        if isolate:
            out = run_isolated(decode_audio_file, path, limits, timeout=limits.audio_timeout_s,
                               memory_mb=limits.worker_memory_mb)
        else:
            try:
                out = decode_audio_file(path, limits)
            except MemoryError:
                raise DecoderResourceError(
                    "this process ran out of memory while decoding the audio; the file was not judged; send a shorter "
                    "file, or decode in a sandbox worker (isolate=True), which has its own memory cap."
                ) from None
    return AudioClip(waveform=out["waveform"], sample_rate=SAMPLE_RATE, start_s=out["start_s"],
                     metadata=out["metadata"], partial=out["partial"], gaps_s=out["gaps_s"])


def load_audio(source, *, limits: MediaLimits = DEFAULT_LIMITS, isolate: bool = False) -> AudioClip:
    """Untrusted audio (a local path, bytes or a binary file object) -> `AudioClip` at 16 kHz mono.

    A video file is accepted too (its best audio stream is decoded). `isolate=True` decodes in a sandbox worker
    with `limits.audio_timeout_s` and `limits.worker_memory_mb`; in-process the same deadline holds."""
    return _load(source, limits, isolate, limits.max_audio_bytes, "audio")


def load_video_audio(source, *, limits: MediaLimits = DEFAULT_LIMITS, isolate: bool = False):
    """The sound track of a video -> (`AudioClip` | None, note).

    Never raises for the sound track's own faults, so that the frames can still answer: no audio stream gives
    (None, "the video has no audio track"); an unreadable, refused or over-the-cap track gives (None, "audio track
    unreadable: <why> (<code>)"). The caller's faults (a URL, a wrong type) and ours (`DecoderResourceError`, a stop)
    are raised. The byte cap is the video's (`max_video_bytes`); the duration, rate and channel caps are audio's."""
    try:
        clip = _load(source, limits, isolate, limits.max_video_bytes, "video")
    except NoAudioStreamError:
        return None, "the video has no audio track"
    except (MediaError, DecoderCrashedError, DecodeTimeoutError) as e:
        return None, f"audio track unreadable: {e} ({e.code})"
    if clip.partial:
        return clip, (f"audio track partly unreadable: {clip.gaps_s:.2f} s of {clip.duration_s:.2f} s filled with "
                      "silence" + ("" if clip.gaps_s else ", or its end lost"))
    return clip, ""


def _local_path(source, cap: int, tmp: str, what: str) -> str:
    """A local file path for `source`; bytes and file objects are written into `tmp` (removed by the caller)."""
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if str(path).split(":", 1)[0].lower() in ("http", "https", "ftp", "rtsp", "rtmp", "data", "file"):
            raise RemoteMediaError(f"expected a local {what} file or bytes, found a URL ({str(path)[:40]!r}).")
        try:
            size = os.stat(path).st_size
        except OSError as e:
            raise CorruptMediaError(f"cannot read the {what} file: {e.strerror}; check the path.") from None
        if size > cap:
            raise MediaTooLargeError(_too_big(what, size, cap))
        if size == 0:
            raise CorruptMediaError(f"the {what} file is empty.")
        return path
    if hasattr(source, "read"):
        source = source.read(cap + 1)
    if not isinstance(source, (bytes, bytearray, memoryview)):
        raise TypeError(f"expected a path, bytes or a binary file object for the {what}, found {type(source)}")
    if len(source) > cap:
        raise MediaTooLargeError(_too_big(what, len(source), cap))
    if len(source) == 0:
        raise CorruptMediaError(f"the {what} file is empty.")
    path = os.path.join(tmp, "input")
    with open(path, "wb") as f:
        f.write(source)
    return path


def _too_big(what: str, size: int, cap: int) -> str:
    return (f"the {what} is larger than the {cap / 2**20:.0f} MiB cap (found {size / 2**20:.1f} MiB); send a smaller "
            "file.")
