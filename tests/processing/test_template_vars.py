"""Chat template variables a request sets (the `template_kwargs` option; `chat_template_kwargs` on the server):
the ones the model's template reads reach it, the others are dropped and named in the log, a value the template
cannot render with is a typed error, and the reasoning mode stays its own option (vl/processing/template_vars.py)."""

import logging
import shutil

import pytest

import vl
from card_templates import NEMOTRON3_TEMPLATE
from vl.directory import default_model
from vl.errors import GenerationOptionError
from vl.processing.chat import render_prompt
from vl.processing.template_vars import template_variables

HISTORY = [{"role": "user", "content": "What is 2+2?"},
           {"role": "assistant", "content": "<think>\nAdd the two numbers.\n</think>\n\n4"},
           {"role": "user", "content": "And 3+3?"}]
KEPT = "<|im_start|>assistant\n<think>\nAdd the two numbers.\n</think>\n\n4<|im_end|>"
DROPPED = "<|im_start|>assistant\n<think></think>4<|im_end|>"
# a template that does arithmetic with a variable it is given (as a budget hint would)
ARITHMETIC = ("{%- for m in messages -%}{{ m['role'] }}: {{ m['content'] }}\n{%- endfor -%}"
              "{%- if budget is defined -%}budget {{ budget + 1 }}\n{%- endif -%}"
              "{%- if add_generation_prompt -%}assistant:{%- endif -%}")
GENERATION_TAG = "{%- for m in messages -%}{% generation %}{{ m['content'] }}{% endgeneration %}{%- endfor -%}{{ tone }}"


@pytest.fixture()
def tok():
    processor = vl.load_processor(default_model())
    processor.tokenizer.chat_template = NEMOTRON3_TEMPLATE
    return processor.tokenizer


def test_the_variables_a_template_reads_are_found_by_parsing_it():
    reads = template_variables(NEMOTRON3_TEMPLATE)
    assert {"truncate_history_thinking", "enable_thinking", "messages", "add_generation_prompt"} <= reads
    assert "ns" not in reads  # set by the template itself: not read from outside
    assert "tone" in template_variables(GENERATION_TAG)  # transformers' own `{% generation %}` tag parses


def test_a_read_variable_changes_the_prompt_and_an_unread_one_is_named_in_the_log(tok, caplog):
    default = render_prompt(HISTORY, tok).text
    assert DROPPED in default and KEPT not in default  # the template's default: past reasoning dropped
    kept = render_prompt(HISTORY, tok, template_kwargs={"truncate_history_thinking": False}).text
    assert KEPT in kept and kept.endswith("<|im_start|>assistant\n<think></think>")  # the mode is still ours
    with caplog.at_level(logging.INFO, logger="vl.processing"):
        unread = render_prompt(HISTORY, tok, template_kwargs={"low_effort": True})
    assert unread.text == default and "variable(s) low_effort ignored" in caplog.text
    assert unread.notes == ("chat template variable(s) low_effort ignored: this model's chat template does not read "
                            "them",)  # said to the caller too (`vl chat`'s note, the stats' notes)
    assert render_prompt(HISTORY, tok, template_kwargs={"truncate_history_thinking": False}).notes == ()
    assert render_prompt(HISTORY, tok, template_kwargs={"truncate_history_thinking": True}).text == default
    caplog.clear()
    tok.chat_template = None  # no template: our own format, which reads no variables
    with caplog.at_level(logging.INFO, logger="vl.processing"):
        render_prompt(HISTORY, tok, template_kwargs={"truncate_history_thinking": False})
    assert "this model has no chat template" in caplog.text


def test_a_value_the_template_cannot_render_with_is_a_typed_error_and_nothing_sticks(tok):
    tok.chat_template = ARITHMETIC
    assert render_prompt(HISTORY[:1], tok, template_kwargs={"budget": 9}).text.endswith("budget 10assistant:")
    with pytest.raises(GenerationOptionError, match=r"could not render with chat_template_kwargs \{'budget': 'x'\}"):
        render_prompt(HISTORY[:1], tok, template_kwargs={"budget": "x"})
    assert render_prompt(HISTORY[:1], tok).text.endswith("user: What is 2+2?assistant:")  # the next is untouched


def test_engine_chat_takes_them_per_request_after_an_error_too(tmp_path):
    """The same engine, one request after another: the variable acts only on its own request, a name the
    renderer sets is refused before any work, and the next request is served as before."""
    d = tmp_path / "nemotron3_template"
    shutil.copytree(default_model(), d)
    engine = vl.Engine.from_pretrained(d)
    engine.processor.tokenizer.chat_template = NEMOTRON3_TEMPLATE
    plain = engine.chat(HISTORY, max_new_tokens=3, ignore_eos=True)
    kept = engine.chat(HISTORY, max_new_tokens=3, ignore_eos=True, template_kwargs={"truncate_history_thinking": False})
    reasoning = len(engine.processor.tokenizer("<think>\nAdd the two numbers.\n</think>\n\n4",
                                               add_special_tokens=False).input_ids)
    empty = len(engine.processor.tokenizer("<think></think>4", add_special_tokens=False).input_ids)
    assert kept.stats.prompt_tokens == plain.stats.prompt_tokens + reasoning - empty
    for bad in ({"messages": []}, {"enable_thinking": True}, {"x": {"a": 1}}):
        with pytest.raises(GenerationOptionError):
            engine.chat(HISTORY, max_new_tokens=3, template_kwargs=bad)
    again = engine.chat(HISTORY, max_new_tokens=3, ignore_eos=True, chat_template_kwargs={"low_effort": True})
    assert (again.stats.prompt_tokens, again.text) == (plain.stats.prompt_tokens, plain.text)
