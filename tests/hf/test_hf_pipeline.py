"""vl/hf: transformers' Auto classes and `pipeline("image-text-to-text")` on Nano V2 VL directories.

The real `transformers.pipeline` runs on a tiny random checkpoint (tests/tiny_models.py) and, once it is shipped,
on the demo model (vl/demo/). Answers are compared with `vl.Engine.chat` loaded independently from the same
directory. The random model's comparisons use the raw text (`skip_special_tokens=False`), so that any token it
draws counts; `engine_text` asserts it did not stop early (transformers keeps a stop token in the sequence, the
engine does not). The demo model, which does stop, is compared with special tokens skipped.
"""

import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from PIL import Image

import vl
import vl.hf
from tiny_models import make_tiny_vl_dir
from vl.errors import GenerationOptionError, InputError, RemoteMediaError

transformers = pytest.importorskip("transformers")
from transformers import (AutoConfig, AutoModelForImageTextToText, AutoProcessor, AutoTokenizer,  # noqa: E402
                          TextIteratorStreamer, pipeline)

sys.path.insert(0, str(Path(__file__).parent.parent / "processing"))
from media_fixtures import encode, make_video, noise_image  # noqa: E402

DEMO_DIR = Path(vl.__file__).parent / "demo"
NEW = 8  # new tokens per call: enough to compare, cheap on two shared CPU cores


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny_vl_dir(tmp_path_factory.mktemp("hf_tiny"))


@pytest.fixture(scope="module")
def pipe(tiny_dir):
    return pipeline("image-text-to-text", model=str(tiny_dir), device="cpu")  # CPU like the engine, also on GPU hosts


@pytest.fixture(scope="module")
def engine(tiny_dir):
    return vl.Engine.from_pretrained(tiny_dir)  # loaded on its own: nothing shared with the pipeline


def image(color="red", size=(150, 90)):
    return Image.new("RGB", size, color)


def chat(color="red", text="What is this?"):
    return [{"role": "user", "content": [{"type": "image", "image": image(color)}, {"type": "text", "text": text}]}]


def answer(pipe, messages, **kwargs):
    out = pipe(text=messages, max_new_tokens=kwargs.pop("max_new_tokens", NEW), return_full_text=False,
               skip_special_tokens=False, **kwargs)
    return out[0]["generated_text"]


def engine_text(engine, messages, **kwargs):
    res = engine.chat(messages, max_new_tokens=kwargs.pop("max_new_tokens", NEW), **kwargs)
    assert res.finish_reason == "length", "the random model stopped: compare with the stop token appended"
    return res.text


# --- registration ---------------------------------------------------------------------------------------
def test_auto_classes_return_ours(tiny_dir, pipe):
    assert type(AutoConfig.from_pretrained(tiny_dir)).__name__ == "NemotronNanoVLV2Config"
    assert type(AutoProcessor.from_pretrained(tiny_dir)).__name__ == "NemotronNanoVLV2Processor"
    model = AutoModelForImageTextToText.from_pretrained(tiny_dir)
    assert type(model) is vl.hf.NemotronNanoVLV2ForImageTextToText
    assert isinstance(model, transformers.PreTrainedModel) and not model.training
    assert type(pipe.model) is type(model) and type(pipe.processor).__name__ == "NemotronNanoVLV2Processor"
    # our pipeline class, a subclass of transformers' own (vl/hf/pipeline.py); other models: test_hf_other_models.py
    assert type(pipe) is vl.hf.NemotronNanoVLV2Pipeline
    assert isinstance(pipe, transformers.pipelines.image_text_to_text.ImageTextToTextPipeline)
    assert pipe.model.engine.model is pipe.model.model  # a thin wrapper over our NemotronVL


def test_text_only_nemotron_h_stays_transformers_own():
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    config_class = CONFIG_MAPPING["nemotron_h"]
    assert config_class is transformers.NemotronHConfig
    assert MODEL_FOR_CAUSAL_LM_MAPPING[config_class] is transformers.NemotronHForCausalLM


def test_tokenizer_no_longer_warns_about_model_type(tiny_dir, capfd):
    AutoTokenizer.from_pretrained(tiny_dir)
    vl.load_processor(tiny_dir)
    err = capfd.readouterr().err
    assert "to instantiate a model of type" not in err, err


