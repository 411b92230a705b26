"""Synthetic sounds with known answers: counting beeps, comparing two tones' pitch.

Each clip is 16 kHz mono float32 samples (the rate the processor decodes every audio file to, vl/processing/audio.py)
of sine tones over faint noise, so the only thing to hear is what is asked about. `audio_beeps` cannot be answered
from any one moment: the answer is how many separate tones the clip holds. `audio_pitch` asks whether the second of
two tones is higher than the first, with pitches at least a whole tone apart.

Each generator is `gen(seed, index, *, tile_size=128) -> Sample`, pure; `tile_size` is the option every family takes
(families.py `COMMON_OPTIONS`) and draws nothing here. A sample's `media` holds one waveform (numpy, float32) instead
of images; export.py writes it as a 16-bit PCM WAV file.
"""

from __future__ import annotations

import numpy as np

from .common import Sample, balanced_class, rng_for, sample_id

SAMPLE_RATE = 16_000
MAX_BEEPS = 4
PITCH_ANSWERS = ("yes", "no")


def _tone(freq: float, seconds: float, amplitude: float) -> np.ndarray:
    """A sine of `seconds` with 10 ms raised-cosine edges (no clicks, which would sound like extra beeps)."""
    n = int(round(seconds * SAMPLE_RATE))
    t = np.arange(n, dtype=np.float64) / SAMPLE_RATE
    wave = amplitude * np.sin(2 * np.pi * freq * t)
    edge = min(n // 2, int(0.01 * SAMPLE_RATE))
    ramp = 0.5 - 0.5 * np.cos(np.pi * np.arange(edge) / edge)
    wave[:edge] *= ramp
    wave[n - edge:] *= ramp[::-1]
    return wave


def _clip(rng, parts: list[tuple[float, float]], amplitude: float) -> np.ndarray:
    """Tones (freq Hz, seconds) separated by silences of 0.25-0.5 s, with 0.2-0.4 s of lead and tail, over noise."""
    pieces = [np.zeros(int(rng.uniform(0.2, 0.4) * SAMPLE_RATE))]
    for k, (freq, seconds) in enumerate(parts):
        if k:
            pieces.append(np.zeros(int(rng.uniform(0.25, 0.5) * SAMPLE_RATE)))
        pieces.append(_tone(freq, seconds, amplitude))
    pieces.append(np.zeros(int(rng.uniform(0.2, 0.4) * SAMPLE_RATE)))
    wave = np.concatenate(pieces)
    wave += rng.normal(0.0, 0.005, size=wave.shape)
    return np.clip(wave, -1.0, 1.0).astype(np.float32)


def _sample(family, seed, index, question, answer, reasoning, cls, n_classes, wave, **meta) -> Sample:
    meta.update(family=family, seed=seed, index=index, class_index=cls, n_classes=n_classes,
                sample_rate=SAMPLE_RATE, seconds=round(len(wave) / SAMPLE_RATE, 3))
    return Sample(id=sample_id(family, seed, index), family=family, kind="audio", question=question, answer=answer,
                  reasoning=reasoning, chance=1.0 / n_classes, media=[wave], metadata=meta)


def audio_beeps(seed: int, index: int, *, tile_size: int = 128) -> Sample:
    """1-4 beeps of one pitch, each 0.15-0.3 s long."""
    fam = "audio_beeps"
    rng, cls = rng_for(seed, fam, index), balanced_class(seed, fam, index, MAX_BEEPS)
    count = cls + 1
    freq = float(rng.uniform(400.0, 1200.0))
    wave = _clip(rng, [(freq, float(rng.uniform(0.15, 0.3))) for _ in range(count)], float(rng.uniform(0.3, 0.6)))
    return _sample(fam, seed, index, "How many beeps do you hear?", str(count),
                   f"{count} separate tone{'s' if count > 1 else ''} at about {freq:.0f} Hz", cls, MAX_BEEPS, wave,
                   freq_hz=round(freq, 1))


def audio_pitch(seed: int, index: int, *, tile_size: int = 128) -> Sample:
    """Two tones of 0.3-0.5 s; the second is 1.12-2x higher (answer "yes") or lower ("no") than the first."""
    fam = "audio_pitch"
    rng, cls = rng_for(seed, fam, index), balanced_class(seed, fam, index, len(PITCH_ANSWERS))
    first = float(rng.uniform(300.0, 900.0))
    ratio = float(rng.uniform(1.12, 2.0))  # at least a whole tone (2**(2/12) = 1.122) apart
    second = first * ratio if PITCH_ANSWERS[cls] == "yes" else first / ratio
    amplitude = float(rng.uniform(0.3, 0.6))
    wave = _clip(rng, [(first, float(rng.uniform(0.3, 0.5))), (second, float(rng.uniform(0.3, 0.5)))], amplitude)
    return _sample(fam, seed, index, "Is the second tone higher than the first? Answer yes or no.",
                   PITCH_ANSWERS[cls], f"{first:.0f} Hz then {second:.0f} Hz", cls, len(PITCH_ANSWERS), wave,
                   freqs_hz=[round(first, 1), round(second, 1)])


# name -> (generator, answer classes given options, options it takes beyond tile_size)
AUDIO_FAMILIES = {
    "audio_beeps": (audio_beeps, lambda **o: [str(c) for c in range(1, MAX_BEEPS + 1)], ()),
    "audio_pitch": (audio_pitch, lambda **o: list(PITCH_ANSWERS), ()),
}
