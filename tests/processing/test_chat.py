"""Prompt format, placeholder expansion and think-tag splitting (vl/processing/chat.py).

Golden strings follow docs/format.md §8.2 and the Nemotron Nano V2 card template. The system turn
is always written. Past answers drop their reasoning. The generation prompt is `<think>\\n` or
`<think></think>`. The jinja twin must render every golden case to the same bytes as the Python renderer.
The splitter rows are docs/reliability_policy.md row N15.
"""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.utils.chat_template_utils import render_jinja_template

from vl.errors import ConfigError, InputError, NoAudioError
from vl.options import DEFAULT_THINKING
from vl.processing.chat import (
    CHAT_TEMPLATE, MediaTokens, PlaceholderMismatchError, PromptFormatError, expand_placeholders, image_placeholder,
    render_messages, render_prompt, video_placeholder,
)
from vl.processing.reasoning_text import ThinkSplitter, split_reasoning, strip_reasoning

S, U, A, E = "<SPECIAL_10>System\n", "<SPECIAL_11>User\n", "<SPECIAL_11>Assistant\n", "<SPECIAL_12>"
IMG = {"type": "image", "image": "cat.png"}
IMG2 = {"type": "image", "image": "dog.png"}
VID = {"type": "video", "video": "clip.mp4", "fps": 2}


def text(t):
    return {"type": "text", "text": t}


