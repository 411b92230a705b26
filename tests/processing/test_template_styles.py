"""Media prompts render to the same token ids through a string-only chat template (the published Nemotron Nano
9B v2 style), through a template that takes typed content lists (ours), and without a template (the reference
format of vl/processing/chat.py)."""

import pytest
from PIL import Image

import vl
from card_templates import STRING_ONLY_TEMPLATE
from vl.directory import default_model
from vl.processing.chat import CHAT_TEMPLATE, render_messages, template_takes_lists

IMG = Image.new("RGB", (100, 60), (200, 30, 30))
IMG2 = Image.new("RGB", (40, 90), (10, 120, 240))
CASES = {
    "one_image": [{"role": "user", "content": [{"type": "image", "image": IMG}, {"type": "text", "text": "Color?"}]}],
    "system_two_images_no_think": [
        {"role": "system", "content": "Be brief. /no_think"},
        {"role": "user", "content": [{"type": "text", "text": "Compare"}, {"type": "image", "image": IMG},
                                     {"type": "image", "image": IMG2}, {"type": "text", "text": "Which is taller?"}]}],
    "history_then_image": [
        {"role": "user", "content": "What is 2+2? /think"},
        {"role": "assistant", "content": "<think>\nAdd.\n</think>\n\n4"},
        {"role": "user", "content": [{"type": "image", "image": IMG2}, {"type": "text", "text": "And here?"}]}],
}


@pytest.fixture(scope="module")
def processor():
    return vl.load_processor(default_model())


def _ids(processor, template, messages, **kw):
    saved = processor.tokenizer.chat_template
    processor.tokenizer.chat_template = template
    try:
        out = processor(messages, **kw)
        return out.input_ids[0].tolist(), out.text
    finally:
        processor.tokenizer.chat_template = saved


def test_the_string_only_template_really_refuses_lists(processor):
    tok = processor.tokenizer
    saved = tok.chat_template
    tok.chat_template = STRING_ONLY_TEMPLATE
    try:
        with pytest.raises(Exception):
            tok.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "x"}]}],
                                    tokenize=False, add_generation_prompt=True)
        assert not template_takes_lists(tok)
    finally:
        tok.chat_template = saved
    tok.chat_template = CHAT_TEMPLATE
    try:
        assert template_takes_lists(tok)
    finally:
        tok.chat_template = saved


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("thinking", [None, False])
def test_media_prompts_equal_across_template_styles(processor, name, thinking):
    messages = CASES[name]
    string_only = _ids(processor, STRING_ONLY_TEMPLATE, messages, thinking=thinking)
    list_aware = _ids(processor, CHAT_TEMPLATE, messages, thinking=thinking)
    reference = _ids(processor, None, messages, thinking=thinking)
    assert string_only == list_aware == reference
    assert processor.tokenizer.convert_tokens_to_ids("<image>") in reference[0]
    want = render_messages(messages, thinking=thinking).text
    assert reference[1].startswith(want.split("<image>")[0])  # the reference format, placeholders expanded
