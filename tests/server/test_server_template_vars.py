"""`chat_template_kwargs` through `vl serve`, sent by the official `openai` client as vLLM users send it and by
`RemoteEngine`: the reasoning switch and the template's own variables in one object (docs/server.md, "Chat
template variables"). One server, requests in a row: a variable the template reads changes only its own request's
prompt, a name it does not read changes nothing, a bad value is a 400 and the next request is served as before,
and the remote answers equal the local engine's."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "processing"))
from card_templates import NEMOTRON3_TEMPLATE  # noqa: E402
from helpers import DEMO, in_process_server  # noqa: E402

openai = pytest.importorskip("openai", reason="the openai client is a [dev] extra: pip install openai")
pytestmark = pytest.mark.skipif(not (DEMO / "config.json").is_file(), reason="the demo model is not shipped here")

HISTORY = [{"role": "user", "content": "What is 2+2?"},
           {"role": "assistant", "content": "<think>\nAdd the two numbers.\n</think>\n\n4"},
           {"role": "user", "content": "And 3+3?"}]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from vl.runtime.engine import Engine

    d = tmp_path_factory.mktemp("nemotron3") / "model"
    shutil.copytree(DEMO, d)
    engine = Engine.from_pretrained(str(d))
    engine.processor.tokenizer.chat_template = NEMOTRON3_TEMPLATE  # a Nemotron 3 style template (ChatML)
    return engine


@pytest.fixture(scope="module")
def served(engine):
    with in_process_server(engine, served_names=("n3",)) as (base, _):
        yield base


def test_openai_client_sends_template_variables_in_a_row(engine, served):
    client = openai.OpenAI(base_url=served + "/v1", api_key="unused", max_retries=0, timeout=120)

    def ask(**kwargs):
        return client.chat.completions.create(model="n3", messages=HISTORY, max_tokens=4, temperature=0,
                                              extra_body={"ignore_eos": True, **kwargs})

    plain = ask()
    kept = ask(chat_template_kwargs={"enable_thinking": False, "truncate_history_thinking": False})
    local = engine.chat(HISTORY, max_new_tokens=4, ignore_eos=True, template_kwargs={"truncate_history_thinking": False})
    assert kept.usage.prompt_tokens == local.stats.prompt_tokens > plain.usage.prompt_tokens
    assert kept.choices[0].message.content == local.answer
    unread = ask(chat_template_kwargs={"low_effort": True})  # not read by this template: nothing changes
    assert (unread.usage.prompt_tokens, unread.choices[0].message.content) == (
        plain.usage.prompt_tokens, plain.choices[0].message.content)
    for bad in ({"truncate_history_thinking": [False]}, {"messages": "x"}, {"bos_token": "<s>"}, "yes"):
        with pytest.raises(openai.BadRequestError) as err:
            ask(chat_template_kwargs=bad)
        assert err.value.code == "bad_generation_option", err.value
    on = ask(chat_template_kwargs={"enable_thinking": True, "truncate_history_thinking": False})  # after the errors
    local_on = engine.chat(HISTORY, max_new_tokens=4, ignore_eos=True, thinking=True,
                           template_kwargs={"truncate_history_thinking": False})
    assert (on.usage.prompt_tokens, on.choices[0].message.reasoning_content) == (
        local_on.stats.prompt_tokens, local_on.reasoning) and local_on.reasoning
    assert ask().usage.prompt_tokens == plain.usage.prompt_tokens  # the variable did not stick to the server


def test_remote_engine_sends_the_option_where_vllm_reads_it(engine, served):
    from vl.server.client import RemoteEngine

    remote = RemoteEngine(served)
    body = remote.request_body(HISTORY, template_kwargs={"truncate_history_thinking": False}, thinking=True)
    assert body["chat_template_kwargs"] == {"truncate_history_thinking": False, "enable_thinking": True}
    for kwargs in ({}, {"template_kwargs": {"truncate_history_thinking": False}}):
        got = remote.chat(HISTORY, max_new_tokens=4, ignore_eos=True, **kwargs)
        want = engine.chat(HISTORY, max_new_tokens=4, ignore_eos=True, **kwargs)
        assert (got.stats.prompt_tokens, got.answer) == (want.stats.prompt_tokens, want.answer)


def test_a_deployments_defaults_sit_under_each_requests_own(engine):
    """`vl serve --default-chat-template-kwargs JSON` (vLLM's flag): its variables apply to every request under the
    request's own `chat_template_kwargs`, and its `enable_thinking` is the mode of a request that sets none (no
    option, no `reasoning_effort`, no /think or /no_think), in a row of requests on one server."""
    from vl.server.cli import build, parse_args
    from vl.server.template_defaults import TemplateDefaults

    flag = '{"enable_thinking": true, "truncate_history_thinking": false}'
    defaults = parse_args(["--default-chat-template-kwargs", flag]).template_defaults
    assert defaults == TemplateDefaults(True, {"truncate_history_thinking": False})
    _, scheduler, config, _ = build(parse_args(["--default-chat-template-kwargs", flag, "--prepare-workers", "0"]))
    scheduler.close()
    assert config.template_defaults == defaults  # what `vl serve` serves with
    for bad in ("[1]", "{", '{"enable_thinking": "yes"}', '{"messages": 1}'):
        with pytest.raises(SystemExit):  # argparse's usage error, before any model loads
            parse_args(["--default-chat-template-kwargs", bad])
    with in_process_server(engine, served_names=("n3",), template_defaults=defaults) as (base, _):
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)

        def ask(messages=HISTORY, **kwargs):
            r = client.chat.completions.create(model="n3", messages=messages, max_tokens=4, temperature=0,
                                               extra_body={"ignore_eos": True, **kwargs})
            return r.usage.prompt_tokens, r.choices[0].message.content, r.choices[0].message.reasoning_content

        def want(messages=HISTORY, **kwargs):
            got = engine.chat(messages, max_new_tokens=4, ignore_eos=True, **kwargs)
            return got.stats.prompt_tokens, got.answer or None, got.reasoning or None

        kept = {"truncate_history_thinking": False}
        assert ask() == want(thinking=True, template_kwargs=kept)  # both defaults
        assert ask(chat_template_kwargs={"truncate_history_thinking": True}) == want(
            thinking=True, template_kwargs={"truncate_history_thinking": True})  # the request's value wins
        assert ask(chat_template_kwargs={"enable_thinking": False}) == want(thinking=False, template_kwargs=kept)
        assert ask(reasoning_effort="none") == want(thinking=False, template_kwargs=kept)
        no_think = HISTORY[:-1] + [{"role": "user", "content": "And 3+3? /no_think"}]
        assert ask(no_think) == want(no_think, template_kwargs=kept)  # a toggle in the messages is the request's
        assert ask() == want(thinking=True, template_kwargs=kept)  # and the next request has the defaults again
