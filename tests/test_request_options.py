"""RequestOptions (vl/options.py): every per-request option is declared once, and each front end derives what it
accepts from the declaration. The tests run over every declared option, so an option added to the record is
checked here without a new test: its flag reaches `vl chat` and `vl eval`, its request key the server and
`RemoteEngine`, its keyword the pipeline, its name `RunConfig` and `--sweep`; one range everywhere."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json

import pytest

from vl.errors import GenerationOptionError, InputError
from vl.options import ACTS, RequestOptions, canonical, names, option_aliases, spec, specs


def other_value(s):
    """A valid value of the option that differs from its default."""
    default = getattr(RequestOptions(), s.name)
    if s.kind is bool:
        return not default if default is not None else True
    if s.kind is str:
        return "1-2"
    if s.kind is dict:
        return {"truncate_history_thinking": False, "label": "x"}
    lo = s.lo if s.lo is not None else 0
    hi = s.hi if s.hi is not None else lo + 10
    for v in (lo + 1, (lo + hi) / 2, hi):
        v = s.kind(v)
        if v != default:
            try:
                return s.check(v)
            except GenerationOptionError:
                continue
    raise AssertionError(f"no other valid value for {s.name}")


def out_of_range(s):
    """A value just outside the option's range (None when it has none)."""
    if s.hi is not None:
        return s.kind(s.hi) if s.hi_open else s.kind(s.hi + 1)
    if s.lo is not None:
        return s.kind(s.lo) if s.lo_open else s.kind(s.lo - 1)
    return None


ALL = [s.name for s in specs()]
RANGED = [s.name for s in specs() if out_of_range(s) is not None]


def test_declarations_are_whole_and_names_are_unique():
    assert len(set(option_aliases())) == len(option_aliases())  # no alias shadows a name or another alias
    flags = [s.flag for s in specs() if s.flag]
    assert len(flags) == len(set(flags)) and all(f.startswith("--") for f in flags)
    for s in specs():
        assert s.acts in ACTS and s.help and s.kind in (int, float, bool, str, dict), s
        assert s.check(getattr(RequestOptions(), s.name)) == getattr(RequestOptions(), s.name)  # default is valid
    assert canonical("max_tiles") == "max_num_tiles" and canonical("evs") == "video_pruning_rate"
    assert canonical("no_such_option") is None


@pytest.mark.parametrize("name", RANGED)
def test_one_range_refused_with_a_typed_error_naming_the_option(name):
    s = spec(name)
    with pytest.raises(GenerationOptionError, match=name):
        RequestOptions(**{name: out_of_range(s)})
    if s.kind is int:
        with pytest.raises(GenerationOptionError, match="integer"):
            RequestOptions(**{name: 2.5})
        with pytest.raises(GenerationOptionError):
            RequestOptions(**{name: True})  # a bool is not a number here


def test_keywords_aliases_and_normalisation():
    o = RequestOptions.from_kwargs(max_tiles=3, evs=0.5, fps=1)
    assert (o.max_num_tiles, o.video_pruning_rate, o.fps) == (3, 0.5, 1.0) and isinstance(o.fps, float)
    with pytest.raises(GenerationOptionError, match="given twice"):
        RequestOptions.from_kwargs(max_tiles=3, max_num_tiles=4)
    with pytest.raises(GenerationOptionError, match=r"unknown option\(s\) \['top_q'\]"):
        RequestOptions.from_kwargs(top_q=0.5)
    assert o.replace(fps=4.0).fps == 4.0 and o.fps == 1.0  # frozen: replace gives a new record, checked
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.fps = 3.0  # type: ignore[misc]


def test_processor_kwargs_are_the_processor_options_that_are_set():
    o = RequestOptions(max_num_tiles=2, video_pruning_rate=0.5, max_new_tokens=9)
    kw = o.processor_kwargs()
    assert kw["max_num_tiles"] == 2 and set(kw) <= set(names(acts="processor"))
    assert "video_pruning_rate" not in kw and "max_new_tokens" not in kw and "pages" not in kw  # None: left out
    import inspect

    from vl.processing.processor import Processor

    accepted = set(inspect.signature(Processor.__call__).parameters)
    assert set(names(acts="processor")) <= accepted  # every processor option is a keyword of the processor


# --- the front ends ------------------------------------------------------------------------------------------
def _chat_parser():
    from vl.cli.flags import add_generation_flags, add_media_flags

    p = argparse.ArgumentParser()
    add_media_flags(p)
    add_generation_flags(p)
    return p


def _argv(s, value):
    if s.kind is bool:
        return [s.flag] if s.nullable is False else [s.flag, "on" if value else "off"]
    if s.kind is dict:  # NAME=VALUE, repeated; VALUE read as JSON, else as text
        return [a for k, v in value.items() for a in (s.flag, f"{k}={json.dumps(v)}")]
    return [s.flag, str(value)]


