"""vl.Engine: chat vs token level, streaming, reasoning, batching, placement, errors."""

import gc
import threading
from pathlib import Path

import pytest
import torch
from PIL import Image

import vl
from tiny_models import make_tiny_vl_dir
from vl.config import LMConfig
from vl.errors import ContextLengthError, GenerationOptionError
from vl.modeling.nemotron_h import CausalLMOutput
from vl.processing.chat import THINK_CLOSE
from vl.runtime.engine import Engine


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny_vl_dir(tmp_path_factory.mktemp("tiny_vl"))


@pytest.fixture(scope="module")
def engine(tiny_dir):
    return Engine.from_pretrained(tiny_dir)


def image_msgs(color="red", text="What is this?", system=None):
    msgs = [{"role": "system", "content": system}] if system else []
    return msgs + [{"role": "user", "content": [{"type": "image", "image": Image.new("RGB", (150, 90), color)},
                                                {"type": "text", "text": text}]}]


def test_chat_greedy_equals_generate_ids(engine):
    text_only = [{"role": "user", "content": "Describe the image."}]
    res = engine.chat(text_only, max_new_tokens=24)
    ids = engine.processor(text_only, thinking=False).input_ids  # Engine.chat's default: reasoning off
    raw = engine.generate_ids(ids, max_new_tokens=24)[0].tolist()
    assert res.token_ids == [t for t in raw if t not in engine.stop_ids][:len(res.token_ids)]
    assert len(res.token_ids) > 0


def test_stream_concatenates_to_the_result(engine):
    full = engine.chat(image_msgs(), max_new_tokens=30)
    stream = engine.chat(image_msgs(), max_new_tokens=30, stream=True)
    events = list(stream)
    assert {e.kind for e in events} <= {"reasoning", "answer"}
    assert "".join(e.text for e in events if e.kind == "reasoning").strip() == full.reasoning
    assert "".join(e.text for e in events if e.kind == "answer").strip() == full.answer
    assert stream.result.token_ids == full.token_ids
    assert full.stats.vision_tokens_before == full.stats.vision_tokens_after > 0


def test_thinking_off_prompt_and_vision_cache(engine):
    inputs = engine.processor(image_msgs(), thinking=False)
    assert inputs.text.endswith("<think></think>")
    assert engine.processor(image_msgs(system="/no_think")).text.endswith("<think></think>")
    assert engine.processor(image_msgs()).text.endswith("<think></think>")  # unset: off (vl.options.DEFAULT_THINKING)
    assert engine.processor(image_msgs(system="/think")).text.endswith("<think>\n")
    engine.chat(image_msgs("blue"), max_new_tokens=2)
    again = engine.chat(image_msgs("blue", text="And now?"), max_new_tokens=2)
    assert again.stats.vision_cache_hits == 1  # the follow-up did not re-encode the image


def test_seeded_sampling_is_reproducible(engine):
    a = engine.chat(image_msgs(), max_new_tokens=16, temperature=0.9, top_p=0.9, seed=7)
    b = engine.chat(image_msgs(), max_new_tokens=16, temperature=0.9, top_p=0.9, seed=7)
    assert a.token_ids == b.token_ids


def test_chat_batch_equals_singles(engine):
    convs = [image_msgs("red"), [{"role": "user", "content": "left right"}], image_msgs("green", "Which colour?")]
    batch = engine.chat_batch(convs, max_new_tokens=12)
    for conv, res in zip(convs, batch):
        assert res.token_ids == engine.chat(conv, max_new_tokens=12).token_ids


def test_errors_come_before_any_work(engine, monkeypatch):
    calls = []
    monkeypatch.setattr(engine.lm, "forward", lambda *a, **k: calls.append(1))
    with pytest.raises(GenerationOptionError, match="max_new_tokens must be a positive integer"):
        engine.chat(image_msgs(), max_new_tokens=0)
    with pytest.raises(GenerationOptionError, match=r"unknown option\(s\) \['top_q'\]"):
        engine.chat(image_msgs(), top_q=0.5)
    with pytest.raises(GenerationOptionError, match="temperature must be >= 0"):
        engine.chat(image_msgs(), temperature=-1)
    limit = engine.context_length
    with pytest.raises(ContextLengthError, match=rf"exceeds the model's context of {limit}"):
        engine.chat(image_msgs(), max_new_tokens=limit)
    long_text = [{"role": "user", "content": "left right " * limit}]
    with pytest.raises(ContextLengthError, match=rf"tokens but the model's context is {limit}"):
        engine.chat(long_text, max_new_tokens=4)
    assert calls == []


