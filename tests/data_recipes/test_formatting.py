"""Conversation formatting (data_recipes/formatting.py): loss only on the assistant's tokens, prompts that are
exactly what the processor makes from the files eval and users hand in (PNG, PDF, MP4)."""

import dataclasses

import numpy as np
import pytest
import torch

from data_recipes.formatting import (
    IGNORE, assistant_text, choose_thinking, format_example, prompt_inputs, tokenizer_corpus, user_message,
    video_tiles,
)
from data_recipes.registry import get_recipe
from data_recipes.synthetic import FAMILIES, families, generate
from data_recipes.synthetic.export import export_sample
from data_recipes.tokenizer import train_tokenizer
from vl.processing import chat
from vl.processing.processor import Processor

TILE = 64
VIDEO = {"num_frames": 8, "fps": 2.0}


def _sample(family, index=0, split="train", **opts):
    extra = VIDEO if FAMILIES[family].kind == "video" else {}
    return generate(family, split, index, tile_size=TILE, **{**extra, **opts})


@pytest.fixture(scope="module")
def processor(tmp_path_factory):
    seen = families("document") + families("video")  # what the demo model reads (the audio families it cannot)
    corpus = tokenizer_corpus(_sample(f, i) for f in seen for i in range(3))
    tok = train_tokenizer(corpus, 400, tmp_path_factory.mktemp("tok"))
    spec = dataclasses.replace(get_recipe("smoke").model, tile_size=TILE, cpe_max_size=TILE)
    return Processor(tok, spec.vl_config(tok))


@pytest.mark.parametrize("family", ["doc_total", "doc_multipage", "video_when"])
@pytest.mark.parametrize("thinking", [False, True])
def test_loss_only_on_the_assistant_turn(processor, family, thinking):
    s = _sample(family, 1, max_pages=3) if family == "doc_multipage" else _sample(family, 1)
    ex = format_example(s, processor, thinking=thinking)
    tok = processor.tokenizer
    labelled = (ex.labels != IGNORE).nonzero().flatten()
    first = int(labelled[0])
    assert labelled.tolist() == list(range(first, len(ex)))  # one contiguous span at the end
    assert torch.equal(ex.labels[labelled], ex.input_ids[labelled])
    assert tok.decode(ex.input_ids[first:]) == assistant_text(s, thinking) + "\n" + chat.END_OF_TURN
    assert int(ex.input_ids[-1]) == tok.convert_tokens_to_ids(chat.END_OF_TURN)  # it learns to stop
    prompt_ids, pixels, media, prompt = prompt_inputs(s, processor, thinking)
    assert torch.equal(ex.input_ids[:first], prompt_ids[0])  # the prompt is the inference prompt, unlabelled
    assert prompt.text.endswith(chat.THINK_ON_PROMPT if thinking else chat.THINK_OFF_PROMPT)
    assert ex.num_tiles == sum(m.num_tiles for m in ex.media) == pixels.shape[0]
    n_image = int((ex.input_ids == processor.image_token_id).sum())
    assert n_image == ex.num_tiles * processor.config.tokens_per_tile


def test_the_target_follows_the_chat_template_of_the_tokenizer(processor):
    """The training text is the jinja template's rendering of the same conversation (the one format)."""
    s = _sample("doc_name", 2)
    ex = format_example(s, processor, thinking=True)
    conversation = [user_message(s), {"role": "assistant", "content": assistant_text(s, True)}]
    plain = [{"role": "system", "content": ""}, {"role": "user", "content": [{"type": "image"}, {
        "type": "text", "text": s.question}]}, conversation[1]]
    templated = processor.tokenizer.apply_chat_template(plain, tokenize=False, enable_thinking=True)
    run = chat.image_placeholder(1, processor.config.tokens_per_tile)
    expected = chat.expand_placeholders(templated, [run]).removesuffix("\n")
    assert processor.tokenizer.decode(ex.input_ids) == expected


@pytest.mark.parametrize("family", ["doc_table", "doc_multipage", "video_flash", "video_when"])
def test_training_inputs_equal_the_processor_on_exported_files(processor, family, tmp_path):
    """Training builds video tiles from the generator's frames; eval decodes the MP4. Same ids; pixels equal
    up to the H.264 round trip. Documents go through the processor itself (PNG, or a PDF for several pages)."""
    s = _sample(family, 3, min_pages=3, max_pages=3) if family == "doc_multipage" else _sample(family, 3)
    record = export_sample(s, tmp_path)
    part = record["content"][0]
    messages = [{"role": "user", "content": [{"type": part["type"], part["type"]: str(tmp_path / part[part["type"]])},
                                             {"type": "text", "text": s.question}]}]
    for thinking in (False, True):
        ref = processor(messages, thinking=thinking)
        ids, pixels, media, _ = prompt_inputs(s, processor, thinking)
        assert torch.equal(ids, ref.input_ids)
        assert [(m.kind, m.num_tiles) for m in media] == [(m.kind, m.num_tiles) for m in ref.media]
        assert pixels.shape == ref.pixel_values.shape
        diff = (pixels - ref.pixel_values).abs()
        if s.kind == "document":
            assert float(diff.max()) == 0.0
        else:  # x264 at CRF 12 in yuv420p: flat colours shift by a few grey levels, chroma edges by more
            levels = diff * torch.tensor(processor.config.norm_std).view(1, 3, 1, 1) * 255
            assert float(levels.mean()) < 4, float(levels.mean())
            assert float(levels.flatten().quantile(0.99)) < 20, float(levels.flatten().quantile(0.99))
    if s.kind == "video":
        assert ref.items[0].timestamps == video_tiles(s.media, s.fps, processor).timestamps_s


def test_video_frame_headers_carry_the_answer_times(processor):
    s = _sample("video_when", 4)
    ex = format_example(s, processor, thinking=False)
    text = processor.tokenizer.decode(ex.input_ids)
    assert f"sampled at {s.answer} seconds" in text  # the answer is readable off a frame header
    assert text.count("Frame ") == s.num_frames


def test_think_choice_is_stable_and_near_the_fraction():
    ids = [f"doc_total/s0/i{i}" for i in range(2000)]
    picks = [choose_thinking(i, 0.3) for i in ids]
    assert picks == [choose_thinking(i, 0.3) for i in ids]
    assert 0.25 < np.mean(picks) < 0.35
    assert not any(choose_thinking(i, 0.0) for i in ids) and all(choose_thinking(i, 1.0) for i in ids)
    assert [choose_thinking(i, 0.5, seed=1) for i in ids] != [choose_thinking(i, 0.5, seed=2) for i in ids]


def test_tokenizer_corpus_is_the_rendered_conversation():
    s = _sample("video_colour", 0)
    texts = list(tokenizer_corpus([s]))
    assert len(texts) == 2  # both reasoning modes
    assert texts[0].startswith(chat.SYSTEM_HEADER) and texts[0].count("Frame ") == s.num_frames
    assert s.reasoning in texts[1] and chat.THINK_CLOSE in texts[1] and s.reasoning not in texts[0]
