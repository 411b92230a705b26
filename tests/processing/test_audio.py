"""vl/processing/audio.py and audio_features.py: audio files and a video's sound track -> 16 kHz mono, caps before
decoding, typed errors, sandboxed decoding; mel features equal transformers' ParakeetFeatureExtractor.

Every file is encoded here with PyAV's encoders (WAV, FLAC, MP3 through LAME, Opus, AAC); tones tell which stream
and which stretch of time a decoded sample came from."""

import gc
import os
import sys
import threading

import av
import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from media_fixtures import encode, make_av_clip, make_video, noise_image, tone, write_video  # noqa: E402

import vl.processing.audio as audio  # noqa: E402
from vl.errors import (  # noqa: E402
    AudioTooShortError,
    ConfigError,
    CorruptMediaError,
    DecodeTimeoutError,
    EncryptedMediaError,
    MediaTooLargeError,
    NoAudioStreamError,
    RemoteMediaError,
    StoppedError,
    UnsupportedFormatError,
)
from vl.processing.audio import SAMPLE_RATE, load_audio, load_video_audio, probe_audio  # noqa: E402
from vl.processing.audio_features import (  # noqa: E402
    MelConfig,
    log_mel_features,
    mel_config_from_preprocessor,
    mel_filterbank,
)
from vl.processing.limits import MediaLimits  # noqa: E402
from vl.processing.progress import Work  # noqa: E402
from vl.processing.video import load_video  # noqa: E402

CENC = {"encryption_scheme": "cenc-aes-ctr", "encryption_key": "00112233445566778899aabbccddeeff",
        "encryption_kid": "a1a2a3a4a5a6a7a8a9aaabacadaeafb0"}


def write_audio(path, codec: str, rate: int, channels, *, fmt=None, options=None, pts_jump=None) -> str:
    """Encode `channels` (1-D float arrays of equal length, one per channel) as `codec` at `rate`. `pts_jump`
    (after_s, by_s) shifts every frame after `after_s` seconds by `by_s` seconds: a stretch the file skips."""
    layout = {1: "mono", 2: "stereo"}[len(channels)]
    x = np.stack(channels).astype(np.float32)
    with av.open(str(path), "w", format=fmt, options=options or {}) as c:
        s = c.add_stream(codec, rate=rate, layout=layout)
        step = s.codec_context.frame_size or 1024
        for i in range(0, x.shape[1], step):
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(x[:, i : i + step]), format="fltp", layout=layout)
            frame.sample_rate = rate
            frame.pts = i + (int(pts_jump[1] * rate) if pts_jump and i >= pts_jump[0] * rate else 0)
            for packet in s.encode(frame):
                c.mux(packet)
        for packet in s.encode():
            c.mux(packet)
    return str(path)


def dominant_hz(waveform: np.ndarray, rate: int = SAMPLE_RATE) -> float:
    spectrum = np.abs(np.fft.rfft(waveform * np.hanning(len(waveform))))
    return float(np.argmax(spectrum) * rate / len(waveform))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("audio")
    t44, t48 = tone(44100, 2.0, 440.0), tone(48000, 2.0, 440.0)
    return {
        "wav": write_audio(d / "a.wav", "pcm_s16le", 44100, [t44, t44]),
        "wav_left_only": write_audio(d / "left.wav", "pcm_f32le", 48000, [t48, np.zeros_like(t48)]),
        "flac": write_audio(d / "a.flac", "flac", 48000, [t48]),
        "mp3": write_audio(d / "a.mp3", "libmp3lame", 44100, [t44, t44]),
        "opus": write_audio(d / "a.ogg", "libopus", 48000, [t48, t48]),
        "m4a": write_audio(d / "a.m4a", "aac", 22050, [tone(22050, 2.0, 440.0)], fmt="mp4"),
        "m4a_faststart": write_audio(d / "fs.m4a", "aac", 22050, [tone(22050, 2.0, 440.0)], fmt="mp4",
                                     options={"movflags": "faststart"}),
        "adts": write_audio(d / "a.aac", "aac", 16000, [tone(16000, 2.0, 440.0)], fmt="adts"),
        "mka": write_audio(d / "a.mka", "libopus", 48000, [t48], fmt="matroska"),
        "gap": write_audio(d / "gap.mka", "pcm_s16le", 16000, [tone(16000, 2.0, 440.0)], fmt="matroska",
                           pts_jump=(16 * 1024 / 16000, 1.0)),
        "cenc": write_audio(d / "enc.m4a", "aac", 16000, [tone(16000, 1.0, 440.0)], fmt="mp4", options=CENC),
        "video": write_video(d / "v.mkv", fmt="matroska"),
        "video_late_audio": write_video(d / "late.mkv", audio_offset_s=0.5, fmt="matroska"),
        "video_bad_audio": write_video(d / "bad.mp4", corrupt_audio=True),
        "video_two_tracks": write_video(d / "two.mkv", fmt="matroska", audio_streams=((300.0, False), (700.0, True))),
        "video_silent": make_video(d / "silent.mp4", frames=10, fps=10),
    }