@pytest.mark.parametrize("name", [n for n in ALL if spec(n).flag])
def test_every_flag_reaches_vl_chat(name):
    from vl.cli.flags import options_from_args

    s, p = spec(name), _chat_parser()
    value = other_value(s)
    defaults = options_from_args(p.parse_args([]))  # the record's defaults, or the command's own (--max-pages)
    assert options_from_args(p.parse_args(_argv(s, value))) == defaults.replace(**{name: value})
    bad = out_of_range(s)
    if bad is not None:
        with pytest.raises(GenerationOptionError, match=s.flag):  # the same range as everywhere, named by flag
            options_from_args(p.parse_args([s.flag, str(bad)]))


@pytest.mark.parametrize("name", [n for n in ALL if spec(n).openai])
def test_every_request_key_reaches_the_server_and_remote_engine_sends_it(name):
    from vl.server.media import MediaPolicy
    from vl.server.request import Ceilings, parse_chat_request

    s = spec(name)
    value = other_value(s)
    ceilings = Ceilings(max_tokens=4096, max_frames=512)
    options = RequestOptions(**{name: value})
    body = {"messages": [{"role": "user", "content": "hi"}], **options.to_openai()}
    if name not in ("max_new_tokens", "max_frames"):  # those two the server defaults to its own values
        assert body != {"messages": body["messages"], **RequestOptions().to_openai()}
    parsed = parse_chat_request(body, served_names=("m",), policy=MediaPolicy(), ceilings=ceilings)
    assert getattr(parsed.chat.options, name) == value
    bad = out_of_range(s)
    if bad is not None:
        head, _, key = s.openai.rpartition(".")
        wrong = {**body, **({head: {key: bad}} if head else {key: bad})}
        with pytest.raises(GenerationOptionError):
            parse_chat_request(wrong, served_names=("m",), policy=MediaPolicy(), ceilings=ceilings)


def test_server_reads_vllm_spellings_and_refuses_unknown_keys():
    from vl.server.media import MediaPolicy
    from vl.server.request import Ceilings, parse_chat_request

    def parse(**body):
        return parse_chat_request({"messages": [{"role": "user", "content": "hi"}], **body}, served_names=("m",),
                                  policy=MediaPolicy(), ceilings=Ceilings()).chat.options

    assert parse(max_tokens=5, max_completion_tokens=7).max_new_tokens == 7  # OpenAI's newer name wins
    assert parse(chat_template_kwargs={"enable_thinking": False}).thinking is False
    assert parse(thinking=True).thinking is True
    with pytest.raises(GenerationOptionError, match="not supported"):
        parse(mm_processor_kwargs={"size": 9})
    with pytest.raises(InputError):
        parse(mm_processor_kwargs=[1])
    with pytest.raises(GenerationOptionError, match="limit of 8"):  # a deployment ceiling over the range
        parse_chat_request({"messages": [{"role": "user", "content": "hi"}],
                            "mm_processor_kwargs": {"max_num_tiles": 9}}, served_names=("m",),
                           policy=MediaPolicy(), ceilings=Ceilings(max_num_tiles=8))


@pytest.mark.parametrize("name", [n for n in ALL if spec(n).pipeline])
def test_every_pipeline_option_is_a_processor_keyword(name):
    from vl.hf.processor import OUR_KEYS

    assert name in OUR_KEYS and all(a in OUR_KEYS for a in spec(name).aliases)


@pytest.mark.parametrize("name", [n for n in ALL if spec(n).eval])
def test_every_eval_option_is_a_run_setting_and_a_sweep_key(name, tmp_path):
    from eval.backend import GenerationSettings
    from eval.runner import RunConfig, RunOptionError
    from eval.sweep import SWEEP_KEYS, parse_sweep

    s, value = spec(name), other_value(spec(name))
    cfg = RunConfig(task="synthetic_docs", data="d.jsonl", out=str(tmp_path), **{name: value})
    assert getattr(cfg, name) == value
    settings = GenerationSettings(**{"max_new_tokens": 8, name: value})
    assert getattr(settings.options(), name) == value
    for key in (name,) + s.aliases:
        assert SWEEP_KEYS[key][0] == name
    text = ("on" if value else "off") if s.kind is bool else str(value)
    assert parse_sweep(f"{name}={text}") == (name, [value])
    bad = out_of_range(s)
    if bad is not None:
        with pytest.raises(RunOptionError, match=name):
            RunConfig(task="synthetic_docs", data="d.jsonl", out=str(tmp_path), **{name: bad})


