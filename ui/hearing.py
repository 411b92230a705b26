"""Audio in the app: the file types the audio decoder reads, and whether the served model hears.

Nemotron 3 Nano Omni hears through its Parakeet encoder (docs/audio.md); Nano V2 VL, text-only Nemotron-H and an
Omni checkpoint without `audio_config` do not. The upload filter and the Video tab's sound switch are built for the
model served when the page is built; each request asks the model it reaches again, since the model picker can
switch to one that does not hear.
"""

from __future__ import annotations

from pathlib import Path

from vl.errors import NoAudioError

# what the audio decoder reads (vl/processing/audio.py: WAV, FLAC, MP3, ADTS AAC, Ogg/Opus, MP4/M4A); it checks the
# bytes, not the name
AUDIO_TYPES = [".wav", ".mp3", ".flac", ".ogg", ".opus", ".m4a", ".aac"]


def hears(engine) -> bool:
    """Whether `engine`'s model takes audio. A local engine knows from its processor (`OmniProcessor.has_audio`;
    the Nano V2 VL processor has no such attribute); a remote one says `has_audio` when its server tells. Unknown
    counts as no: audio is offered only where it is known to be heard."""
    known = getattr(engine, "has_audio", None)
    if known is None:
        known = getattr(getattr(engine, "processor", None), "has_audio", None)
    return known is True


def is_audio(path) -> bool:
    return Path(str(path)).suffix.lower() in AUDIO_TYPES


def check_hears(engine, name: str) -> None:
    """Refuse the audio file `name` (its base name) before any work when the model does not hear."""
    if not hears(engine):
        raise NoAudioError(f"{name!r} is an audio file, and this model does not hear (it has no audio encoder); "
                         "audio needs a Nemotron 3 Nano Omni checkpoint with audio. Ask about images, a PDF or a "
                         "video instead")