def test_stop_string_and_cancel(engine):
    full = engine.chat(image_msgs(), max_new_tokens=30)
    cut = full.text[5:9]
    res = engine.chat(image_msgs(), max_new_tokens=30, stop=[cut])
    assert res.finish_reason == "stop_string" and cut not in res.text and full.text.startswith(res.text)
    flag = threading.Event()
    flag.set()
    assert engine.chat(image_msgs(), max_new_tokens=30, cancel=flag).finish_reason == "cancelled"


def test_device_map_auto_with_offload_gives_the_same_logits(tiny_dir):
    ref = vl.load_pretrained(tiny_dir)
    size = sum(p.numel() * p.element_size() for p in ref.parameters())
    placed = vl.load_pretrained(tiny_dir, device_map="auto", max_memory={"cpu": int(size * 0.6)})
    assert "disk" in set(placed.device_map.values())  # the budget really forced offload
    proc = vl.load_processor(tiny_dir)
    inputs = proc(image_msgs())
    with torch.no_grad():
        a = ref(inputs.input_ids, inputs.pixel_values).logits
        b = placed(inputs.input_ids, inputs.pixel_values).logits
    assert torch.equal(a, b)
    # the offloaded copy lives in a folder of our own, removed with the model (not left in /tmp at every load)
    folder = Path(placed.offload_dir)
    assert folder.is_dir() and any(folder.iterdir())
    del placed
    gc.collect()
    assert not folder.exists()


# --- a scripted language model: deterministic reasoning/answer behaviour without trained weights ---------

class ScriptedLM(torch.nn.Module):
    """Emits `script` token by token (then `tail` forever), whatever the input: an engine test double."""

    def __init__(self, vocab, script, tail):
        super().__init__()
        self.config = LMConfig(vocab_size=vocab, hidden_size=8, pattern="-", intermediate_size=8)
        self.backbone = torch.nn.Module()
        self.backbone.embeddings = torch.nn.Embedding(vocab, 8)
        self.script, self.tail, self.vocab = list(script), tail, vocab
        self.pos = 0

    def embed(self, ids):
        return self.backbone.embeddings(ids)

    def forward(self, input_ids=None, inputs_embeds=None, cache=None, logits_to_keep=0, **_):
        x = inputs_embeds if inputs_embeds is not None else self.embed(input_ids)
        tok = self.script[self.pos] if self.pos < len(self.script) else self.tail
        self.pos += 1
        logits = torch.full((x.shape[0], 1, self.vocab), -10.0)
        logits[..., tok] = 10.0
        return CausalLMOutput(logits, x)


def scripted_engine(tiny_dir, words_then):
    proc = vl.load_processor(tiny_dir)
    tok = proc.tokenizer
    script = [i for w in words_then for i in tok.encode(w, add_special_tokens=False)]
    return Engine(ScriptedLM(len(tok), script, tail=tok.encode("left", add_special_tokens=False)[0]), proc), tok


def test_reasoning_budget_cuts_and_the_answer_follows(tiny_dir):
    eos = "<SPECIAL_12>"
    eng, tok = scripted_engine(tiny_dir, [])  # reasons "left" forever
    res = eng.chat([{"role": "user", "content": "hi"}], max_new_tokens=60, thinking=True, reasoning_budget=10)
    assert THINK_CLOSE in res.text and res.answer  # closed, and the model kept going with an answer
    n_reasoning = len(tok.encode(res.text.split(THINK_CLOSE)[0], add_special_tokens=False))
    assert 10 <= n_reasoning <= 10 + 4 + 1  # budget + grace to finish the line (+ the forced newline)
    assert any("budget" in n for n in res.stats.notes)
    eng, _ = scripted_engine(tiny_dir, [" up up\n", THINK_CLOSE, " down", eos])
    res = eng.chat([{"role": "user", "content": "hi"}], max_new_tokens=60, thinking=True, reasoning_budget=50)
    assert (res.reasoning, res.answer, res.finish_reason) == ("up up", "down", "stop")  # under budget: untouched