# --- formats, rate, channels ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name, codec, rate, channels", [
    ("wav", "pcm_s16le", 44100, 2), ("flac", "flac", 48000, 1), ("mp3", "mp3", 44100, 2), ("opus", "opus", 48000, 2),
    ("m4a", "aac", 22050, 1), ("adts", "aac", 16000, 1), ("mka", "opus", 48000, 1),
])
def test_every_format_decodes_to_16k_mono(files, name, codec, rate, channels):
    clip = load_audio(files[name])
    meta = clip.metadata
    assert (meta.codec, meta.sample_rate, meta.channels) == (codec, rate, channels)
    assert clip.sample_rate == SAMPLE_RATE and clip.waveform.dtype == np.float32 and clip.waveform.ndim == 1
    assert clip.duration_s == pytest.approx(2.0, abs=0.12)  # codec priming and padding: at most a few frames
    assert dominant_hz(clip.waveform) == pytest.approx(440.0, abs=1.0)
    assert clip.start_s == 0.0 and not clip.partial and meta.video_start_s is None


@pytest.mark.parametrize("name", ["wav", "flac"])
def test_lossless_files_resample_to_the_tone_itself(files, name):
    """FFmpeg's resampler against the analytic 440 Hz tone at 16 kHz (edges, where the filter starts, left out)."""
    w = load_audio(files[name]).waveform
    assert len(w) == 32000
    want = tone(SAMPLE_RATE, 2.0, 440.0)
    assert np.abs(w[800:-800] - want[800:-800]).max() < 2e-3


def test_channels_are_averaged_not_downmixed(files):
    """Left = tone, right = silence: the mean is half the tone (FFmpeg's mono downmix would give 1/sqrt(2))."""
    w = load_audio(files["wav_left_only"]).waveform
    peak = np.abs(w[800:-800]).max()
    assert peak == pytest.approx(0.25, abs=2e-3)


def test_the_best_audio_stream_is_the_one_decoded(files):
    clip, note = load_video_audio(files["video_two_tracks"])
    assert note == "" and clip.metadata.audio_streams == 2
    assert clip.metadata.stream_index == 2  # the second track carries the default disposition
    assert dominant_hz(clip.waveform) == pytest.approx(700.0, abs=1.0)


# --- what is accepted -------------------------------------------------------------------------------------

def test_sniffed_by_content_never_the_name(files, tmp_path):
    renamed = tmp_path / "looks_like.mp3"
    renamed.write_bytes(open(files["flac"], "rb").read())
    assert load_audio(str(renamed)).metadata.container == "flac"
    image = tmp_path / "image.wav"
    image.write_bytes(encode(noise_image(8, 8), "PNG"))
    with pytest.raises(UnsupportedFormatError, match="PNG"):
        load_audio(str(image))


@pytest.mark.parametrize("data, found", [
    (b"#EXTM3U\n#EXTINF:10,\nsegment.mp3\n", "playlist"),
    (b"[playlist]\nFile1=http://example.invalid/stream\n", "playlist"),
    (b"ffconcat version 1.0\nfile a.wav\n", "concat list"),
    (bytes(range(256)) * 8, "unrecognized bytes"),
])
def test_playlists_and_non_audio_are_refused(data, found):
    with pytest.raises(UnsupportedFormatError, match=found) as refused:
        load_audio(data)
    assert refused.value.code == "unsupported_format"


def test_empty_broken_and_header_only_files_are_corrupt_media(files):
    flac = open(files["flac"], "rb").read()
    garbage = flac[:200] + np.random.default_rng(0).integers(0, 256, len(flac) - 200, dtype=np.uint8).tobytes()
    for data in (b"", open(files["wav"], "rb").read()[:44], garbage):
        with pytest.raises(CorruptMediaError) as refused:
            load_audio(data)
        assert refused.value.code == "corrupt_media"


