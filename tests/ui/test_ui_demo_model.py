"""The app over the shipped demo model (vl/demo): document, PDF and video answers equal `vl.Engine.chat`.

Skipped until the demo checkpoint exists (it is trained by `vl train-demo`). The same checks run on the tiny
random checkpoint in test_ui_app.py; here they run on the model `vl app` serves by default.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from gradio_client import Client, handle_file
from ui_helpers import document_args, run_streamed, video_args

DEMO = Path(__file__).resolve().parents[2] / "vl" / "demo"
pytestmark = [pytest.mark.timeout(300), pytest.mark.skipif(
    not (DEMO / "config.json").is_file(), reason="the demo model (vl/demo) is not trained yet; vl train-demo makes it")]


@pytest.fixture(scope="module")
def demo_app(examples, upload_dir):
    import vl
    from ui.app import build_app, launch_app
    from ui.limits import AppLimits
    from ui.runner import UIEngine
    from ui.measure import free_port

    limits = AppLimits()
    engine = UIEngine.from_pretrained(DEMO, isolate=True, limits=limits.media, allowed_roots=[upload_dir, examples.dir])
    demo = build_app(engine, limits=limits, examples_dir=examples.dir, examples=examples.records, model_name="demo")
    launch_app(demo, port=free_port(), limits=limits, model_dir=DEMO, examples_dir=examples.dir,
               prevent_thread_lock=True, quiet=True)
    yield SimpleNamespace(client=Client(demo.local_url, verbose=False, download_files=False),
                          reference=vl.Engine.from_pretrained(DEMO))
    demo.close()


def _one(content_kind, path, question):
    return [{"role": "user", "content": [{"type": content_kind, content_kind: path},
                                         {"type": "text", "text": question}]}]


def _config_tiles() -> int:
    """The demo's `max_num_tiles` (1: it was trained on single squashed tiles); the reference engine uses it too."""
    import json

    return json.loads((DEMO / "config.json").read_text())["max_num_tiles"]


@pytest.mark.parametrize("ext,kind", [(".png", "image"), (".pdf", "pdf")])
def test_demo_document_answers_equal_engine(demo_app, examples, ext, kind):
    ex = next(e for e in examples.tabs["document"] if e["path"].endswith(ext))
    _, final, ttft, total = run_streamed(demo_app.client, "/document",
                                         document_args([handle_file(ex["path"])], ex["question"], max_new_tokens=64,
                                                       max_tiles=_config_tiles()))  # the slider's default
    want = demo_app.reference.chat(_one(kind, ex["path"], ex["question"]), max_new_tokens=64, thinking=False)
    assert final[1] == want.answer
    print(f"demo {kind}: answer {final[1]!r} (expected {ex['answer']!r}); first text {ttft:.2f} s, total {total:.2f} s")


def test_demo_video_answer_equals_engine(demo_app, examples):
    ex = examples.tabs["video"][0]
    _, final, ttft, total = run_streamed(demo_app.client, "/video",
                                         video_args(handle_file(ex["path"]), ex["question"], max_frames=16, rate=0.5,
                                                    max_new_tokens=64))
    want = demo_app.reference.chat(_one("video", ex["path"], ex["question"]), max_new_tokens=64, thinking=False,
                                   fps=2.0, max_frames=16, video_pruning_rate=0.5)
    assert final[1] == want.answer
    print(f"demo video: answer {final[1]!r} (expected {ex['answer']!r}); first text {ttft:.2f} s, total {total:.2f} s")


def test_pruning_that_the_similarity_floor_stops_says_so(demo_app, examples):
    """Redundant-token pruning at 0.6 on the demo's page of totals drops nothing (9 -> 9): no token comes within
    the similarity floor of the background. The stats table says so, with the numbers, instead of leaving the
    user to wonder why the rate had no effect; the same note is in the reduction record (`vl chat --json`)."""
    ex = next(e for e in examples.tabs["document"] if e["path"].endswith(".png"))
    out = demo_app.client.predict(*document_args([handle_file(ex["path"])], ex["question"], max_new_tokens=4,
                                                 max_tiles=_config_tiles()), False, 0.6, api_name="/document")
    stats = out[3]
    assert "| vision tokens before → after reduction | 9 → 9 |" in stats, stats
    assert ("redundant-token pruning 0.6 kept 9 of 9 tokens: the rate allows dropping 5 of the 9 prunable ones, "
            "but only 0 reach the similarity floor 0.95") in stats, stats
    want = demo_app.reference.chat(_one("image", ex["path"], ex["question"]), max_new_tokens=4, thinking=False,
                                   token_pruning_rate=0.6)
    assert [r["note"] for r in want.stats.as_dict()["reductions"]] == [n for n in want.stats.notes
                                                                      if n.startswith("redundant-token")]