def test_eval_flags_are_derived_too(tmp_path):
    from eval.__main__ import build_parser, config_from_args

    args = build_parser().parse_args(["--model", str(tmp_path), "--task", "synthetic_docs", "--data", "d.jsonl",
                                      "--out", str(tmp_path), "--max-tiles", "3", "--skip-blank-tiles", "on",
                                      "--video-pruning-rate", "0.97"])
    cfg = config_from_args(args)
    assert (cfg.max_num_tiles, cfg.skip_blank_tiles, cfg.video_pruning_rate, cfg.thinking) == (3, True, 0.97, False)


def test_app_bounds_are_the_records():
    from ui.limits import check_option, slider_max

    assert slider_max("video_pruning_rate", 0.05) == 0.95 and slider_max("max_num_tiles", 1) == 12
    assert check_option("EVS rate", "video_pruning_rate", 0.97) == 0.97  # the record's [0, 1), as the server's
    assert check_option("tiles", "max_num_tiles", 3.0) == 3
    with pytest.raises(GenerationOptionError, match="EVS rate"):
        check_option("EVS rate", "video_pruning_rate", 1.0)
    with pytest.raises(GenerationOptionError, match="at most 8 in this app"):
        check_option("tiles", "max_num_tiles", 9, cap=8)


# --- max_pages: an option added by one field in vl/options.py and its use in vl/processing/processor.py -------
@pytest.fixture(scope="module")
def pdf_engine(tmp_path_factory):
    from tiny_models import make_tiny_vl_dir
    from vl.runtime.engine import Engine

    return Engine.from_pretrained(make_tiny_vl_dir(tmp_path_factory.mktemp("tiny_vl")))


@pytest.fixture(scope="module")
def three_pages(tmp_path_factory):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent / "processing"))
    from media_fixtures import make_pdf, red_square_page

    path = tmp_path_factory.mktemp("pdf") / "three.pdf"
    path.write_bytes(make_pdf([red_square_page()] * 3))
    return path


def _pdf_chat(path):
    return [{"role": "user", "content": [{"type": "pdf", "pdf": str(path)}, {"type": "text", "text": "Total?"}]}]


def test_max_pages_caps_the_pages_of_a_request(pdf_engine, three_pages):
    from vl.errors import MediaTooLargeError

    with pytest.raises(MediaTooLargeError, match="3 pages selected, at most 2"):  # Engine.chat keyword
        pdf_engine.chat(_pdf_chat(three_pages), max_pages=2, max_new_tokens=2)
    capped = pdf_engine.chat(_pdf_chat(three_pages), RequestOptions(max_pages=2, pages="2-3", max_new_tokens=2))
    two = pdf_engine.chat(_pdf_chat(three_pages), pages="2-3", max_new_tokens=2)
    three = pdf_engine.chat(_pdf_chat(three_pages), max_pages=3, max_new_tokens=2)
    assert 0 < capped.stats.vision_tokens_before == two.stats.vision_tokens_before < three.stats.vision_tokens_before
    strict = dataclasses.replace(pdf_engine.processor.limits, max_pdf_pages=1)
    processor = copy.copy(pdf_engine.processor)
    processor.limits = strict
    with pytest.raises(MediaTooLargeError, match="at most 1"):  # it lowers the processor's cap, never raises it
        processor(_pdf_chat(three_pages), max_pages=5)


def test_max_pages_reaches_every_front_end(pdf_engine, three_pages, tmp_path, capsys):
    import json

    from eval.backend import EngineBackend, GenerationSettings
    from eval.runner import RunConfig
    from eval.sweep import parse_sweep
    from vl.cli.chat import main as chat_main
    from vl.cli.flags import options_from_args
    from vl.errors import MediaTooLargeError
    from vl.hf.processor import NemotronNanoVLV2Processor
    from vl.server.media import MediaPolicy
    from vl.server.request import Ceilings, parse_chat_request

    # vl chat: the flag, checked before any model loads; its default is the interactive cap
    from vl.cli.flags import INTERACTIVE_PDF_PAGES

    assert options_from_args(_chat_parser().parse_args([])).max_pages == INTERACTIVE_PDF_PAGES
    assert options_from_args(_chat_parser().parse_args(["--max-pages", "2"])).max_pages == 2
    assert chat_main(["--pdf", str(three_pages), "--max-pages", "0", "--prompt", "x", "--json"]) == 2
    assert "--max-pages must be a positive integer" in json.loads(capsys.readouterr().out)["error"]["message"]
    # the server's request body (vLLM's mm_processor_kwargs) and RemoteEngine's
    body = {"messages": [{"role": "user", "content": "hi"}], "mm_processor_kwargs": {"max_pages": 2}}
    parsed = parse_chat_request(body, served_names=("m",), policy=MediaPolicy(), ceilings=Ceilings())
    assert parsed.chat.options.max_pages == 2
    assert RequestOptions(max_pages=2).to_openai()["mm_processor_kwargs"] == {"max_pages": 2}
    # the pipeline's keyword (apply_chat_template, where the pipeline sends it)
    hf = NemotronNanoVLV2Processor(vl_processor=pdf_engine.processor)
    with pytest.raises(MediaTooLargeError, match="at most 2"):
        hf.apply_chat_template(_pdf_chat(three_pages), add_generation_prompt=True, tokenize=True, max_pages=2)
    # eval: a RunConfig field, a sweep key, and the backend hands it to Engine.chat
    assert RunConfig(task="synthetic_docs", data="d.jsonl", out=str(tmp_path), max_pages=2).max_pages == 2
    assert parse_sweep("max_pages=1,2") == ("max_pages", [1, 2])
    with pytest.raises(MediaTooLargeError, match="at most 2"):
        EngineBackend(model="", engine=pdf_engine).generate([_pdf_chat(three_pages)],
                                                              GenerationSettings(max_new_tokens=2, max_pages=2))