@pytest.mark.slow  # a fresh interpreter imports transformers: seconds
def test_import_is_cheap_and_registers_later(tiny_dir):
    """`import vl.hf` imports neither torch nor transformers; importing transformers afterwards registers."""
    code = ("import sys, warnings; warnings.simplefilter('error')\n"
            "import vl.hf\n"
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'heavy import'\n"
            "from transformers import AutoConfig, AutoTokenizer\n"
            f"AutoTokenizer.from_pretrained({str(tiny_dir)!r})\n"
            f"print(type(AutoConfig.from_pretrained({str(tiny_dir)!r})).__name__)\n"
            "print('modeling_utils' in ' '.join(sys.modules))\n"
            "from transformers import AutoModelForImageTextToText\n"
            f"print(type(AutoModelForImageTextToText.from_pretrained({str(tiny_dir)!r})).__name__)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).parents[2])
    assert run.returncode == 0, run.stderr[-2000:]
    # the tokenizer path stays light; the model class is there when a model is asked for
    assert run.stdout.split() == ["NemotronNanoVLV2Config", "False", "NemotronNanoVLV2ForImageTextToText"]
    assert "to instantiate a model of type" not in run.stderr


def test_auto_map_remote_code_never_runs(tiny_dir, tmp_path, capfd):
    """A checkpoint whose auto_map points at code in its folder (as the released ones do): our classes load,
    the folder's code is never imported, with or without trust_remote_code."""
    evil = tmp_path / "evil_ckpt"
    shutil.copytree(tiny_dir, evil)
    marker = tmp_path / "remote_code_ran"
    (evil / "evil_code.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n"
                                       "class EvilConfig: pass\nclass EvilModel: pass\nclass EvilProcessor: pass\n")
    cfg = json.loads((evil / "config.json").read_text())
    cfg["auto_map"] = {"AutoConfig": "evil_code.EvilConfig", "AutoModel": "evil_code.EvilModel",
                       "AutoModelForImageTextToText": "evil_code.EvilModel", "AutoProcessor": "evil_code.EvilProcessor"}
    (evil / "config.json").write_text(json.dumps(cfg))
    (evil / "preprocessor_config.json").write_text(json.dumps(
        {"processor_class": "NemotronNanoVLV2Processor", "auto_map": {"AutoProcessor": "evil_code.EvilProcessor"}}))
    for trust in (None, True):
        p = pipeline("image-text-to-text", model=str(evil), trust_remote_code=trust, device="cpu")
        assert type(p.model).__module__ == "vl.hf.model" and type(p.processor).__module__ == "vl.hf.processor"
        assert p(text=chat(), max_new_tokens=2, return_full_text=False)[0]["generated_text"] is not None
    assert not marker.exists()
    assert "is not supported for image-text-to-text" not in capfd.readouterr().err


# --- answers equal the engine's -----------------------------------------------------------------------------
def test_pipeline_equals_engine_greedy(pipe, engine):
    assert answer(pipe, chat()) == engine_text(engine, chat())
    # the default decoding (special tokens skipped) equals the engine's ids decoded the same way
    res = engine.chat(chat(), max_new_tokens=NEW)
    out = pipe(text=chat(), max_new_tokens=NEW, return_full_text=False)
    assert out[0]["generated_text"] == engine.tokenizer.decode(res.token_ids, skip_special_tokens=True)
    ids = pipe(text=chat(), max_new_tokens=NEW, return_tensors=True)[0]["generated_token_ids"]
    assert ids[-NEW:].tolist() == res.token_ids


def test_full_text_and_prefill(pipe, engine):
    full = pipe(text=chat(), max_new_tokens=NEW)[0]["generated_text"]
    assert [m["role"] for m in full] == ["user", "assistant"] and isinstance(full[-1]["content"], str)
    prefill = chat() + [{"role": "assistant", "content": "It is"}]
    assert answer(pipe, prefill) == engine_text(engine, prefill)
    continued = pipe(text=prefill, max_new_tokens=NEW, skip_special_tokens=False)[0]["generated_text"]
    assert continued[-1]["content"] == "It is" + engine_text(engine, prefill)


def test_batch_of_three_chats(pipe, engine, tiny_dir):
    chats = [chat("red"), [{"role": "user", "content": "left right"}], chat("green", "Which colour?")]
    outs = pipe(text=chats, max_new_tokens=NEW, return_full_text=False, skip_special_tokens=False)
    assert [o[0]["generated_text"] for o in outs] == [engine_text(engine, c) for c in chats]
    # one left-padded batch through the model's generate equals the engine's batch (= its singles)
    inputs = pipe.processor.apply_chat_template(chats, add_generation_prompt=True, tokenize=True,
                                                return_dict=True)
    assert inputs["input_ids"].shape[0] == 3 and len(inputs["media"]) == 3
    seqs = pipe.model.generate(**inputs, max_new_tokens=NEW)
    new = seqs[:, inputs["input_ids"].shape[1]:].tolist()
    assert new == [r.token_ids for r in engine.chat_batch(chats, max_new_tokens=NEW)]


def test_streaming_concatenates_to_the_same_text(pipe):
    inputs = pipe.processor.apply_chat_template(chat(), add_generation_prompt=True, tokenize=True, return_dict=True)
    streamer = TextIteratorStreamer(pipe.processor.tokenizer, skip_prompt=True, skip_special_tokens=True)
    worker = threading.Thread(target=pipe.model.generate, kwargs=dict(**inputs, max_new_tokens=NEW, streamer=streamer))
    worker.start()
    chunks = list(streamer)
    worker.join()
    expected = pipe(text=chat(), max_new_tokens=NEW, return_full_text=False)[0]["generated_text"]
    assert len(chunks) > 1 and "".join(chunks) == expected
    with pytest.raises(GenerationOptionError, match="streamer takes one sequence"):
        batch = pipe.processor.apply_chat_template([chat(), chat("blue")], add_generation_prompt=True,
                                                   tokenize=True, return_dict=True)
        pipe.model.generate(**batch, max_new_tokens=2, streamer=streamer)


def test_processor_options_tiles_thinking(pipe, engine):
    prompt = pipe.processor.apply_chat_template(chat(), add_generation_prompt=True, thinking=False)
    assert prompt.endswith("<think></think>")
    assert pipe.processor.apply_chat_template(chat(), add_generation_prompt=True) == prompt  # the default: off
    assert pipe.processor.apply_chat_template(chat(), add_generation_prompt=True,
                                              enable_thinking=True).endswith("<think>\n")
    assert pipe.processor.apply_chat_template(chat(), add_generation_prompt=True,
                                              enable_thinking=False).endswith("<think></think>")
    one = pipe.processor.apply_chat_template(chat(), add_generation_prompt=True, tokenize=True, return_dict=True,
                                             max_num_tiles=1)
    assert one["pixel_values"].shape[0] == 1  # one tile, no thumbnail
    ours = answer(pipe, chat(), thinking=False, processor_kwargs={"max_num_tiles": 2})  # both ways of passing
    assert ours == engine_text(engine, chat(), thinking=False, max_num_tiles=2)
    doc = [{"role": "user", "content": [{"type": "image", "image": noise_image(200, 130)},
                                        {"type": "text", "text": "Read it."}]}]
    opts = dict(skip_blank_tiles=True, token_pruning_rate=0.5)
    assert answer(pipe, doc, **opts) == engine_text(engine, doc, **opts)
    with pytest.raises(InputError, match="unknown apply_chat_template option"):
        pipe(text=chat(), max_new_tokens=2, num_frames=4)


def test_other_keywords_are_template_variables_when_the_template_reads_them(pipe, engine):
    """As in transformers, keywords that are not options go to the chat template: taken when the template reads
    them (a Nemotron 3 template's `truncate_history_thinking`), refused when it does not (a misspelt option), and the
    pipeline's answer with one equals the engine's with the `template_kwargs` option."""
    from card_templates import NEMOTRON3_TEMPLATE

    history = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "<think>\nAdd.\n</think>\n\n4"},
               {"role": "user", "content": chat()[0]["content"]}]
    saved = pipe.processor.tokenizer.chat_template, engine.processor.tokenizer.chat_template
    pipe.processor.tokenizer.chat_template = engine.processor.tokenizer.chat_template = NEMOTRON3_TEMPLATE
    try:
        apply = pipe.processor.apply_chat_template
        assert "<think>\nAdd.\n</think>" not in apply(history, add_generation_prompt=True)  # the template's default
        kept = apply(history, add_generation_prompt=True, truncate_history_thinking=False)
        assert "<think>\nAdd.\n</think>" in kept
        assert apply(history, add_generation_prompt=True, template_kwargs={"truncate_history_thinking": False}) == kept
        with pytest.raises(InputError, match=r"\['max_tile'\].*does not read these"):
            apply(history, add_generation_prompt=True, max_tile=2)
        with pytest.raises(InputError, match="pass them one way"):
            apply(history, truncate_history_thinking=False, template_kwargs={"low_effort": True})
        with pytest.raises(GenerationOptionError, match="true/false, a finite number"):
            apply(history, truncate_history_thinking=[False])
        with pytest.raises(InputError, match="tool calling is not supported"):  # transformers' keyword, not a variable
            apply(history, tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}])
        assert apply(history, add_generation_prompt=True, tools=None, documents=[]) == apply(
            history, add_generation_prompt=True)  # their "not used" values are accepted
        got = answer(pipe, history, truncate_history_thinking=False)
        assert got == engine_text(engine, history, template_kwargs={"truncate_history_thinking": False})
    finally:
        pipe.processor.tokenizer.chat_template, engine.processor.tokenizer.chat_template = saved