# name -> (messages, render kwargs, expected text, expected thinking, expected prompt_opened_think)
GOLDEN = {
    "single_image": (
        [{"role": "user", "content": [IMG, text("Describe the image.")]}], {},
        f"{S}\n{U}<image>\nDescribe the image.\n{A}<think>\n", True, True),
    "multi_image": (
        [{"role": "system", "content": "You are a helpful assistant."},
         {"role": "user", "content": [text("Compare"), IMG, IMG2, text("Which one is bigger?")]}], {},
        f"{S}You are a helpful assistant.\n{U}Compare\n<image>\n<image>\nWhich one is bigger?\n{A}<think>\n",
        True, True),
    "video_no_think_system": (
        [{"role": "system", "content": "/no_think"}, {"role": "user", "content": [VID, text("What happens?")]}],
        {}, f"{S}\n{U}<video>\nWhat happens?\n{A}<think></think>", False, False),
    "multi_turn_reasoning_history": (
        [{"role": "system", "content": "You are concise. /think"},
         {"role": "user", "content": "What is 2+2?"},
         {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\n4"},
         {"role": "user", "content": [IMG, text("And the number of cats here?")]}], {},
        f"{S}You are concise.\n{U}What is 2+2?\n{A}4\n{E}\n{U}<image>\nAnd the number of cats here?\n{A}<think>\n",
        True, True),
    "user_think_overrides_system_no_think": (
        [{"role": "system", "content": "/no_think Be brief."}, {"role": "user", "content": "Hi /think"}], {},
        f"{S}Be brief.\n{U}Hi\n{A}<think>\n", True, True),
    "user_no_think_overrides_system_think": (
        [{"role": "system", "content": "/think"}, {"role": "user", "content": "/no_think Hi"}], {},
        f"{S}\n{U}Hi\n{A}<think></think>", False, False),
    "earlier_user_toggle_persists": (
        [{"role": "user", "content": "Hi /no_think"}, {"role": "assistant", "content": "Hello."},
         {"role": "user", "content": "Bye"}], {},
        f"{S}\n{U}Hi\n{A}Hello.\n{E}\n{U}Bye\n{A}<think></think>", False, False),
    "rightmost_toggle_in_one_message_wins": (
        [{"role": "user", "content": "/think then /no_think"}], {},
        f"{S}\n{U}then\n{A}<think></think>", False, False),
    "thinking_arg_overrides_on": (
        [{"role": "system", "content": "/no_think"}, {"role": "user", "content": "Hi"}], {"thinking": True},
        f"{S}\n{U}Hi\n{A}<think>\n", True, True),
    "thinking_arg_overrides_off": (
        [{"role": "user", "content": "Hi /think"}], {"thinking": False},
        f"{S}\n{U}Hi\n{A}<think></think>", False, False),
    "prefill_reasoning_on": (
        [{"role": "user", "content": "Count to three."}, {"role": "assistant", "content": "One, "}], {},
        f"{S}\n{U}Count to three.\n{A}<think>\nOne,", True, True),
    "prefill_reasoning_off": (
        [{"role": "user", "content": "Count. /no_think"}, {"role": "assistant", "content": "One"}], {},
        f"{S}\n{U}Count.\n{A}<think></think>One", False, False),
    "prefill_after_closed_reasoning": (
        [{"role": "user", "content": "Count."}, {"role": "assistant", "content": "ok</think>One"}], {},
        f"{S}\n{U}Count.\n{A}<think>\nok</think>One", True, False),
    "training_final_turn_keeps_reasoning": (
        [{"role": "user", "content": [IMG, text("Color?")]}, {"role": "assistant", "content": "Look.</think>Red"}],
        {"add_generation_prompt": False},
        f"{S}\n{U}<image>\nColor?\n{A}<think>\nLook.</think>Red\n{E}\n", True, False),
    "past_answer_keeps_later_closing_tags": (
        [{"role": "user", "content": "Explain the tag."},
         {"role": "assistant", "content": "<think>easy</think> The tag </think> closes it."},
         {"role": "user", "content": "Thanks"}], {},
        f"{S}\n{U}Explain the tag.\n{A}The tag </think> closes it.\n{E}\n{U}Thanks\n{A}<think>\n", True, True),
    "closing_tag_in_user_text_is_not_a_toggle": (
        [{"role": "user", "content": "What does </think> mean? /no_think"}], {},
        f"{S}\n{U}What does </think> mean?\n{A}<think></think>", False, False),
}


@pytest.mark.parametrize("name", list(GOLDEN))
def test_golden_prompts(name):
    messages, kwargs, expected, thinking, opened = GOLDEN[name]
    out = render_messages(messages, **kwargs)
    assert out.text == expected
    assert (out.thinking, out.prompt_opened_think) == (thinking, opened)


def _jinja(messages, thinking=None, add_generation_prompt=True):
    extra = {} if thinking is None else {"enable_thinking": thinking}
    rendered, _ = render_jinja_template(conversations=[messages], chat_template=CHAT_TEMPLATE,
                                        add_generation_prompt=add_generation_prompt, **extra)
    return rendered[0]


@pytest.mark.parametrize("name", list(GOLDEN))
def test_jinja_template_is_byte_identical(name):
    """The template runs in transformers' own sandbox (trim_blocks, lstrip_blocks), as apply_chat_template does."""
    messages, kwargs, expected, _, _ = GOLDEN[name]
    assert _jinja(messages, **kwargs) == expected


def test_media_order_and_pdf_pages():
    pages = {"doc.pdf": ["page0", "page1"]}
    messages = [{"role": "user", "content": [text("Read"), {"type": "pdf", "pdf": "doc.pdf"}, VID, IMG]}]
    out = render_messages(messages, pdf_pages=pages.__getitem__)
    assert out.text == f"{S}\n{U}Read\n<image>\n<image>\n<video>\n<image>\n{A}<think>\n"
    assert [(m.kind, m.source, m.page) for m in out.media] == [
        ("image", "page0", 0), ("image", "page1", 1), ("video", "clip.mp4", None), ("image", "cat.png", None)]
    assert out.media[0].document == "doc.pdf" and out.media[2].options == {"fps": 2}
    with pytest.raises(PromptFormatError, match="page loader"):
        render_messages(messages)


@pytest.mark.parametrize("messages, match", [
    ([], "non-empty"),
    ([{"role": "user", "content": "a"}, {"role": "system", "content": "b"}], "must come first"),
    ([{"role": "tool", "content": "a"}], "role must be"),
    ([{"role": "assistant", "content": [IMG]}], "user messages only"),
    ([{"role": "user", "content": "look: <image>"}], "placeholder"),
    ([{"role": "user", "content": [{"type": "image"}]}], "needs its data"),
    ([{"role": "user", "content": 3}], "string or a list"),
    ([{"role": "user", "content": ["hello"]}], "dict"),
    ([{"role": "user", "content": [{"type": ["image"]}]}], "expected type"),
    ([{"role": "user", "content": [{"type": "text", "text": None}]}], "'text' must be a string"),
])
def test_bad_messages_are_typed_errors(messages, match):
    with pytest.raises(PromptFormatError, match=match) as err:
        render_messages(messages)
    assert isinstance(err.value, InputError) and err.value.http_status == 400


def test_audio_for_a_model_that_does_not_hear_is_no_audio():
    with pytest.raises(NoAudioError, match="does not hear") as err:
        render_messages([{"role": "user", "content": [{"type": "audio", "audio": "x.wav"}]}])
    assert err.value.code == "no_audio" and err.value.http_status == 400


def test_thinking_argument_is_checked():
    with pytest.raises(PromptFormatError, match="thinking must be"):
        render_messages([{"role": "user", "content": "hi"}], thinking="yes")


# --- render_prompt: the checkpoint's template when present, ours otherwise --------------------------------
class _TemplateTokenizer:
    def __init__(self, chat_template):
        self.chat_template = chat_template

    def apply_chat_template(self, messages, tokenize, continue_final_message=False, **kwargs):
        assert tokenize is False
        rendered, _ = render_jinja_template(conversations=[messages], chat_template=self.chat_template,
                                            continue_final_message=continue_final_message, **kwargs)
        return rendered[0]


# A foreign template in another style: media first (images, then videos), string-only system, and a toggle
# rule that reads only the system message. Its reasoning mode comes from what render_prompt injects.
MEDIA_FIRST = (
    "{%- set sys = messages[0]['content'] -%}{{- 'SYS:' + sys.replace('/no_think', '').replace('/think', '').strip() }}"
    "{%- for m in messages[1:] -%}{%- if m['content'] is string -%}{{- '|' + m['role'] + ':' + m['content'] -}}"
    "{%- else -%}{{- '|' + m['role'] + ':' -}}"
    "{%- for p in m['content'] if p['type'] == 'image' -%}{{- '<image>' -}}{%- endfor -%}"
    "{%- for p in m['content'] if p['type'] == 'video' -%}{{- '<video>' -}}{%- endfor -%}"
    "{%- for p in m['content'] if p['type'] == 'text' -%}{{- p['text'] -}}{%- endfor -%}{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '|A:' + ('<think></think>' if '/no_think' in sys else '<think>\n') -}}"
    "{%- endif -%}")


@pytest.mark.parametrize("name", list(GOLDEN))
def test_render_prompt_with_our_template_equals_python(name):
    """What the product sends (render_prompt through the template) equals the Python twin under the product's
    default (off when nothing asks), and the golden text wherever that default does not decide."""
    messages, kwargs, expected, thinking, opened = GOLDEN[name]
    out = render_prompt(messages, _TemplateTokenizer(CHAT_TEMPLATE), **kwargs)
    twin = render_messages(messages, thinking_default=DEFAULT_THINKING, **kwargs)
    assert (out.text, out.thinking, out.prompt_opened_think) == (twin.text, twin.thinking, twin.prompt_opened_think)
    if twin.thinking == thinking:
        assert (out.text, out.prompt_opened_think) == (expected, opened)
    assert out.media == render_messages(messages, **kwargs).media


def test_render_prompt_reasoning_default_is_off_unless_asked():
    """The one default of every front end: the option, else a message's toggle, else off; the format's own
    default (the card's template, render_messages without a product default) stays on."""
    plain = [{"role": "user", "content": "Hi"}]
    asks = [{"role": "system", "content": "/think"}, {"role": "user", "content": "Hi"}]
    for tokenizer in (None, _TemplateTokenizer(CHAT_TEMPLATE)):
        assert render_prompt(plain, tokenizer).thinking is False
        assert render_prompt(asks, tokenizer).thinking is True
        assert render_prompt(asks, tokenizer, thinking=False).thinking is False
        assert render_prompt(plain, tokenizer, thinking=True).thinking is True
    assert render_messages(plain).thinking is True


def test_render_prompt_without_template_uses_python():
    messages, kwargs, expected, _, _ = GOLDEN["video_no_think_system"]
    assert render_prompt(messages, None, **kwargs).text == expected
    assert render_prompt(messages, _TemplateTokenizer(None), **kwargs).text == expected


def test_render_prompt_foreign_template_mode_and_media_order():
    messages = [{"role": "user", "content": [VID, IMG, text("Both? /no_think")]}]
    out = render_prompt(messages, _TemplateTokenizer(MEDIA_FIRST))
    assert out.text == "SYS:|user:<image><video>Both?|A:<think></think>"  # the toggle and the space before it go
    assert [m.kind for m in out.media] == ["image", "video"]  # placeholder order, not message order
    assert (out.thinking, out.prompt_opened_think) == (False, False)
    on = render_prompt(messages, _TemplateTokenizer(MEDIA_FIRST), thinking=True)
    assert on.text.endswith("|A:<think>\n") and on.thinking and on.prompt_opened_think


def test_a_template_that_takes_lists_of_images_but_not_audio_gets_strings_for_audio():
    """Typed lists go to a template only for the media kinds it was seen to render: this one writes an image part
    and drops an audio part, so a request with audio hands it strings (placeholders in place) and loses nothing,
    while an image-only request still goes as a list."""
    from vl.processing.chat import OMNI_TOKENS, template_takes_lists

    images_only = MEDIA_FIRST  # renders image and video parts of a list, nothing else
    tok = _TemplateTokenizer(images_only)
    assert template_takes_lists(tok, OMNI_TOKENS, ("image",))
    assert not template_takes_lists(tok, OMNI_TOKENS, ("audio", "image"))
    clip = {"type": "audio", "audio": "talk.wav"}
    out = render_prompt([{"role": "user", "content": [IMG, clip, text("What is said?")]}], tok, tokens=OMNI_TOKENS)
    assert out.text == f"SYS:|user:<image>\n{OMNI_TOKENS.audio_context}\nWhat is said?|A:<think></think>"
    assert [m.kind for m in out.media] == ["image", "audio"]
    listed = render_prompt([{"role": "user", "content": [text("Both?"), IMG]}], tok, tokens=OMNI_TOKENS)
    assert listed.text == "SYS:|user:<image>Both?|A:<think></think>"  # the list path: media first


def test_render_prompt_rejects_template_that_drops_media():
    """A template that drops video parts from a list is handed strings, where the placeholder survives; one that
    also strips it from strings loses the video, which is refused rather than answered without it."""
    drops_video = MEDIA_FIRST.replace("{{- '<video>' -}}", "")
    kept = render_prompt([{"role": "user", "content": [VID, text("x")]}], _TemplateTokenizer(drops_video))
    assert kept.text == "SYS:|user:<video>\nx|A:<think></think>" and [m.kind for m in kept.media] == ["video"]
    strips = drops_video.replace("m['content'] -}}", "m['content'].replace('<video>', '') -}}")
    assert strips != drops_video
    with pytest.raises(ConfigError, match="placeholders"):
        render_prompt([{"role": "user", "content": [VID, text("x")]}], _TemplateTokenizer(strips))


# --- placeholder expansion ------------------------------------------------------------------------------
def test_image_placeholder():
    run = image_placeholder(3, tokens_per_tile=256)
    assert run == "<img>" + "<image>" * 768 + "</img>"
    with pytest.raises(PlaceholderMismatchError):
        image_placeholder(0)


def test_video_placeholder_golden():
    run = video_placeholder([2, 0, 1], timestamps=[0.0, 0.5, 1.25])
    assert run == ("This is a video:\nFrame 1 sampled at 0.00 seconds: <img><image><image></img>\n"
                   "Frame 2 sampled at 0.50 seconds: <img></img>\nFrame 3 sampled at 1.25 seconds: <img><image></img>")
    assert video_placeholder([1, 1]) == "This is a video:\nFrame 1: <img><image></img>\nFrame 2: <img><image></img>"
    with pytest.raises(PlaceholderMismatchError, match="one timestamp per frame"):
        video_placeholder([1, 1], timestamps=[0.0])
    with pytest.raises(PlaceholderMismatchError):
        video_placeholder([])


def test_expand_placeholders_in_order():
    prompt = render_messages([{"role": "user", "content": [IMG, VID, text("Compare.")]}]).text
    runs = [image_placeholder(1, 2), video_placeholder([1], [0.5])]
    expanded = expand_placeholders(prompt, runs)
    assert expanded == (f"{S}\n{U}<img><image><image></img>\nThis is a video:\n"
                        f"Frame 1 sampled at 0.50 seconds: <img><image></img>\nCompare.\n{A}<think>\n")
    with pytest.raises(PlaceholderMismatchError, match="2 media placeholders but 1"):
        expand_placeholders(prompt, runs[:1])
    with pytest.raises(PlaceholderMismatchError, match="placeholder 0"):
        expand_placeholders(prompt, runs[::-1])


def test_media_tokens_from_config():
    custom = MediaTokens.from_config({"img_context_token": "<IMG_CONTEXT>", "img_start_token": "<img>"})
    assert (custom.img_context, custom.img_start, custom.video_context) == ("<IMG_CONTEXT>", "<img>", "<video>")

    class Cfg:
        video_context_token = "<VID>"

    assert MediaTokens.from_config(Cfg()).video_context == "<VID>"
    with pytest.raises(ConfigError):
        MediaTokens.from_config({"img_start_token": "<image>"})  # collides with img_context
    out = render_messages([{"role": "user", "content": [IMG, text("<image> is plain text here")]}], tokens=custom)
    assert out.text == f"{S}\n{U}<IMG_CONTEXT>\n<image> is plain text here\n{A}<think>\n"
    assert expand_placeholders(out.text, [image_placeholder(1, 1, custom)], custom).count("<IMG_CONTEXT>") == 1


# --- think-tag splitting (docs/reliability_policy.md row N15) --------------------------------------------------------
# (completion, prompt_opened_think, (reasoning, answer, truncated))
SPLIT_CASES = [
    ("Let me add.\n</think>\n\nThe answer is 4.", True, ("Let me add.", "The answer is 4.", False)),  # closing only
    ("The answer is 4.", False, ("", "The answer is 4.", False)),  # no tags at all
    ("\n<think>\nhmm\n</think>\n4", False, ("hmm", "4", False)),  # block in the output
    ("<think></think>  answer ", False, ("", "answer", False)),  # empty block
    ("still thinking about it\n", True, ("still thinking about it", "", True)),  # unclosed at max tokens
    ("<think>never closed </thi", False, ("never closed </thi", "", True)),  # unclosed, partial tag at the end
    ("  <thin", False, ("", "<thin", False)),  # a tag prefix that never completes is answer text
    ("x <think>y</think> z", False, ("", "x <think>y</think> z", False)),  # <think> not at the start: literal
    ("a</think>b</think>c", True, ("a", "bc", False)),  # the first closing tag splits; later raw tags are dropped
    ("<think>r</think>b<th</think>ink>c", False, ("r", "bc", False)),  # to a fixed point
    ("</think>", True, ("", "", False)),
    ("", True, ("", "", True)),
    ("", False, ("", "", False)),
    ("<</think</thi</think>\u3000ans\u3000 \n", True, ("<</think</thi", "ans", False)),  # near-tags, unicode space
    ("4</think>", False, ("", "4</think>", False)),  # closing tag without a prompt-opened block stays text
]


def _stream(chunks, opened):
    splitter, events = ThinkSplitter(opened), []
    for chunk in chunks:
        events += splitter.feed(chunk)
    events += splitter.finish()
    kinds = [k for k, _ in events]
    assert kinds == sorted(kinds, key=["reasoning", "answer"].index), "reasoning events must precede answer events"
    join = lambda kind: "".join(t for k, t in events if k == kind)  # noqa: E731
    return join("reasoning"), join("answer"), splitter.truncated


@pytest.mark.parametrize("completion, opened, expected", SPLIT_CASES)
def test_split_reasoning_golden(completion, opened, expected):
    assert split_reasoning(completion, opened) == expected


@pytest.mark.parametrize("completion, opened, expected", SPLIT_CASES)
def test_stream_cut_at_every_position_equals_non_streaming(completion, opened, expected):
    cuts = range(len(completion) + 1)
    for i, j in itertools.combinations_with_replacement(cuts, 2):  # every 1- and 2-cut chunking
        assert _stream([completion[:i], completion[i:j], completion[j:]], opened) == expected, (i, j)
    assert _stream(list(completion), opened) == expected  # one character per chunk


FRAGMENTS = ["<think>", "</think>", "<", "</", "<th", "</thin", "/", "think", ">", " ", "\n", "a", "b\n c"]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=12), st.booleans(), st.data())
def test_stream_equals_non_streaming_on_random_texts(pieces, opened, data):
    completion = "".join(pieces)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(completion)), max_size=6)))
    chunks = [completion[a:b] for a, b in zip([0, *cuts], [*cuts, len(completion)])]
    assert _stream(chunks, opened) == split_reasoning(completion, opened)


