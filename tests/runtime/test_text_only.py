"""Text-only Nemotron-H end to end: a directory saved by transformers (with a tokenizer) runs through
vl.load_processor, vl.Engine (chat, stream, thinking toggle, reasoning budget, batch) and `vl chat`, and answers
as transformers' own `generate` does; media sent to it is a typed error before any work."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import vl
from tiny_models import make_tiny_text_dir
from vl.errors import InputError
from vl.processing.text_processor import NoVisionError, TextProcessor

REPO = Path(__file__).resolve().parents[2]
QUESTION = [{"role": "user", "content": "Describe the image. What is the total?"}]


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory):
    return make_tiny_text_dir(tmp_path_factory.mktemp("text_only") / "nh")


@pytest.fixture(scope="module")
def engine(text_dir):
    return vl.Engine.from_pretrained(text_dir[0])


def test_load_processor_is_a_text_processor(text_dir):
    p = vl.load_processor(text_dir[0])
    assert isinstance(p, TextProcessor) and not p.has_vision
    inputs = p(QUESTION, thinking=False)
    assert inputs.pixel_values is None and inputs.media == []
    assert inputs.text.startswith("<SPECIAL_10>System\n") and inputs.text.endswith("<think></think>")


@pytest.mark.parametrize("thinking", [False, True])
def test_greedy_chat_equals_transformers_generate(text_dir, engine, thinking):
    path, ref = text_dir
    result = engine.chat(QUESTION, max_new_tokens=12, thinking=thinking)
    ids = engine.processor(QUESTION, thinking=thinking).input_ids
    with torch.no_grad():
        out = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                           eos_token_id=sorted(engine.stop_ids), pad_token_id=0)
    new = out[0, ids.shape[1]:].tolist()
    n = len(result.token_ids)
    assert n >= 1 and result.token_ids == new[:n]
    if result.finish_reason == "stop":
        assert new[n] in engine.stop_ids
    else:
        assert n == 12


def test_stream_budget_and_batch(engine):
    stream = engine.chat(QUESTION, max_new_tokens=10, thinking=True, stream=True)
    events = list(stream)
    res = stream.result
    assert "".join(e.text for e in events if e.kind == "answer") == res.answer
    assert "".join(e.text for e in events if e.kind == "reasoning") == res.reasoning
    budget = engine.chat(QUESTION, max_new_tokens=10, thinking=True, reasoning_budget=2)
    assert "</think>" in budget.text and not budget.reasoning_truncated
    assert "reasoning cut at the budget of 2 tokens" in budget.stats.notes
    other = [{"role": "user", "content": "left right up down"}]
    batch = engine.chat_batch([QUESTION, other], max_new_tokens=6, thinking=False)
    singles = [engine.chat(m, max_new_tokens=6, thinking=False) for m in (QUESTION, other)]
    assert [b.token_ids for b in batch] == [s.token_ids for s in singles]


def test_media_is_a_typed_error_before_any_work(engine):
    msg = [{"role": "user", "content": [{"type": "image", "image": "/nonexistent/never/read.png"},
                                        {"type": "text", "text": "What is it?"}]}]
    with pytest.raises(NoVisionError, match="text-only model") as info:
        engine.chat(msg, max_new_tokens=2)
    assert isinstance(info.value, InputError) and info.value.code == "no_vision"
    pdf = [{"role": "user", "content": [{"type": "pdf", "pdf": "/nonexistent.pdf"}, {"type": "text", "text": "?"}]}]
    with pytest.raises(NoVisionError):
        engine.chat(pdf, max_new_tokens=2)


def test_vl_chat_command(text_dir, engine):
    env_cmd = [sys.executable, "-m", "vl.cli", "chat", "--model", str(text_dir[0]), "--think", "off",
               "--max-new-tokens", "6", "--prompt", QUESTION[0]["content"]]
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(env_cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 3 and "may be cut short" in done.stderr, done.stderr  # 6 tokens end the answer
    want = engine.chat(QUESTION, max_new_tokens=6, thinking=False)
    assert done.stdout.strip() == want.answer.strip()  # only the answer on stdout
    assert f"{want.stats.new_tokens} new" in done.stderr  # stats go to stderr
    picture = str(REPO / "vl/demo/loss.png")  # a real image: the refusal is about the model, not the file
    image = subprocess.run(env_cmd[:-2] + ["--image", picture, "--prompt", "hi"], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=120)
    assert image.returncode == 2 and "error [no_vision]" in image.stderr


def test_vl_eval_on_text_prompts(text_dir, engine, tmp_path):
    import json

    data = tmp_path / "text.jsonl"
    data.write_text("".join(json.dumps({"question_id": i, "question": q, "answers": [a] * 10}) + "\n"
                            for i, (q, a) in enumerate([("What is the total?", "47"), ("Name a colour.", "red")])))
    cmd = [sys.executable, "-m", "vl.cli", "eval", "--model", str(text_dir[0]), "--task", "textvqa_val", "--data",
           str(data), "--out", str(tmp_path / "out"), "--max-new-tokens", "4", "--no-progress", "--isolation",
           "inline", "--decode-sandbox", "off"]
    done = subprocess.run(cmd, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()]
    assert [r["status"] for r in rows] == ["ok", "ok"] and all(r["tokens"]["vision_before"] == 0 for r in rows)
    want = engine.chat([{"role": "user", "content": [{"type": "text", "text": "What is the total?\nAnswer the "
                         "question using a single word or phrase."}]}], max_new_tokens=4, thinking=False)
    assert rows[0]["raw"] == want.text


def test_vl_serve_builds_and_answers_on_a_text_only_model(text_dir):
    """`vl serve --model TEXT_DIR` starts (it reads the processor's media limits to count parts before refusing
    them) and answers; an image part is a typed 400."""
    from starlette.testclient import TestClient

    from vl.server.cli import build, parse_args

    with pytest.raises(SystemExit):
        parse_args(["--model", str(text_dir[0]), "--mix-chunk", "-1"])
    engine, scheduler, _, app = build(parse_args(["--model", str(text_dir[0]), "--mix-chunk", "0"]))
    assert engine.mix_chunk == 0
    with TestClient(app) as client:
        name = client.get("/v1/models").json()["data"][0]["id"]
        ok = client.post("/v1/chat/completions", json={"model": name, "max_tokens": 3, "messages": [
            {"role": "user", "content": "Hello"}]})
        assert ok.status_code == 200, ok.text
        bad = client.post("/v1/chat/completions", json={"model": name, "max_tokens": 3, "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "no_vision", bad.text
