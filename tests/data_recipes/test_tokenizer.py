"""The demo tokenizer (data_recipes/tokenizer.py): control tokens are single ids, no BOS, standard files that
AutoTokenizer loads, and a chat template that renders exactly what vl.processing.chat renders."""

import importlib.util
import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from data_recipes.tokenizer import TEXT_TAGS, build_tokenizer, control_tokens, train_tokenizer
from vl.errors import ConfigError
from vl.options import DEFAULT_THINKING
from vl.processing.chat import (
    CHAT_TEMPLATE, MediaTokens, image_placeholder, expand_placeholders, render_messages, render_prompt,
    video_placeholder,
)


def _golden_cases():
    path = Path(__file__).resolve().parents[1] / "processing" / "test_chat.py"
    spec = importlib.util.spec_from_file_location("chat_golden_cases", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.GOLDEN


GOLDEN = _golden_cases()
CORPUS = [
    "The cat sits on the mat. Describe the image in one word.",
    "What happens in the video? A dog runs after a red ball.",
    "Reasoning first, then the answer: 2 + 2 = 4.",
    "Read the document and answer the question using a single word or phrase.",
] * 8


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    return out, train_tokenizer(CORPUS, vocab_size=400, out_dir=out)


def test_saved_as_standard_files_and_loads_with_auto_tokenizer(saved):
    out, tok = saved
    assert sorted(p.name for p in out.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["chat_template"] == CHAT_TEMPLATE
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    again = AutoTokenizer.from_pretrained(str(out))
    assert isinstance(again, PreTrainedTokenizerFast) and again.chat_template == CHAT_TEMPLATE
    assert len(again) <= 400 and again.eos_token == "<SPECIAL_12>"


def test_control_tokens_and_think_tags_are_single_ids(saved):
    _, tok = saved
    ids = {}
    for token in (*control_tokens(), *TEXT_TAGS):
        ids[token] = tok.convert_tokens_to_ids(token)
        assert tok.encode(token, add_special_tokens=False) == [ids[token]], token
        assert tok.encode(f"a{token}b", add_special_tokens=False).count(ids[token]) == 1, token
    assert len(set(ids.values())) == len(ids)
    assert [ids[t] for t in control_tokens()] == list(range(len(control_tokens())))  # low ids, in order


def test_no_bos_is_added(saved):
    _, tok = saved
    plain = tok.encode("The cat", add_special_tokens=False)
    assert tok("The cat").input_ids == plain == tok.encode("The cat")
    assert tok.bos_token_id not in plain


def test_rendered_prompt_round_trips_and_think_tags_survive_skipping_specials(saved):
    _, tok = saved
    messages, kwargs, *_ = GOLDEN["multi_turn_reasoning_history"]
    prompt = expand_placeholders(render_messages(messages, **kwargs).text, [image_placeholder(2, 3)])
    ids = tok.encode(prompt, add_special_tokens=False)
    assert tok.decode(ids) == prompt
    assert ids.count(tok.convert_tokens_to_ids("<image>")) == 6
    answer = tok.encode("<think>\nhm\n</think>\n4<SPECIAL_12>", add_special_tokens=False)
    assert tok.decode(answer, skip_special_tokens=True) == "<think>\nhm\n</think>\n4"


def test_video_prompt_round_trips(saved):
    _, tok = saved
    prompt = render_messages([{"role": "user", "content": [{"type": "video", "video": "v.mp4"}]}]).text
    prompt = expand_placeholders(prompt, [video_placeholder([2, 0, 1], [0.0, 0.5, 1.0])])
    assert tok.decode(tok.encode(prompt, add_special_tokens=False)) == prompt


@pytest.mark.parametrize("name", list(GOLDEN))
def test_apply_chat_template_equals_our_renderer(saved, name):
    _, tok = saved
    messages, kwargs, expected, thinking, opened = GOLDEN[name]
    add = kwargs.get("add_generation_prompt", True)
    extra = {"enable_thinking": kwargs["thinking"]} if "thinking" in kwargs else {}
    assert tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add, **extra) == expected
    via_tokenizer = render_prompt(messages, tok, **kwargs)  # the product: an unset mode with no toggle is off
    twin = render_messages(messages, thinking_default=DEFAULT_THINKING, **kwargs)
    assert (via_tokenizer.text, via_tokenizer.thinking, via_tokenizer.prompt_opened_think) == (
        twin.text, twin.thinking, twin.prompt_opened_think)
    if twin.thinking == thinking:
        assert (via_tokenizer.text, via_tokenizer.prompt_opened_think) == (expected, opened)
    ids = tok.apply_chat_template(messages, add_generation_prompt=add, **extra)["input_ids"]
    assert ids == tok.encode(expected, add_special_tokens=False)


def test_custom_media_tokens_become_control_tokens():
    tokens = MediaTokens(img_context="<IMG_CONTEXT>")
    tok = build_tokenizer(CORPUS, vocab_size=300, tokens=tokens)
    assert tok.encode("<IMG_CONTEXT>", add_special_tokens=False) == [control_tokens(tokens).index("<IMG_CONTEXT>")]


@pytest.mark.parametrize("texts, vocab_size, match", [
    (CORPUS, 100, "vocab_size"),
    ([], 400, "no texts"),
    ([b"bytes"], 400, "strings"),
])
def test_bad_arguments(texts, vocab_size, match):
    with pytest.raises(ConfigError, match=match):
        build_tokenizer(texts, vocab_size)
