"""The synthetic audio families (data_recipes/synthetic/audio.py): the answer is in the sound (beeps counted and
pitches compared on the WAV read back through the processor's decoder), samples are pure functions of their seed,
and the WAV files are the same bytes every time."""

import numpy as np
import pytest

from data_recipes.synthetic import generate, make_dataset
from data_recipes.synthetic.export import export_sample
from vl.processing.audio import load_audio


def _bursts(wave: np.ndarray, rate: int = 16000) -> list[tuple[int, int]]:
    """(start, end) sample ranges where the 10 ms energy envelope is well above the noise floor."""
    hop = rate // 100
    env = np.sqrt(np.mean(wave[: len(wave) // hop * hop].reshape(-1, hop) ** 2, axis=1))
    loud = env > 0.05
    edges = np.flatnonzero(np.diff(np.concatenate([[0], loud.astype(int), [0]])))
    return [(a * hop, b * hop) for a, b in zip(edges[::2], edges[1::2])]


def _pitch(segment: np.ndarray, rate: int = 16000) -> float:
    spectrum = np.abs(np.fft.rfft(segment * np.hanning(len(segment))))
    return float(np.fft.rfftfreq(len(segment), 1 / rate)[spectrum.argmax()])


@pytest.mark.parametrize("index", range(8))
def test_the_answer_is_heard_in_the_written_file(index, tmp_path):
    for family in ("audio_beeps", "audio_pitch"):
        sample = generate(family, "test", index)
        record = export_sample(sample, tmp_path)
        wave = load_audio(str(tmp_path / record["content"][0]["audio"])).waveform  # the processor's decoder
        assert np.abs(wave - sample.media[0]).max() < 2e-4  # 16-bit PCM of the generated samples
        bursts = _bursts(wave)
        if family == "audio_beeps":
            assert str(len(bursts)) == sample.answer, (sample.id, bursts)
        else:
            assert len(bursts) == 2
            first, second = (_pitch(wave[a:b]) for a, b in bursts)
            assert ("yes" if second > first else "no") == sample.answer, (sample.id, first, second)


def test_samples_are_pure_balanced_and_their_files_reproducible(tmp_path):
    a, b = generate("audio_beeps", "train", 5, seed=3), generate("audio_beeps", "train", 5, seed=3)
    assert a.media[0].dtype == np.float32 and np.array_equal(a.media[0], b.media[0]) and a.answer == b.answer
    assert not np.array_equal(a.media[0], generate("audio_beeps", "train", 6, seed=3).media[0])
    one = export_sample(a, tmp_path / "one")
    two = export_sample(b, tmp_path / "two")
    name = one["content"][0]["audio"]
    assert name.endswith(".wav") and (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
    ds = make_dataset("audio", "val", 8)
    assert sorted(s.answer for s in ds if s.family == "audio_beeps") == ["1", "2", "3", "4"]
    assert sorted(s.answer for s in ds if s.family == "audio_pitch") == ["no", "no", "yes", "yes"]
    assert all(s.kind == "audio" and s.metadata["sample_rate"] == 16000 for s in ds)
