"""Audio in the app: the file types the audio decoder reads, whether the served model hears, and the sound switch.

Nemotron 3 Nano Omni hears through its Parakeet encoder (docs/audio.md); Nano V2 VL, text-only Nemotron-H and an
Omni checkpoint without `audio_config` do not. The upload filters and the sound switches (Video and Chat tabs) are
built for the model served when the page is built and set again after a model-picker switch (ui/model_picker.py);
each request asks the model it reaches again, since a page opened before a switch still shows the old model's.
"""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from ui.limits import check_option
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


def sound_switch(ctx, elem_id: str, what: str = "the clip's") -> gr.Checkbox:
    """The "Hear the sound track" switch, on by default, shown only while the served model hears (`ctx.follow`
    keeps it so after a model switch). `what`: whose sound it is, as the tab says it."""
    switch = gr.Checkbox(value=True, label="Hear the sound track", elem_id=elem_id, **shown_if_hears(ctx),
                         info=f"{what} sound follows its frames as audio tokens; off: the frames alone")
    return ctx.follow(switch, shown_if_hears)


def shown_if_hears(ctx) -> dict:
    return {"visible": ctx.hears}


def sound_option(engine, hear) -> bool | None:
    """The switch's value as the request option `use_audio_in_video`: asked of a model that hears, None (nothing
    asked, no note) of one that does not, whatever an API caller sent."""
    if not hears(engine):
        return None
    return check_option("hear the sound track", "use_audio_in_video", True if hear is None else hear)