def test_video_frames_and_evs_rate(pipe, engine, tmp_path, monkeypatch):
    clip = make_video(tmp_path / "clip.mp4", frames=20, fps=10, size=(64, 48), noise=True)
    msgs = [{"role": "user", "content": [{"type": "video", "path": clip}, {"type": "text", "text": "What moves?"}]}]
    opts = dict(fps=4.0, max_frames=4, video_pruning_rate=0.5)
    rates = []
    reduce = pipe.model.model.reduce
    monkeypatch.setattr(pipe.model.model, "reduce", lambda v, m, q=None, *a: rates.append(q) or reduce(v, m, q, *a))
    assert answer(pipe, msgs, **opts) == engine_text(engine, msgs, **opts)
    assert rates == [0.5]  # the rate reached the model's token reduction
    res = engine.chat(msgs, max_new_tokens=1, **opts)
    assert res.stats.vision_tokens_after < res.stats.vision_tokens_before  # EVS did prune
    inputs = pipe.processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=True,
                                                fps=4.0, max_frames=4)
    assert inputs["media"][0].kind == "video" and inputs["media"][0].num_tiles == 4


def test_sampling_options_follow_transformers(pipe, engine):
    def sampled():
        torch.manual_seed(1)
        return answer(pipe, chat(), generate_kwargs={"do_sample": True, "temperature": 0.9, "top_p": 0.9})

    first = sampled()
    assert sampled() == first  # the global torch seed makes a sampled call reproducible, as in transformers
    torch.manual_seed(1)
    seed = int(torch.randint(0, 2**62, (1,)).item())
    assert first == engine_text(engine, chat(), temperature=0.9, top_p=0.9, top_k=50, seed=seed)
    with pytest.raises(GenerationOptionError, match="num_beams"):
        pipe(text=chat(), max_new_tokens=2, generate_kwargs={"num_beams": 2})
    with pytest.raises(GenerationOptionError, match="unknown generate option"):
        pipe(text=chat(), max_new_tokens=2, generate_kwargs={"not_an_option": 1})
    with pytest.raises(GenerationOptionError, match="temperature > 0"):
        pipe(text=chat(), max_new_tokens=2, generate_kwargs={"do_sample": True, "temperature": 0.0})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; this machine has none")
