"""`import vl` changes nothing for other models: transformers' `ImageTextToTextPipeline` keeps its own methods,
and another model's `pipeline("image-text-to-text")` (a tiny random LLaVA, tests/hf/tiny_llava.py) is
transformers' own class and gives what it gives without `vl`. Only our checkpoints get our pipeline class
(vl/hf/pipeline.py); tests/hf/test_hf_pipeline.py covers those.
"""

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

import vl
import vl.hf

transformers = pytest.importorskip("transformers")
from transformers import pipeline  # noqa: E402
from transformers.pipelines import check_task  # noqa: E402
from transformers.pipelines.image_text_to_text import ImageTextToTextPipeline  # noqa: E402

from tiny_llava import chat, red, tiny_llava  # noqa: E402

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
METHODS = ("__init__", "__call__", "_sanitize_parameters", "preprocess", "_forward", "postprocess")


@pytest.fixture(scope="module")
def llava():
    model, processor = tiny_llava()
    return pipeline("image-text-to-text", model=model, processor=processor, device="cpu")


def test_other_models_get_transformers_own_class_with_its_own_methods(llava):
    assert type(llava) is ImageTextToTextPipeline
    import transformers.pipelines.image_text_to_text as module

    for name in METHODS:  # defined in transformers' file, by transformers' class: no wrapper of ours
        method = vars(ImageTextToTextPipeline)[name]
        assert method.__qualname__ == f"ImageTextToTextPipeline.{name}", method.__qualname__
        assert method.__code__.co_filename == module.__file__ and not hasattr(method, "__wrapped__")


def test_other_models_urls_are_transformers_business(llava, http_server):
    """For another model a plain URL input is fetched, as transformers does without `vl`: our refusal (S12) is
    confined to our checkpoints. The loopback server counts the fetch."""
    url, hits = http_server
    out = llava(images=url, text="<image> What is this?", max_new_tokens=2)
    assert hits == ["/doc.png"] and out[0]["generated_text"].startswith("<image> What is this?")


def test_the_registry_entry_is_ours_and_builds_transformers_class_for_others(llava):
    _, entry, _ = check_task("image-text-to-text")
    assert entry["impl"] == vl.hf.PIPELINE_IMPL  # a dotted path, resolved when a pipeline is built
    model, processor = tiny_llava()
    built = vl.hf.NemotronNanoVLV2Pipeline(model=model, processor=processor, task="image-text-to-text",
                                           device="cpu")
    assert type(built) is ImageTextToTextPipeline  # the dispatch itself, without pipeline()
    explicit = pipeline("image-text-to-text", model=model, processor=processor, device="cpu",
                        pipeline_class=vl.hf.NemotronNanoVLV2Pipeline)
    assert type(explicit) is ImageTextToTextPipeline
    assert explicit(images=red(), text="<image> What is this?", max_new_tokens=3) == \
        llava(images=red(), text="<image> What is this?", max_new_tokens=3)


def test_someone_elses_pipeline_for_the_task_is_left_alone(recwarn):
    """If another library registered its own class for the task, ours does not replace it: it says so and
    leaves their entry (our checkpoints then need pipeline_class=vl.hf.NemotronNanoVLV2Pipeline)."""
    theirs = {"impl": "their_lib.TheirPipeline", "pt": ()}
    module = types.SimpleNamespace(PIPELINE_REGISTRY=types.SimpleNamespace(
        supported_tasks={"image-text-to-text": theirs}))
    with pytest.raises(RuntimeError, match="their_lib.TheirPipeline"):
        vl.hf._register_pipeline(module)
    assert module.PIPELINE_REGISTRY.supported_tasks["image-text-to-text"] is theirs
    stock = {"impl": "transformers.pipelines.image_text_to_text.ImageTextToTextPipeline", "pt": (), "type": "m"}
    module.PIPELINE_REGISTRY.supported_tasks["image-text-to-text"] = stock
    vl.hf._register_pipeline(module)
    assert module.PIPELINE_REGISTRY.supported_tasks["image-text-to-text"] == {**stock, "impl": vl.hf.PIPELINE_IMPL}
    assert stock["impl"].startswith("transformers.")  # transformers' own dict is replaced, not edited


# a fresh interpreter: transformers' classes before and after `import vl`, and another model's answers with and
# without `vl` (the pytest process has imported vl long before)
SCRIPT = """
import json, sys
sys.path.insert(0, {here!r})
import transformers.pipelines.image_text_to_text as itt
from transformers.pipelines.base import Pipeline

classes = (itt.ImageTextToTextPipeline, Pipeline)
before = [dict(vars(c)) for c in classes]
if {with_vl}:
    import vl, vl.hf
from transformers import pipeline
from tiny_llava import chat, red, tiny_llava

model, processor = tiny_llava()
pipe = pipeline("image-text-to-text", model=model, processor=processor, device="cpu")
out = dict(
    type=type(pipe).__module__ + "." + type(pipe).__qualname__,
    plain=pipe(images=red(), text="<image> What is this?", max_new_tokens=4)[0]["generated_text"],
    reply=pipe(text=chat(), max_new_tokens=4)[0]["generated_text"][-1],
    direct=pipe(text=chat(), max_new_tokens=4, do_sample=False, return_full_text=False)[0]["generated_text"],
    ids=pipe(images=red(), text="<image> What is this?", max_new_tokens=4, return_tensors=True)[0]
        ["generated_token_ids"].tolist(),
    untouched=all(dict(vars(c)).keys() == b.keys() and all(vars(c)[k] is v for k, v in b.items())
                  for c, b in zip(classes, before)),
    registered=vl.hf.registered() if {with_vl} else None,
)
print("RESULT " + json.dumps(out))
"""


def run_llava(with_vl: bool) -> tuple[dict, list[str]]:
    run = subprocess.run([sys.executable, "-c", SCRIPT.format(here=str(HERE), with_vl=with_vl)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.split("RESULT ", 1)[1])
    return result, [line for line in run.stderr.splitlines() if line.startswith("[transformers]")]


@pytest.mark.slow  # two fresh interpreters import transformers: seconds each
def test_import_vl_leaves_transformers_classes_and_other_models_alone():
    without, without_log = run_llava(False)
    with_vl, with_vl_log = run_llava(True)
    assert with_vl["registered"] and all(with_vl["registered"].values())  # every registration ran
    assert with_vl["untouched"] and without["untouched"]  # same objects in the classes' dicts, before and after
    assert with_vl["type"] == without["type"] == "transformers.pipelines.image_text_to_text.ImageTextToTextPipeline"
    for key in ("plain", "reply", "direct", "ids"):
        assert with_vl[key] == without[key], key
    # same messages too: e.g. `do_sample` given directly goes to LLaVA's processor as without vl (which ignores
    # it with a warning); only our pipeline routes it to generate
    assert with_vl_log == without_log
    assert any("do_sample" in line for line in without_log), without_log
