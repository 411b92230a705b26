"""vl/hf/model.py `generate` collects the engine's one generation loop (vl/runtime/batch.py): the loop's features
(time limit, cancellation, reasoning budget, per-row prompts for the repetition penalty) reach transformers callers
and give the tokens `vl.Engine` gives. A tiny random checkpoint (tests/tiny_models.py); the pipeline and the engine
are loaded independently from it.
"""

import threading

import pytest
import torch
from PIL import Image

import vl
from tiny_models import make_tiny_vl_dir
from vl.errors import GenerationOptionError

transformers = pytest.importorskip("transformers")
from transformers import AutoConfig, AutoModelForImageTextToText, pipeline  # noqa: E402


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny_vl_dir(tmp_path_factory.mktemp("hf_generate"))


@pytest.fixture(scope="module")
def pipe(tiny_dir):
    return pipeline("image-text-to-text", model=str(tiny_dir), device="cpu")


@pytest.fixture(scope="module")
def engine(tiny_dir):
    return vl.Engine.from_pretrained(tiny_dir)


def chat(color="red", text="What is this?"):
    return [{"role": "user", "content": [{"type": "image", "image": Image.new("RGB", (150, 90), color)},
                                         {"type": "text", "text": text}]}]


def inputs_of(pipe, chats, **kwargs):
    return pipe.processor.apply_chat_template(chats, add_generation_prompt=True, tokenize=True, return_dict=True,
                                              **kwargs)


def new_ids(inputs, seqs) -> list[list[int]]:
    return seqs[:, inputs["input_ids"].shape[1]:].tolist()


def test_time_limit_ends_generation_like_the_engine(pipe, engine):
    inputs = inputs_of(pipe, chat())
    want = engine.chat(chat(), max_new_tokens=8, timeout_s=1e-6)
    assert want.finish_reason == "timeout" and len(want.token_ids) == 1  # the deadline passed during the prefill
    got = new_ids(inputs, pipe.model.generate(**inputs, max_new_tokens=8, max_time=1e-6))
    assert got == [want.token_ids]
    with pytest.raises(GenerationOptionError, match="timeout_s must be > 0"):
        pipe.model.generate(**inputs, max_new_tokens=2, max_time=0.0)


def test_cancel_stops_at_the_next_token(pipe, engine):
    inputs = inputs_of(pipe, chat())
    full = engine.chat(chat(), max_new_tokens=8)
    assert full.finish_reason == "length"
    cancel = threading.Event()

    class CancelAfterThree:  # a streamer that cancels once three new tokens have arrived
        seen = 0

        def put(self, value):
            if value.ndim == 1:  # new tokens (the prompt comes first, as (1, t))
                self.seen += 1
                if self.seen == 3:
                    cancel.set()

        def end(self):
            pass

    seqs = pipe.model.generate(**inputs, max_new_tokens=8, cancel=cancel, streamer=CancelAfterThree())
    assert new_ids(inputs, seqs) == [full.token_ids[:3]]
    cancel.clear()
    already = threading.Event()
    already.set()  # set before the start: nothing is generated
    assert new_ids(inputs, pipe.model.generate(**inputs, max_new_tokens=8, cancel=already)) == [[]]


def test_reasoning_budget_equals_the_engine(pipe, engine):
    want = engine.chat(chat(), max_new_tokens=16, thinking=True, reasoning_budget=1)
    assert any("reasoning cut" in n for n in want.stats.notes), "the budget did not act: the test shows nothing"
    inputs = inputs_of(pipe, chat(), thinking=True)
    got = new_ids(inputs, pipe.model.generate(**inputs, max_new_tokens=16, reasoning_budget=1))[0]
    stop = got[len(want.token_ids):]  # the engine's ids leave the stop token out; transformers keeps it
    assert got[:len(want.token_ids)] == want.token_ids and len(stop) <= 1
    # given to the pipeline call directly, the option reaches generate
    text = pipe(text=chat(), max_new_tokens=16, thinking=True, reasoning_budget=1, return_full_text=False,
                skip_special_tokens=False)[0]["generated_text"]
    assert text.startswith(want.text)


def test_batch_with_repetition_penalty_equals_the_engine(pipe, engine):
    """Each row's penalty counts its own prompt (not another row's left padding)."""
    chats = [chat("red"), [{"role": "user", "content": "left right"}], chat("green", "Which colour?")]
    inputs = inputs_of(pipe, chats)
    got = new_ids(inputs, pipe.model.generate(**inputs, max_new_tokens=6, repetition_penalty=1.5))
    want = engine.chat_batch(chats, max_new_tokens=6, repetition_penalty=1.5)
    for row, res in zip(got, want):
        assert row[:len(res.token_ids)] == res.token_ids
    assert [r.token_ids for r in want] == [r.token_ids for r in
                                           (engine.chat(c, max_new_tokens=6, repetition_penalty=1.5) for c in chats)]


def test_min_new_tokens_masks_the_eos_ids(pipe):
    """transformers' `min_new_tokens` is the engine's `min_tokens`: the eos ids cannot come before it."""
    inputs = inputs_of(pipe, chat())
    free = new_ids(inputs, pipe.model.generate(**inputs, max_new_tokens=8))[0]  # the tiny model never stops
    eos = free[2]
    first = free.index(eos)
    assert new_ids(inputs, pipe.model.generate(**inputs, max_new_tokens=8, eos_token_id=eos))[0][:first + 1] == \
        free[:first + 1]  # it stops there, the rest is padding
    got = new_ids(inputs, pipe.model.generate(**inputs, max_new_tokens=8, eos_token_id=eos, min_new_tokens=6))[0]
    assert got[:first] == free[:first] and eos not in got[:6]
    with pytest.raises(GenerationOptionError, match="min_tokens=9 is above max_new_tokens"):
        pipe.model.generate(**inputs, max_new_tokens=8, min_new_tokens=9)


def test_model_without_engine_generates_with_a_tokenizer(pipe, tiny_dir):
    """A wrapper built without the loader (as from_config builds one) has no tokenizer of its own."""
    built = AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(tiny_dir))
    assert built.engine is None
    model = type(pipe.model)(pipe.model.config, model=pipe.model.model)  # the same weights, no engine
    inputs = inputs_of(pipe, chat())
    with pytest.raises(GenerationOptionError, match="tokenizer=processor.tokenizer"):
        model.generate(**inputs, max_new_tokens=4)
    got = model.generate(**inputs, max_new_tokens=4, tokenizer=pipe.processor.tokenizer)
    assert torch.equal(got, pipe.model.generate(**inputs, max_new_tokens=4))


def test_bf16_pipeline_equals_the_bf16_engine(tiny_dir):
    """The pipeline casts the tiles to the model's dtype before generate; the engine's vision cache takes them."""
    pipe16 = pipeline("image-text-to-text", model=str(tiny_dir), device="cpu", dtype=torch.bfloat16)
    assert pipe16.model.dtype == torch.bfloat16
    got = pipe16(text=chat(), max_new_tokens=6, return_full_text=False, skip_special_tokens=False)
    want = vl.Engine.from_pretrained(tiny_dir, dtype="bf16").chat(chat(), max_new_tokens=6)
    assert want.finish_reason == "length" and got[0]["generated_text"] == want.text