@pytest.mark.parametrize("name", ["flac", "m4a_faststart"])
def test_a_truncated_file_keeps_what_decodes_and_says_partial(files, name):
    data = open(files[name], "rb").read()
    clip = load_audio(data[: len(data) // 3])
    assert clip.partial and 0.2 < clip.duration_s < 1.5


def test_encrypted_audio_is_refused(files):
    with pytest.raises(EncryptedMediaError, match="enca") as refused:
        load_audio(files["cenc"])
    assert refused.value.code == "encrypted_media"


def test_urls_are_refused_before_anything_is_read():
    with pytest.raises(RemoteMediaError):
        load_audio("https://example.invalid/a.mp3")


# --- limits, checked on the cheapest form first -------------------------------------------------------------

def _refuse_decoding(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("decoding started for a file the header check refuses")

    monkeypatch.setattr(audio, "_decode_stream", refuse)


def test_byte_cap_before_the_file_is_opened(files, monkeypatch):
    monkeypatch.setattr(audio, "open_audio", lambda *a: pytest.fail("opened a file over the byte cap"))
    data = open(files["wav"], "rb").read()
    with pytest.raises(MediaTooLargeError, match="MiB cap"):
        load_audio(data, limits=MediaLimits(max_audio_bytes=len(data) - 1))
    with pytest.raises(MediaTooLargeError):
        load_audio(files["wav"], limits=MediaLimits(max_audio_bytes=len(data) - 1))


@pytest.mark.parametrize("limits, match", [
    (MediaLimits(max_audio_duration_s=1.5), "too long: 2 s"),
    (MediaLimits(max_audio_sample_rate=32000), "44100 Hz"),
    (MediaLimits(max_audio_channels=1), "2 channels"),
])
def test_header_caps_refuse_before_decoding(files, monkeypatch, limits, match):
    _refuse_decoding(monkeypatch)
    reports = []
    with Work(on_progress=lambda *r: reports.append(r)), pytest.raises(MediaTooLargeError, match=match):
        load_audio(files["wav"], limits=limits)
    assert reports == []  # not one second decoded


def test_a_header_that_lies_is_caught_by_the_decoded_samples(files, monkeypatch):
    monkeypatch.setattr(audio, "_check_header", lambda meta, limits: None)  # the header passes, whatever it says
    reports = []
    with Work(on_progress=lambda *r: reports.append(r)), pytest.raises(MediaTooLargeError, match="samples span"):
        load_audio(files["flac"], limits=MediaLimits(max_audio_duration_s=1.0))
    assert max((done for _, done, _ in reports), default=0) <= 1  # stopped at the cap, not at the end (2 s)


def test_progress_is_reported_per_second_and_a_stop_takes_effect(files):
    reports = []
    with Work(on_progress=lambda *r: reports.append(r)):
        load_audio(files["flac"])
    assert reports == [(audio.DECODED, 1, 2), (audio.DECODED, 2, 2)]
    cancel = threading.Event()
    with Work(cancel=cancel, on_progress=lambda *r: cancel.set()), pytest.raises(StoppedError):
        load_audio(files["flac"])


def test_in_process_deadline(files, monkeypatch):
    ticks = iter(range(10_000))
    monkeypatch.setattr(audio, "_now", lambda: float(next(ticks)))  # one second per look at the clock
    with pytest.raises(DecodeTimeoutError, match="audio_timeout_s"):
        load_audio(files["flac"], limits=MediaLimits(audio_timeout_s=5))


# --- time: gaps, start, alignment with the frames ----------------------------------------------------------

def test_a_skipped_stretch_becomes_silence_of_its_length(files):
    """Frames up to 1.024 s, then the rest 1 s later: sample k stays at k / 16000 s; the skipped second is zeros,
    and said."""
    clip = load_audio(files["gap"])
    w, cut = clip.waveform, 16 * 1024
    assert len(w) == 3 * SAMPLE_RATE and clip.partial and clip.gaps_s == pytest.approx(1.0, abs=1e-3)
    assert not w[cut : cut + SAMPLE_RATE].any() and w[cut - 8 : cut].any() and w[cut + SAMPLE_RATE :][:8].any()
    want = tone(SAMPLE_RATE, 2.0, 440.0)
    assert np.abs(w[cut + SAMPLE_RATE :] - want[cut:]).max() < 1e-4  # 16 kHz PCM in: the same samples out


def test_sound_track_start_is_on_the_frames_time_axis(files):
    """Audio written from 0.5 s in a video whose first frame is at 0: the clip starts at 0.5 s on the axis of the
    video path's frame timestamps, so what is said at a frame's time is waveform[(t - start_s) * 16000]."""
    clip, note = load_video_audio(files["video_late_audio"])
    frames = load_video(files["video_late_audio"], norm_mean=(0.5,) * 3, norm_std=(0.5,) * 3, tile_size=16)
    assert note == "" and clip.start_s == pytest.approx(0.5, abs=1e-3) and frames.timestamps_s[0] == 0.0
    in_sync, _ = load_video_audio(files["video"])
    assert in_sync.start_s == pytest.approx(0.0, abs=1e-3) and dominant_hz(in_sync.waveform) == pytest.approx(300, abs=1)


def test_a_video_without_sound(files):
    assert load_video_audio(files["video_silent"]) == (None, "the video has no audio track")
    with pytest.raises(NoAudioStreamError, match="only video") as refused:
        load_audio(files["video_silent"])
    assert refused.value.code == "no_audio_stream"


def test_a_video_whose_sound_track_is_corrupt_still_answers_from_its_frames(files):
    clip, note = load_video_audio(files["video_bad_audio"])
    assert clip is None and note.startswith("audio track unreadable: ") and note.endswith("(corrupt_media)")
    frames = load_video(files["video_bad_audio"], norm_mean=(0.5,) * 3, norm_std=(0.5,) * 3, tile_size=16)
    assert frames.num_frames == 20
    with pytest.raises(CorruptMediaError, match="mostly undecodable"):  # asked for as audio, it is an error
        load_audio(files["video_bad_audio"])


def test_a_sound_track_over_the_caps_is_a_note_not_an_error(files):
    clip, note = load_video_audio(files["video"], limits=MediaLimits(max_audio_duration_s=1.0))
    assert clip is None and note.endswith("(too_large)")


def test_the_real_two_audio_stream_clip_of_issue_52(tmp_path):
    clip, note = load_video_audio(make_av_clip(tmp_path / "av.mp4", seconds=2))
    assert note == "" and clip.metadata.audio_streams == 2 and clip.metadata.channels == 2
    assert clip.duration_s == pytest.approx(2.0, abs=0.05)
    # the fixture repeats sin(n / 10) for n < 1024 in every frame: the peak is the harmonic of 44100 / 1024 Hz nearest
    # 44100 / (20 pi) = 702 Hz
    assert dominant_hz(clip.waveform) == pytest.approx(44100 / (2 * np.pi * 10), abs=44100 / 1024)


# --- the sandbox, and nothing left behind -------------------------------------------------------------------

def test_isolated_decode_equals_in_process(files):
    for name in ("mp3", "opus", "gap"):
        local, isolated = load_audio(files[name]), load_audio(files[name], isolate=True)
        assert np.array_equal(local.waveform, isolated.waveform) and local.metadata == isolated.metadata
    clip, note = load_video_audio(files["video_bad_audio"], isolate=True)
    assert clip is None and note.endswith("(corrupt_media)")


def test_isolated_timeout_then_the_next_request_is_served(files):
    with pytest.raises(DecodeTimeoutError):
        load_audio(files["flac"], isolate=True, limits=MediaLimits(audio_timeout_s=0.001))
    assert load_audio(files["flac"], isolate=True).duration_s == 2.0


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_decoding_leaves_no_threads_or_files_behind(files):
    for name in ("mp3", "opus", "m4a", "video"):  # warm up: libraries may start their own pools once
        load_audio(files[name])
    gc.collect()
    gc.disable()
    try:
        threads, fds = _threads(), _fds()
        for k in range(12):
            load_audio(files[("mp3", "opus", "m4a", "flac")[k % 4]])
            load_video_audio(files["video"])
            assert _threads() <= threads and _fds() == fds, f"call {k}"
    finally:
        gc.enable()


def test_probe_reads_the_header_only(files):
    meta = probe_audio(files["video_late_audio"])
    assert (meta.container, meta.codec, meta.sample_rate, meta.channels) == ("matroska", "aac", 16000, 1)
    assert meta.video_start_s == 0.0 and meta.start_time_s == pytest.approx(0.5, abs=1e-3)


# --- mel features: transformers' ParakeetFeatureExtractor -----------------------------------------------------

def _extractor(mels: int):
    from transformers import ParakeetFeatureExtractor

    return ParakeetFeatureExtractor(feature_size=mels)


@pytest.mark.parametrize("mels", [80, 128])
def test_filterbank_equals_transformers_bit_for_bit(mels):
    assert torch.equal(mel_filterbank(MelConfig(feature_size=mels)), _extractor(mels).mel_filters)


def _clips(seed: int, lengths):
    """Noise plus a tone at a random level: bins of a steady tone barely vary, so their normalisation divides by
    ~1e-4 and shows any difference in how the energies were summed."""
    rng = np.random.default_rng(seed)
    amp = 10.0 ** rng.uniform(-4, 0)
    out = []
    for n in lengths:
        t = np.arange(n) / SAMPLE_RATE
        out.append((amp * (0.3 * rng.standard_normal(n) + np.sin(2 * np.pi * rng.uniform(100, 4000) * t)))
                   .astype(np.float32))
    return out


@pytest.mark.parametrize("mels", [80, 128])
@pytest.mark.parametrize("lengths", [[320], [4799], [16000, 321, 4799, 12345], [33333, 160 * 7, 5001]])
def test_features_equal_transformers(mels, lengths):
    """Odd lengths, the shortest clip that has features (two frames), and several clips padded into one batch."""
    for seed in range(3):
        clips = _clips(seed, lengths)
        want = _extractor(mels)(clips, sampling_rate=SAMPLE_RATE, return_tensors="pt")
        features, mask = log_mel_features(clips, MelConfig(feature_size=mels))
        assert torch.equal(mask, want.attention_mask)
        torch.testing.assert_close(features, want.input_features, rtol=1e-5, atol=1e-6)


def test_clips_shorter_than_two_frames_are_refused_where_transformers_gives_nan():
    clips = [np.ones(100, np.float32), np.ones(4000, np.float32)]  # under one hop, and a normal clip
    want = _extractor(80)(clips, sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features
    assert torch.isnan(want[0]).all() and not torch.isnan(want[1]).any()
    for n in (0, 1, 159, 160, 319):
        with pytest.raises(AudioTooShortError, match="at least 320 samples") as refused:
            log_mel_features([np.ones(4000, np.float32), np.ones(n, np.float32)], MelConfig())
        assert refused.value.code == "audio_too_short"


def test_features_do_not_depend_on_the_chunk_or_the_batch():
    """The chunking changes nothing, bit for bit; a clip's features alone equal its rows of a padded batch (noise
    clips: with a steady tone the sums over a different number of padded frames round differently, and the
    normalisation of its flat bins magnifies that, in transformers' extractor as here)."""
    clips = _clips(7, [40000, 3333, 20001])
    whole, mask = log_mel_features(clips, MelConfig(feature_size=128))
    for chunk in (1, 7, 313):
        assert torch.equal(log_mel_features(clips, MelConfig(feature_size=128), chunk_frames=chunk)[0], whole)
    rng = np.random.default_rng(0)
    clips = [rng.standard_normal(n).astype(np.float32) for n in (40000, 3333, 20001)]
    whole, mask = log_mel_features(clips, MelConfig(feature_size=128))
    for i, clip in enumerate(clips):
        alone, alone_mask = log_mel_features([clip], MelConfig(feature_size=128))
        n = alone.shape[1]
        assert torch.equal(alone_mask[0], mask[i, :n]) and not mask[i, n:].any()
        torch.testing.assert_close(alone[0], whole[i, :n], rtol=1e-5, atol=1e-6)


def test_decoded_audio_feeds_the_features(files):
    clip = load_audio(files["m4a"])
    features, mask = log_mel_features([clip.waveform], MelConfig(feature_size=128))
    assert features.shape == (1, 1 + len(clip.waveform) // 160, 128) and mask.sum() == len(clip.waveform) // 160


def test_preprocessor_config_reader():
    notes = []
    cfg = mel_config_from_preprocessor({"feature_extractor_type": "ParakeetFeatureExtractor", "feature_size": 128,
                                        "hop_length": 160, "n_fft": 512, "padding_side": "right",
                                        "return_attention_mask": True, "sampling_rate": 16000, "win_length": 400,
                                        "preemphasis": 0.97, "padding_value": 0.0}, notes=notes)
    assert cfg == MelConfig(feature_size=128)
    assert "feature_extractor_type" in " ".join(notes)
    with pytest.raises(ConfigError, match="padding_side"):
        mel_config_from_preprocessor({"padding_side": "left"})
    with pytest.raises(ConfigError, match="win_length"):
        MelConfig(win_length=1024)



def test_an_empty_recording_is_too_short_not_corrupt(tmp_path):
    """A WAV whose data chunk holds no samples (a recording stopped at once) is refused as too short, with the code
    the feature extractor gives a clip of a few samples; a header that declares samples it lacks stays corrupt
    (test above)."""
    import wave

    path = tmp_path / "empty.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(SAMPLE_RATE)
        w.writeframes(b"")
    for isolate in (False, True):
        with pytest.raises(AudioTooShortError, match="holds no sound") as refused:
            load_audio(str(path), isolate=isolate)
        assert refused.value.code == "audio_too_short"