def test_splitter_finish_is_final():
    splitter = ThinkSplitter(prompt_opened_think=True)
    assert splitter.feed("abc </th") == [("reasoning", "abc")]  # " </th" held back: maybe a tag
    assert splitter.finish() == [("reasoning", " </th")] and splitter.truncated
    assert splitter.finish() == []
    with pytest.raises(RuntimeError):
        splitter.feed("more")


def test_render_and_split_agree_on_the_opened_block():
    prompt = render_messages([{"role": "user", "content": "2+2?"}])
    assert split_reasoning("add\n</think>\n4", prompt.prompt_opened_think) == ("add", "4", False)
    prompt = render_messages([{"role": "user", "content": "2+2? /no_think"}])
    assert split_reasoning("4", prompt.prompt_opened_think) == ("", "4", False)


@pytest.mark.parametrize("raw, expected", [
    ("<think>r</think> ans", "ans"),
    ("reasoning</think>\nans", "ans"),  # template pre-opened the block
    ("a</think>b</think>c", "c"),  # only closing tags: text after the last one
    ("p<think>a</think>q<think>b</think>r", "pqr"),  # every complete block
    ("<think>unclosed", "<think>unclosed"),  # an unclosed opening tag is left alone
    ("x</think>y<think>z", "x</think>y<think>z"),  # an opening tag is present, so the closing-only rule is off
    ("<THINK>x</THINK>y", "<THINK>x</THINK>y"),  # case-sensitive
    ("<analysis>x</analysis> y ", "y"),
])
def test_strip_reasoning_lmms_eval_rules(raw, expected):
    assert strip_reasoning(raw) == expected


def test_placeholders_in_an_earlier_answer_are_left_out_and_in_a_question_refused():
    """A model can emit its own placeholder tokens; sent back as history they would misalign the media, so an
    assistant turn's placeholders are dropped, while a user's stay a typed error (matrix: prompt injection)."""
    history = [{"role": "user", "content": "Say it."}, {"role": "assistant", "content": "it <image> is <video>"},
               {"role": "user", "content": "Again."}]
    out = render_messages(history)
    assert "<image>" not in out.text and "<video>" not in out.text and "Assistant\nit  is\n" in out.text
    with pytest.raises(PromptFormatError, match="placeholder"):
        render_messages([{"role": "user", "content": "look: <image>"}])