# --- thinking: one default, declared once, in every front end --------------------------------------------------
def test_one_reasoning_default_in_every_front_end(pdf_engine, tmp_path):
    """Off unless asked for: the option (`RequestOptions.thinking`), else a /think or /no_think in the messages,
    else `DEFAULT_THINKING` (off). `vl chat`, `Engine.chat`, the pipeline, eval, the server and `RemoteEngine`'s
    body all resolve it the same way."""
    from eval.runner import RunConfig
    from vl.cli.flags import options_from_args
    from vl.hf.processor import NemotronNanoVLV2Processor
    from vl.options import DEFAULT_THINKING
    from vl.server.client import RemoteEngine
    from vl.server.media import MediaPolicy
    from vl.server.request import Ceilings, parse_chat_request

    assert DEFAULT_THINKING is False and RequestOptions().thinking is None
    chat = [{"role": "user", "content": "Hi"}]
    asks = [{"role": "system", "content": "/think"}, {"role": "user", "content": "Hi"}]
    # vl chat: no flag = unset; the flag alone, or `on`, turns it on
    for argv, want in (([], None), (["--thinking"], True), (["--thinking", "on"], True),
                       (["--thinking", "off"], False)):
        assert options_from_args(_chat_parser().parse_args(argv)).thinking is want, argv
    # Engine.chat and the pipeline's processor render the same prompt: off when nothing asks, on when a message does
    off = pdf_engine.processor(chat, thinking=False).text
    on = pdf_engine.processor(asks, thinking=True).text
    assert off.endswith("<think></think>") and on.endswith("<think>\n")
    assert pdf_engine.prepare(chat)[1].text == off and pdf_engine.prepare(asks)[1].text == on
    assert pdf_engine.prepare(asks, RequestOptions(thinking=False))[1].text.endswith("<think></think>")  # the option wins
    hf = NemotronNanoVLV2Processor(vl_processor=pdf_engine.processor)
    assert hf.apply_chat_template(chat, add_generation_prompt=True) == off
    assert hf.apply_chat_template(asks, add_generation_prompt=True) == on
    assert hf.apply_chat_template(chat, add_generation_prompt=True, enable_thinking=True).endswith("<think>\n")
    # eval runs say it outright (a run's fingerprint names its mode): off, as the scoring rules' primary runs
    assert RunConfig(task="synthetic_docs", data="d.jsonl", out=str(tmp_path)).thinking is DEFAULT_THINKING

    # the server: unset unless the body says (vLLM's chat_template_kwargs.enable_thinking, or reasoning_effort)
    def parse(messages=chat, **body):
        return parse_chat_request({"messages": messages, **body}, served_names=("m",), policy=MediaPolicy(),
                                  ceilings=Ceilings()).chat.options.thinking

    assert parse() is None and parse(asks) is None and parse(chat_template_kwargs={"enable_thinking": True}) is True
    # RemoteEngine: a foreign server's own default (vLLM: the card's, on) differs, so an unset option with no toggle
    # in the messages is sent as off; a toggle in the messages is left to the server's template
    remote = RemoteEngine("http://127.0.0.1:9/v1", model="m")
    assert remote.request_body(chat)["chat_template_kwargs"] == {"enable_thinking": False}
    assert "chat_template_kwargs" not in remote.request_body(asks)
    assert remote.request_body(asks, thinking=True)["chat_template_kwargs"] == {"enable_thinking": True}


def test_an_integer_too_large_for_a_float_option_is_a_typed_error():
    """10**400 cannot become a float: `Spec.check` says so by name (the one validator), never an OverflowError."""
    with pytest.raises(GenerationOptionError, match=r"fps must be in \(0, 30\], found an integer of 401 digits"):
        RequestOptions(fps=10**400)
    with pytest.raises(GenerationOptionError, match="token_pruning_rate"):
        RequestOptions.from_kwargs(token_pruning_rate=-(10**400))