def test_pipeline_on_gpu_equals_engine_on_gpu(tiny_dir):
    """transformers' default device on a GPU host is cuda:0: the pipeline moves our model there."""
    gpu_pipe = pipeline("image-text-to-text", model=str(tiny_dir))
    assert gpu_pipe.model.device.type == "cuda"
    gpu_engine = vl.Engine.from_pretrained(tiny_dir, device_map="cuda")
    for messages in (chat(), [{"role": "user", "content": "left right"}]):
        assert answer(gpu_pipe, messages) == engine_text(gpu_engine, messages)


# --- the boundary (docs/reliability_policy.md §1.2, row S12; http_server: tests/hf/conftest.py) ------------------
def test_urls_are_refused_and_never_fetched(pipe, http_server):
    url, hits = http_server
    for key in ("url", "image", "path"):
        msgs = [{"role": "user", "content": [{"type": "image", key: url}, {"type": "text", "text": "Read it."}]}]
        with pytest.raises(RemoteMediaError, match="nothing was fetched"):
            pipe(text=msgs, max_new_tokens=2)
    with pytest.raises(RemoteMediaError):  # the plain form goes through our code too, not transformers' load_images
        pipe(images=url, text="Read it.", max_new_tokens=2)
    pipe.processor.allow_remote_media = True
    try:
        with pytest.raises(RemoteMediaError, match="fetching is not implemented"):
            pipe(text=[{"role": "user", "content": [{"type": "image", "url": url}]}], max_new_tokens=2)
    finally:
        pipe.processor.allow_remote_media = False
    assert hits == []


