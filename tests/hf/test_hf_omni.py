"""The transformers pipeline on a Nemotron 3 Nano Omni directory (a tiny random one, tests/tiny_models.py).

transformers has its own `nemotron_h_omni` classes, so `pipeline("image-text-to-text", model=DIR)` keeps giving
those after `import vl` (as text-only `nemotron_h` keeps transformers' own); a hub directory, which names its remote
code's class instead, gets ours. Ours run when our model and processor
are handed to `pipeline()`; then audio parts and `use_audio_in_video` work, and the greedy text equals
`vl.Engine.chat` loaded on its own from the same directory (docs/transformers.md, "Nemotron 3 Nano Omni").
"""

import sys
from pathlib import Path

import pytest

import vl
from tiny_models import make_tiny_omni_dir
from vl.errors import ConfigError, InputError, RemoteMediaError, UnsupportedFormatError

transformers = pytest.importorskip("transformers")
from transformers import pipeline  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent.parent / "processing"))
from media_fixtures import tone, write_video  # noqa: E402

NEW = 6


@pytest.fixture(scope="module")
def omni_dir(tmp_path_factory):
    d, _ = make_tiny_omni_dir(tmp_path_factory.mktemp("hf_omni") / "omni")
    return d


@pytest.fixture(scope="module")
def pipe(omni_dir):
    from vl.hf import NemotronNanoVLV2ForImageTextToText, NemotronNanoVLV2Processor

    return pipeline("image-text-to-text", model=NemotronNanoVLV2ForImageTextToText.from_pretrained(omni_dir),
                    processor=NemotronNanoVLV2Processor.from_pretrained(omni_dir))


@pytest.fixture(scope="module")
def engine(omni_dir):
    return vl.Engine.from_pretrained(omni_dir)  # loaded on its own: nothing shared with the pipeline


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    return str(write_video(tmp_path_factory.mktemp("hf_omni_media") / "with_sound.mp4", seconds=2.0))


def user(*parts, text="What is heard?"):
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def new_text(pipe, messages, **kwargs) -> str:
    out = pipe(text=messages, max_new_tokens=NEW, return_full_text=False, **kwargs)
    return out[0]["generated_text"]


def test_an_audio_message_answers_as_the_engine_does(pipe, engine):
    assert type(pipe).__name__ == "NemotronNanoVLV2Pipeline"
    msgs = user({"type": "audio", "audio": tone(16000, 1.5, 440.0, 0.2)})
    want = engine.chat(msgs, max_new_tokens=NEW)
    assert want.stats.audio_tokens > 0
    assert new_text(pipe, msgs) == want.text
    assert new_text(pipe, msgs) == want.text  # again: the encoder cache changes nothing


def test_a_released_directory_loads_under_transformers_own_config_class(omni_dir, engine, tmp_path):
    """The hub's Omni directories name their remote class (`NemotronH_Nano_Omni_Reasoning_V3`) as model_type and
    their remote processor as processor_class, which transformers alone would only load by running that code:
    after `import vl`, `pipeline(model=DIR)` reaches our classes (registered under those names), the model's config
    being transformers' own class read from the file (the older key names mapped as it maps them), and answers as
    the engine does, twice; our objects handed in explicitly do the same. The model sees no remote code."""
    from tiny_models import make_released_omni_dir
    from vl.hf import NemotronNanoVLV2ForImageTextToText, NemotronNanoVLV2Processor

    released = make_released_omni_dir(omni_dir, tmp_path / "released")
    msgs = user({"type": "audio", "audio": tone(16000, 1.5, 440.0, 0.2)})
    want = engine.chat(msgs, max_new_tokens=NEW).text
    auto = pipeline("image-text-to-text", model=str(released))
    assert type(auto).__name__ == "NemotronNanoVLV2Pipeline"
    assert type(auto.processor).__name__ == "NemotronH_Nano_Omni_Reasoning_V3Processor"
    assert type(auto.model.config).__name__ == "NemotronH_Omni_Reasoning_V3_Config"
    assert new_text(auto, msgs) == new_text(auto, msgs) == want
    model = NemotronNanoVLV2ForImageTextToText.from_pretrained(released)
    assert type(model.config).__name__ == "NemotronH_Omni_Reasoning_V3_Config"
    assert model.config.audio_config.num_mel_bins == engine.model.config.audio.num_mel_bins
    assert model.config.audio_token_id == engine.model.config.tokens.audio_token_id  # from sound_context_token_id
    released_pipe = pipeline("image-text-to-text", model=model,
                             processor=NemotronNanoVLV2Processor.from_pretrained(released))
    assert new_text(released_pipe, msgs) == want


def test_use_audio_in_video_is_taken_by_the_pipeline(pipe, engine, clip):
    msgs = user({"type": "video", "video": clip}, text="What happens?")
    template = pipe.processor.apply_chat_template
    heard = template(msgs, tokenize=True, return_dict=True, add_generation_prompt=True, max_frames=4)
    muted = template(msgs, tokenize=True, return_dict=True, add_generation_prompt=True, max_frames=4,
                     use_audio_in_video=False)
    audio = sum(heard["omni_inputs"][0].audio_num_tokens)
    assert audio > 0 and not muted["omni_inputs"][0].audio_num_tokens
    assert heard["input_ids"].shape[1] == muted["input_ids"].shape[1] + audio + 2  # + <so_start>, <so_end>
    for flag in (None, False):
        kwargs = {} if flag is None else {"use_audio_in_video": flag}
        want = engine.chat(msgs, max_new_tokens=NEW, max_frames=4, **kwargs)
        assert new_text(pipe, msgs, max_frames=4, **kwargs) == want.text
    alias = template(msgs, tokenize=True, return_dict=True, add_generation_prompt=True, max_frames=4,
                     with_audio=False)  # the option's declared alias
    assert alias["input_ids"].tolist() == muted["input_ids"].tolist()


def test_bad_audio_is_a_typed_error_and_the_next_call_answers(pipe, engine):
    good = user({"type": "audio", "audio": tone(16000, 1.0, 330.0, 0.3)})
    want = engine.chat(good, max_new_tokens=NEW).text
    with pytest.raises(UnsupportedFormatError):
        new_text(pipe, user({"type": "audio", "audio": b"this is not audio at all" * 10}))
    with pytest.raises(RemoteMediaError):  # refused at the boundary, nothing fetched
        new_text(pipe, user({"type": "audio", "audio": "https://example.com/a.wav"}))
    assert new_text(pipe, good) == want


def test_the_wrapper_refuses_what_it_cannot_do_for_omni(pipe, tmp_path):
    with pytest.raises(ConfigError, match="Nano V2 VL layout"):
        pipe.model.save_pretrained(tmp_path / "copy")
    with pytest.raises(InputError, match="forward is not offered"):
        pipe.model(input_ids=pipe.processor(text="hi")["input_ids"])


def test_a_plain_pipeline_on_the_directory_stays_transformers_own(omni_dir):
    """`import vl` does not take over transformers' native `nemotron_h_omni` registration."""
    p = pipeline("image-text-to-text", model=str(omni_dir))
    assert type(p).__module__.startswith("transformers.") and type(p.model).__module__.startswith("transformers.")
