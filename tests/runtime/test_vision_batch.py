"""Requests whose media were processed ahead (`Engine.process`, as the server's preparation threads do) and that
join a batch together: their tiles go through the vision tower in one call (vl/runtime/vision_batch.py) and are
prefilled in one call (vl/runtime/batch.py). The vectors equal the ones encoded alone, every answer equals its
single run, a request that fails or is stopped fails alone, and the vision cache counts as it would one by one.
The tiny random model never stops by itself, so every row runs to its own limit (a sensitive comparison)."""

import io
import threading

import pytest
import torch
from PIL import Image

from tiny_models import make_tiny_vl_dir
from vl.errors import VLError
from vl.runtime.batch import ChatRequest, Processed
from vl.runtime.engine import ChatResult, Engine, Stats
from vl.runtime.sampling import SamplingParams
from vl.runtime.vision_batch import GroupVision


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return Engine.from_pretrained(make_tiny_vl_dir(tmp_path_factory.mktemp("tiny_vl")))


def image(color, size=(150, 90)):
    return Image.new("RGB", size, color)


def msgs(*images, text="What is this?"):
    return [{"role": "user", "content": [*({"type": "image", "image": im} for im in images),
                                         {"type": "text", "text": text}]}]


def ahead(engine):
    """The `processed` hook a server gives: each request's media processed on another thread, before."""
    done = {}

    def process(req):
        def run():
            try:
                inputs, stats = engine.process(req.messages, req.options)
                done[id(req)] = Processed(inputs, stats, 0.0)
            except VLError as e:
                done[id(req)] = e
        t = threading.Thread(target=run)
        t.start()
        t.join()

    def get(req):
        if id(req) not in done:
            process(req)
        got = done[id(req)]
        if isinstance(got, BaseException):
            raise got
        return got
    return get


def test_tiles_encoded_together_equal_tiles_encoded_alone(engine):
    engine._vision_cache._items.clear()
    inputs = [engine.process(msgs(image(c, size)))[0]
              for c, size in (("red", (150, 90)), ("blue", (300, 120)), ("green", (90, 200)))]
    group = GroupVision(engine, inputs)
    assert len(group.fresh) == 3 and sum(int(v.shape[0]) for v in group.fresh.values()) == sum(
        int(i.pixel_values.shape[0]) for i in inputs)
    for inp in inputs:
        alone = engine.model.encode_tiles(inp.pixel_values)
        together = group.get(inp.pixel_values, "image", lambda: pytest.fail("encoded again"))
        torch.testing.assert_close(together, alone, rtol=0, atol=0)


def test_a_shared_image_is_encoded_once_and_counted_as_a_cache_hit(engine):
    engine._vision_cache._items.clear()
    one, two = (engine.process(msgs(image("purple"), text=t)) for t in ("What is this?", "Which colour?"))
    group = GroupVision(engine, [one[0], two[0]])
    assert len(group.fresh) == 1
    e1 = engine.embed(one[0], one[1], vision_cache=group)
    e2 = engine.embed(two[0], two[1], vision_cache=group)
    assert (one[1].vision_cache_hits, two[1].vision_cache_hits) == (0, 1)  # as when they ran one after the other
    torch.testing.assert_close(e1, engine.prepare(msgs(image("purple")))[0], rtol=0, atol=0)
    assert e2.shape[1] == engine.prepare(msgs(image("purple"), text="Which colour?"))[0].shape[1]


def test_processed_ahead_and_joined_together_equal_single_runs(engine):
    requests = [ChatRequest(msgs(image("red")), max_new_tokens=6),
                ChatRequest(msgs(image("blue", (300, 120)), image("yellow")), max_new_tokens=9, thinking=False),
                ChatRequest(msgs(image("green", (90, 200))), max_new_tokens=4),
                ChatRequest([{"role": "user", "content": "left right"}], max_new_tokens=5, thinking=False)]
    refs = [engine.chat(r.messages, max_new_tokens=r.max_new_tokens, thinking=r.thinking) for r in requests]
    engine._vision_cache._items.clear()
    results = {}
    for i, item in engine.stream_batch(requests, SamplingParams(), processed=ahead(engine)):
        if isinstance(item, ChatResult):
            results[i] = item
    assert [results[i].token_ids for i in range(4)] == [r.token_ids for r in refs]
    assert [results[i].stats.prompt_tokens for i in range(4)] == [r.stats.prompt_tokens for r in refs]


def test_joiners_processed_ahead_equal_single_runs_and_fail_alone(engine):
    buf = io.BytesIO()
    image("white").save(buf, "PNG")
    corrupt = buf.getvalue()[:40]
    first = ChatRequest(msgs(image("red")), max_new_tokens=12)
    stopped = threading.Event()
    stopped.set()
    joiners = [ChatRequest(msgs(image("blue")), max_new_tokens=5),
               ChatRequest(msgs(corrupt), max_new_tokens=5),
               ChatRequest(msgs(image("green")), max_new_tokens=5, cancel=stopped),
               ChatRequest(msgs(image("orange", (200, 200))), max_new_tokens=7)]
    refs = {0: first, 1: joiners[0], 4: joiners[3]}
    refs = {i: engine.chat(r.messages, max_new_tokens=r.max_new_tokens) for i, r in refs.items()}
    handed = []

    def more(running):
        if handed:
            return []
        handed.append(running)
        return joiners

    results = {}
    for i, item in engine.stream_batch([first], SamplingParams(), more=more, processed=ahead(engine)):
        if not hasattr(item, "kind"):
            results[i] = item
    assert handed == [1]
    assert {i: results[i].token_ids for i in refs} == {i: r.token_ids for i, r in refs.items()}
    assert isinstance(results[2], VLError) and results[2].code in ("corrupt_media", "bad_media", "unsupported_format")
    assert isinstance(results[3], ChatResult) and results[3].finish_reason == "cancelled"


def test_a_failing_process_hook_fails_its_request_alone(engine):
    good = ChatRequest(msgs(image("red")), max_new_tokens=4)
    bad = ChatRequest(msgs(image("blue")), max_new_tokens=4)
    hook = ahead(engine)

    def processed(req):
        if req is bad:
            raise VLError("preparing the request failed (RuntimeError); the server keeps serving")
        return hook(req)

    out = dict((i, x) for i, x in engine.stream_batch([bad, good], SamplingParams(), processed=processed)
               if not hasattr(x, "kind"))
    assert isinstance(out[0], VLError)
    assert out[1].token_ids == engine.chat(good.messages, max_new_tokens=4).token_ids
    assert isinstance(out[1].stats, Stats)


def test_items_over_the_group_cap_are_encoded_on_their_own(engine, monkeypatch):
    import vl.runtime.vision_batch as vb

    engine._vision_cache._items.clear()
    inputs = [engine.process(msgs(image(c, (300, 120))))[0] for c in ("red", "blue", "green")]
    n = int(inputs[0].pixel_values.shape[0])
    monkeypatch.setattr(vb, "MAX_TILES", 2 * n)
    group = GroupVision(engine, inputs)
    assert len(group.fresh) == 2  # the third would pass the cap
    for inp in inputs:
        torch.testing.assert_close(group.get(inp.pixel_values, "image", lambda i=inp: engine.model.encode_tiles(
            i.pixel_values)), engine.model.encode_tiles(inp.pixel_values), rtol=0, atol=0)