def test_local_paths_only_under_allowed_roots(pipe, tmp_path, monkeypatch):
    allowed, elsewhere = tmp_path / "uploads", tmp_path / "private"
    allowed.mkdir()
    elsewhere.mkdir()
    image("red").save(allowed / "ok.png")
    image("red").save(elsewhere / "secret.png")
    (allowed / "link.png").symlink_to(elsewhere / "secret.png")
    import transformers.pipelines.image_text_to_text as itt

    monkeypatch.setattr(itt, "load_images", lambda *a, **k: pytest.fail("transformers was handed a path"))
    pipe.processor.allowed_roots = [allowed]
    try:
        ok = [{"role": "user", "content": [{"type": "image", "path": str(allowed / "ok.png")},
                                           {"type": "text", "text": "What is this?"}]}]
        from_path = answer(pipe, ok)
        assert from_path == answer(pipe, chat("red"))  # the same pixels as the PIL image
        assert pipe(images=str(allowed / "ok.png"), text="What is this?", max_new_tokens=2)[0]["generated_text"]
        for bad in (elsewhere / "secret.png", allowed / "link.png", allowed / ".." / "private" / "secret.png"):
            with pytest.raises(RemoteMediaError, match="outside the allowed media folders"):
                pipe(text=[{"role": "user", "content": [{"type": "image", "path": str(bad)}]}], max_new_tokens=2)
            with pytest.raises(RemoteMediaError, match="outside the allowed media folders"):
                pipe(images=str(bad), text="What is this?", max_new_tokens=2)
    finally:
        pipe.processor.allowed_roots = None


def test_data_uri_is_decoded_here(pipe):
    import base64

    uri = "data:image/png;base64," + base64.b64encode(encode(image("red"), "PNG")).decode()
    msgs = [{"role": "user", "content": [{"type": "image", "url": uri}, {"type": "text", "text": "What is this?"}]}]
    assert answer(pipe, msgs) == answer(pipe, chat("red"))


# --- saving ------------------------------------------------------------------------------------------------
def test_save_pretrained_round_trips(pipe, tmp_path):
    out = tmp_path / "saved"
    pipe.save_pretrained(out)
    pipe.processor.save_pretrained(out)
    assert json.loads((out / "config.json").read_text())["model_type"] == "NemotronH_Nano_VL_V2"
    assert (out / "generation_config.json").exists() and (out / "processor_config.json").exists()
    before = pipe.model.model.state_dict()
    after = vl.load_pretrained(out).state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    again = pipeline("image-text-to-text", model=str(out), device="cpu")
    assert type(again.processor).__name__ == "NemotronNanoVLV2Processor"
    assert again.model.generation_config.eos_token_id == pipe.model.generation_config.eos_token_id
    assert answer(again, chat()) == answer(pipe, chat())


# --- the shipped demo model ----------------------------------------------------------------------------------
needs_demo = pytest.mark.skipif(not (DEMO_DIR / "config.json").exists(),
                                reason="the demo model is not shipped in this checkout (vl/demo/ has no "
                                       "config.json); scripts/train_demo.sh builds it")


@pytest.fixture(scope="module")
def demo():
    return pipeline("image-text-to-text", model=str(DEMO_DIR), device="cpu"), vl.Engine.from_pretrained(DEMO_DIR)


def demo_samples(n):
    from data_recipes.synthetic import make_dataset

    size = json.loads((DEMO_DIR / "config.json").read_text())["force_image_size"]
    return [make_dataset("document", "test", n, tile_size=size)[i] for i in range(n)]