def test_unclosed_reasoning_is_reported_truncated(tiny_dir):
    eng, _ = scripted_engine(tiny_dir, [])
    res = eng.chat([{"role": "user", "content": "hi"}], max_new_tokens=8, thinking=True)
    assert res.reasoning_truncated and res.answer == "" and res.finish_reason == "length"


def test_document_token_reduction_paths(engine):
    from PIL import ImageDraw

    page = Image.new("RGB", (256, 128), "white")
    ImageDraw.Draw(page).rectangle([10, 10, 50, 40], fill="black")  # ink in one corner tile only
    msgs = [{"role": "user", "content": [{"type": "image", "image": page}, {"type": "text", "text": "Read it."}]}]
    full = engine.chat(msgs, max_new_tokens=2, max_num_tiles=8)
    skipped = engine.chat(msgs, max_new_tokens=2, max_num_tiles=8, skip_blank_tiles=True)
    assert any("blank tile" in n for n in skipped.stats.notes)
    # skipped tiles never reach the encoder; "before" still counts them, so before -> after shows the skip
    assert skipped.stats.vision_tokens_before == full.stats.vision_tokens_before
    assert skipped.stats.vision_tokens_after < full.stats.vision_tokens_after == full.stats.vision_tokens_before
    assert skipped.stats.prompt_tokens < full.stats.prompt_tokens
    pruned = engine.chat(msgs, max_new_tokens=2, max_num_tiles=8, token_pruning_rate=0.9)
    assert pruned.stats.vision_tokens_after <= pruned.stats.vision_tokens_before
    assert pruned.stats.reductions and pruned.stats.reductions[0]["method"] == "redundant_tokens"


def test_stop_before_the_first_token_encodes_no_further_image(engine):
    """A stop while tiles are encoded (the user pressed Stop on a long document) ends the request there: no token,
    finish "cancelled", and the images after the stop were never encoded (the next request finds only the first
    one in the vision cache)."""
    images = [Image.new("RGB", (64, 64), c) for c in ("#102030", "#405060", "#708090")]
    msgs = [{"role": "user", "content": [{"type": "image", "image": im} for im in images]
             + [{"type": "text", "text": "Compare."}]}]
    cancel, seen = threading.Event(), []

    def progress(what, done, total):
        seen.append((what, done, total))
        if what == "encoding tiles" and done > 0:
            cancel.set()

    stopped = engine.chat(msgs, max_new_tokens=4, cancel=cancel, progress=progress)
    assert stopped.finish_reason == "cancelled" and stopped.token_ids == [] and stopped.answer == ""
    assert ("media ready", 3, 3) in seen
    again = engine.chat(msgs, max_new_tokens=2)
    assert again.stats.vision_cache_hits == 1, again.stats  # only the first image had been encoded


def test_stop_during_video_decoding_is_a_cancelled_answer(engine, tmp_path):
    """A Stop while a video's frames are decoded ends the decode at the next frame: no token, finish "cancelled",
    and the progress said "video frames decoded" frame by frame up to the stop."""
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "processing"))
    from media_fixtures import make_video

    clip = make_video(tmp_path / "clip.mp4", frames=40, fps=10)
    msgs = [{"role": "user", "content": [{"type": "video", "video": clip}, {"type": "text", "text": "What moves?"}]}]
    cancel, seen = threading.Event(), []

    def progress(what, done, total):
        seen.append((what, done, total))
        if what == "video frames decoded" and done == 2:
            cancel.set()

    stopped = engine.chat(msgs, max_new_tokens=4, cancel=cancel, progress=progress, max_frames=8)
    assert stopped.finish_reason == "cancelled" and stopped.token_ids == []
    frames = [(d, t) for w, d, t in seen if w == "video frames decoded"]
    assert frames == [(1, 8), (2, 8)], seen
