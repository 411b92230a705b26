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
    "toggles_beside_media": [  # a removed toggle trims the message's ends only, as the reference format does
        {"role": "user", "content": [{"type": "text", "text": "Compare /no_think"}, {"type": "image", "image": IMG},
                                     {"type": "text", "text": "Which? /think"}]}],
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


def test_a_nemotron3_template_is_told_the_mode_by_its_variable_not_a_toggle(processor):
    """The Nemotron 3 templates (ChatML; the mode is `enable_thinking`, default on) get the resolved mode as that
    variable: reasoning stays off by default with no `/no_think` text in the prompt, the option and a user toggle
    turn it on, and the parse knows where the completion starts. The card-style template, which ignores the
    variable, still gets the toggle in its system message."""
    from card_templates import NEMOTRON3_TEMPLATE
    from vl.processing.chat import render_prompt, template_reads_switch

    tok = processor.tokenizer
    saved = tok.chat_template
    try:
        tok.chat_template = NEMOTRON3_TEMPLATE
        assert template_reads_switch(tok)
        plain = [{"role": "user", "content": "Hi"}]
        off = render_prompt(plain, tok)
        assert off.text == ("<|im_start|>system\n<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                            "<|im_start|>assistant\n<think></think>")
        assert not off.thinking and not off.prompt_opened_think
        on = render_prompt(plain, tok, thinking=True)
        assert on.text.endswith("<|im_start|>assistant\n<think>\n") and on.thinking and on.prompt_opened_think
        toggled = render_prompt([{"role": "user", "content": "Hi /think"}], tok)
        assert toggled.text == on.text  # the message's toggle resolves the mode and leaves the text
        image = render_prompt(CASES["one_image"], tok)
        assert "<|im_start|>user\n<image>\nColor?<|im_end|>" in image.text and "/no_think" not in image.text
        tok.chat_template = STRING_ONLY_TEMPLATE
        assert not template_reads_switch(tok)  # reads `ns.enable_thinking`, set from the toggles only
        card = render_prompt(plain, tok)
        assert card.text.endswith("<think></think>") and not card.thinking
    finally:
        tok.chat_template = saved


def test_an_engine_on_a_nemotron3_template_answers_without_reasoning_by_default(tmp_path):
    """A checkpoint whose tokenizer carries a Nemotron 3 template: the answer is the whole completion (no reasoning
    split off) unless thinking is asked for, when the completion starts inside `<think>`."""
    import shutil

    from card_templates import NEMOTRON3_TEMPLATE

    d = tmp_path / "nemotron3_template"
    shutil.copytree(default_model(), d)
    engine = vl.Engine.from_pretrained(d)
    engine.processor.tokenizer.chat_template = NEMOTRON3_TEMPLATE
    msgs = [{"role": "user", "content": "What can you read?"}]
    off = engine.chat(msgs, max_new_tokens=6, ignore_eos=True)
    assert off.reasoning == "" and off.answer == off.text.strip() != ""
    on = engine.chat(msgs, max_new_tokens=6, ignore_eos=True, thinking=True)
    assert on.stats.prompt_tokens == off.stats.prompt_tokens + len(
        engine.processor.tokenizer("<think>\n", add_special_tokens=False).input_ids) - len(
        engine.processor.tokenizer("<think></think>", add_special_tokens=False).input_ids)
    assert "</think>" not in on.text  # six tokens inside <think>: all reasoning, no answer yet
    assert on.answer == "" and on.reasoning == on.text.strip() and on.reasoning_truncated