def demo_messages(sample):
    return [{"role": "user", "content": [{"type": "image", "image": page} for page in sample.media]
             + [{"type": "text", "text": sample.question}]}]


@needs_demo
def test_demo_pipeline_equals_engine(demo):
    pipe, engine = demo
    for sample in demo_samples(3):
        msgs = demo_messages(sample)
        res = engine.chat(msgs, max_new_tokens=64)
        out = pipe(text=msgs, max_new_tokens=64, return_full_text=False)[0]["generated_text"]
        assert out == engine.tokenizer.decode(res.token_ids, skip_special_tokens=True)


@needs_demo
def test_demo_pipeline_answers_held_out_documents(demo):
    """Held-out (split "test") synthetic documents; scored as eval's synthetic_docs task scores them."""
    from eval.metrics import exact_match
    from vl.processing.reasoning_text import split_reasoning

    pipe, _ = demo
    samples = demo_samples(6)
    scores = []
    for sample in samples:
        msgs = demo_messages(sample)
        text = pipe(text=msgs, max_new_tokens=64, return_full_text=False)[0]["generated_text"]
        opened = pipe.processor.apply_chat_template(msgs, add_generation_prompt=True).endswith("<think>\n")
        scores.append(exact_match(split_reasoning(text, opened)[1], [sample.answer]))
    assert any(scores), f"no held-out question answered correctly: {[(s.question, s.answer) for s in samples]}"



# --- generation arguments the way transformers takes them ------------------------------------------------------
def test_generation_args_given_directly_or_in_generate_kwargs_equal_engine(pipe, engine):
    want = engine_text(engine, chat())
    direct = pipe(text=chat(), max_new_tokens=NEW, do_sample=False, return_full_text=False,
                  skip_special_tokens=False)[0]["generated_text"]
    nested = pipe(text=chat(), generate_kwargs={"do_sample": False, "max_new_tokens": NEW}, return_full_text=False,
                  skip_special_tokens=False)[0]["generated_text"]
    assert direct == nested == want
    # sampling with top_k=1 keeps only the best token: it reaches generation only if it equals greedy decoding
    top1 = answer(pipe, chat(), do_sample=True, temperature=1.3, top_k=1, top_p=0.9, repetition_penalty=1.0)
    assert top1 == want
    with pytest.raises(GenerationOptionError, match="both directly and in generate_kwargs"):
        pipe(text=chat(), do_sample=False, generate_kwargs={"do_sample": False})
    with pytest.raises(GenerationOptionError, match="num_beams"):  # a generation argument we do not implement
        pipe(text=chat(), max_new_tokens=2, num_beams=2)


def test_stop_sequence_reaches_generation(pipe, engine):
    full = engine_text(engine, chat())
    cut = next(k for k in range(2, len(full)) if full[k - 2:k].strip() and full.find(full[k - 2:k]) == k - 2)
    stop = full[cut - 2:cut]  # two characters that first occur there
    out = answer(pipe, chat(), stop_sequence=stop)
    assert stop in out and full.startswith(out) and len(out) < len(full)
    stopped = engine.chat(chat(), max_new_tokens=NEW, stop=[stop])
    assert stopped.finish_reason == "stop_string" and out.startswith(stopped.text)


@needs_demo
def test_demo_pipeline_default_output_is_the_answer_with_the_reasoning_apart(demo):
    """The default (chat) output's assistant message is the answer; the reasoning is `reasoning_content`, as the
    model card's reasoning parsers return them; no raw think tag in either."""
    pipe, engine = demo
    msgs = demo_messages(demo_samples(1)[0])
    for thinking in (True, False):
        want = engine.chat(msgs, max_new_tokens=64, thinking=thinking)
        reply = pipe(text=msgs, max_new_tokens=64, thinking=thinking)[0]["generated_text"][-1]
        assert reply["role"] == "assistant" and reply["content"] == want.answer and want.answer
        assert reply.get("reasoning_content", "") == want.reasoning and bool(want.reasoning) == thinking
        assert "think>" not in reply["content"] + reply.get("reasoning_content", "")


def test_moved_helper_keeps_its_old_name_for_a_release():
    from vl.hf.pipeline import route_generation_args

    with pytest.warns(DeprecationWarning, match="vl.hf.pipeline.route_generation_args"):
        assert vl.hf.route_generation_args is route_generation_args
