"""gradio_client against the launched app: streamed answers equal `vl.Engine.chat`; errors are messages; limits.

The app runs in-process (`launch(prevent_thread_lock=True)` on a free port) over a tiny random checkpoint, with
uploads decoded in sandbox workers. Equality is checked against a separate plain `vl.Engine` over the same
checkpoint, given the original files (the app sees its own uploaded copies).
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from gradio_client import handle_file
from gradio_client.exceptions import AppError
from ui_helpers import assert_streamed, document_args, run_streamed, video_args

pytestmark = pytest.mark.timeout(240)


def _doc(examples, ext):
    return next(e for e in examples.tabs["document"] if e["path"].endswith(ext))


def _messages(kind, path, question):
    return [{"role": "user", "content": [{"type": kind, kind: str(path)}, {"type": "text", "text": question}]}]


def test_document_answer_streams_and_equals_engine(client, examples, reference_engine):
    ex = _doc(examples, ".png")
    seen, final, _, _ = run_streamed(client, "/document", document_args([handle_file(ex["path"])], ex["question"],
                                                                         max_new_tokens=24))
    assert_streamed(seen, final)
    want = reference_engine.chat(_messages("image", ex["path"], ex["question"]), max_new_tokens=24, thinking=False)
    assert final[1] == want.answer and final[0] == want.reasoning == ""
    captions = [g["caption"] for g in final[2]]
    assert captions[-1] == "thumbnail" and len(captions) == want.stats.vision_tokens_before // 4
    assert f"| prompt tokens (after reduction) | {want.stats.prompt_tokens} |" in final[3]


def test_pdf_page_range_with_reasoning_equals_engine(client, examples, reference_engine):
    ex = _doc(examples, ".pdf")
    args = document_args([handle_file(ex["path"])], ex["question"], pages="2-3", max_tiles=2, thinking=True,
                         max_new_tokens=20)
    seen, final, _, _ = run_streamed(client, "/document", args)
    assert_streamed(seen, final, field=0)  # /think: the text streams into the reasoning box
    want = reference_engine.chat(_messages("pdf", ex["path"], ex["question"]), max_new_tokens=20, thinking=True,
                                 pages="2-3", max_num_tiles=2)
    assert (final[0], final[1]) == (want.reasoning, want.answer)
    captions = [g["caption"] for g in final[2]]
    assert {c.split(" · ")[0] for c in captions} == {"p2", "p3"}, captions
    assert "did not finish within the token limit" in final[3]  # 20 tokens of reasoning, no answer: said so


def test_document_token_budget_reduces_tiles(client, examples, reference_engine):
    ex = _doc(examples, ".pdf")
    args = document_args([handle_file(ex["path"])], ex["question"], token_budget=48, max_new_tokens=4)
    _, final, _, _ = run_streamed(client, "/document", args)
    want = reference_engine.chat(_messages("pdf", ex["path"], ex["question"]), max_new_tokens=4, thinking=False,
                                 context_length=48 + 1024, reserved_tokens=1024)
    assert final[1] == want.answer
    assert want.stats.vision_tokens_before <= 48 and len(final[2]) * 4 == want.stats.vision_tokens_before


def test_video_answer_streams_equals_engine_and_charts_evs(client, examples, reference_engine):
    ex = examples.tabs["video"][0]
    seen, final, _, _ = run_streamed(client, "/video", video_args(handle_file(ex["path"]), ex["question"],
                                                                  max_frames=8, rate=0.5))
    assert_streamed(seen, final)
    want = reference_engine.chat(_messages("video", ex["path"], ex["question"]), max_new_tokens=24, thinking=False,
                                 fps=2.0, max_frames=8, video_pruning_rate=0.5)
    assert final[1] == want.answer
    assert final[2]["type"] == "matplotlib" and final[2]["plot"].startswith("data:image/")
    counts = want.stats.reductions[0]["counts"]
    kept = [int(g["caption"].rsplit(" · ", 1)[1].split("/")[0]) for g in final[3]]  # "0.00 s · 3/4"
    assert kept == counts and sum(counts) == want.stats.vision_tokens_after < want.stats.vision_tokens_before
    assert [g["caption"].split(" · ")[0] for g in final[3]][:2] == ["0.00 s", "0.50 s"]  # 8 frames at 2 fps, all kept


@pytest.mark.parametrize("thinking", [False, True])
def test_chat_multimodal_equals_engine(client, examples, reference_engine, thinking):
    ex = _doc(examples, ".png")
    message = {"text": ex["question"], "files": [handle_file(ex["path"])]}
    job = client.submit(message, thinking, 0, 16, 0.0, 12, 2.0, 16, 0.0, api_name="/chat")
    outs = list(job)
    final = job.result(timeout=60)
    want = reference_engine.chat([{"role": "user", "content": [{"type": "image", "image": ex["path"]},
                                                                {"type": "text", "text": ex["question"]}]}],
                                 max_new_tokens=16, thinking=thinking)
    assert len(outs) >= 2
    if thinking:  # a collapsible reasoning bubble first, closed when done
        thought, final = final[0], final[1:]
        assert thought["metadata"]["title"] == "Reasoning" and thought["metadata"]["status"] == "done"
        assert thought["content"] == want.reasoning
    assert final[0]["content"] == (want.answer or "*(no answer)*") and final[1]["metadata"]["title"] == "Stats"


@pytest.mark.parametrize("name,data,words", [
    ("bad.png", b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, "png"),
    ("bad.pdf", b"this is not a pdf at all", "%PDF-"),
    ("page.png", b"%PDF-1.4\n%fake pdf posing as a png\n", "image"),
])
def test_corrupt_upload_is_a_message_and_the_next_request_works(client, examples, tmp_path, name, data, words):
    bad = tmp_path / name
    bad.write_bytes(data)
    with pytest.raises(AppError) as err:
        client.predict(*document_args([handle_file(bad)], "What is the total?"), api_name="/document")
    msg = str(err.value)
    assert words.lower() in msg.lower() and "Traceback" not in msg and str(tmp_path) not in msg, msg
    ex = _doc(examples, ".png")
    out = client.predict(*document_args([handle_file(ex["path"])], ex["question"], max_new_tokens=4),
                         api_name="/document")
    assert out[1] and "finished by" in out[3]


def test_corrupt_video_is_a_message_and_the_next_request_works(client, examples, tmp_path):
    bad = tmp_path / "clip.mp4"
    bad.write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"\x13" * 4000)
    with pytest.raises(AppError) as err:
        client.predict(*video_args(handle_file(bad), "What happens?"), api_name="/video")
    assert "Traceback" not in str(err.value) and "video" in str(err.value).lower()
    ex = examples.tabs["video"][0]
    out = client.predict(*video_args(handle_file(ex["path"]), ex["question"], max_new_tokens=4), api_name="/video")
    assert out[1]


@pytest.mark.parametrize("over,words", [
    (dict(pages="7-9"), "outside 1..4"),
    (dict(max_new_tokens=10**6), "greater than maximum value 2048"),  # Gradio checks slider bounds itself
    (dict(max_tiles=0), "less than minimum value 1"),
    (dict(max_tiles=2.5), "tiles per page must be an integer, found 2.5"),  # ours (vl/options.py), behind Gradio's
])
def test_bad_options_are_clear_messages(client, examples, over, words):
    ex = _doc(examples, ".pdf")
    with pytest.raises(AppError, match=words):
        client.predict(*document_args([handle_file(ex["path"])], ex["question"], **over), api_name="/document")


def test_page_cap_is_a_clear_message_and_a_range_gets_past_it(client, tmp_path):
    from PIL import Image

    from data_recipes.synthetic.export import write_pdf

    pdf = write_pdf([Image.new("RGB", (64, 64), "white")] * 40, tmp_path / "long.pdf")
    with pytest.raises(AppError, match="32") as err:
        client.predict(*document_args([handle_file(pdf)], "How many pages?", max_new_tokens=2), api_name="/document")
    assert "page" in str(err.value)
    out = client.predict(*document_args([handle_file(pdf)], "How many pages?", pages="1-2", max_new_tokens=2),
                         api_name="/document")
    assert out[1] is not None and "finished by" in out[3]


def test_wrong_type_is_refused_without_internals(client, examples):
    ex = _doc(examples, ".png")
    with pytest.raises(AppError) as err:
        client.predict(*document_args([handle_file(ex["path"])], ex["question"], temperature="hot"),
                       api_name="/document")
    assert "Traceback" not in str(err.value) and "/work" not in str(err.value), str(err.value)


def test_too_many_images_and_missing_question(client, examples):
    png = handle_file(_doc(examples, ".png")["path"])
    with pytest.raises(AppError, match=r"at most 4 image"):
        client.predict(*document_args([png] * 5, "What is the total?"), api_name="/document")
    with pytest.raises(AppError, match="type a question"):
        client.predict(*document_args([png], "   "), api_name="/document")


def test_stop_really_stops_generation(client, app, examples, monkeypatch):
    """Cancelling (what the Stop button asks the server to do) closes the engine's stream mid-answer: the answer
    never runs to its end, and after the stop the model's only steps are the next request's own."""
    steps, ended, outcome = [], threading.Event(), {}
    chat_events = app.engine._chat_events

    def watched(request, params):  # the engine's stream for one request; `finally` runs when it is closed
        try:
            outcome["result"] = yield from chat_events(request, params)
        finally:
            ended.set()

    ex = _doc(examples, ".png")
    short = document_args([handle_file(ex["path"])], ex["question"], max_new_tokens=4)
    hook = app.engine.lm.register_forward_hook(lambda *_: steps.append(1))
    try:
        assert client.predict(*short, api_name="/document")[1]
        alone = len(steps)  # the short request's steps when it runs alone
        monkeypatch.setattr(app.engine, "_chat_events", watched)
        # /think on this example runs past 600 tokens on the tiny model (about 20 s here): only a stop ends it early
        job = client.submit(*document_args([handle_file(ex["path"])], ex["question"], thinking=True,
                                           max_new_tokens=2048), api_name="/document")
        t0 = time.perf_counter()
        while not any(isinstance(o[0], str) and len(o[0]) > 3 for o in job.outputs()):
            assert time.perf_counter() - t0 < 60, "no streamed text"
            time.sleep(0.05)
        job.cancel()
        assert ended.wait(60), "the engine's stream was not closed by the stop"
        assert "result" not in outcome, "the answer ran to its end: the stop did not end it"
        monkeypatch.undo()
        before = len(steps)
        out = client.predict(*short, api_name="/document")
        assert out[1] and len(steps) - before == alone, "the stopped request kept decoding beside the next one"
    finally:
        hook.remove()


def _get(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""


def test_only_uploads_and_examples_are_served(app, client, examples, tiny_dir):
    base = app.url + "gradio_api/file="
    secret = (tiny_dir / "config.json").read_bytes()
    repo_file = __file__
    for target in [str(tiny_dir / "config.json"), repo_file, "/etc/passwd",
                   str(examples.dir) + "/../" + tiny_dir.name + "/config.json"]:
        for form in (target, urllib.parse.quote(target, safe="")):
            status, body = _get(base + form)
            assert status in (403, 404) and secret not in body, (target, status)
    status, body = _get(base + str(examples.dir / "examples.json"))
    assert status == 200 and b"question" in body
    # an uploaded file is served back (that is how the page shows it)
    out = client.predict(*document_args([handle_file(_doc(examples, ".png")["path"])], "What is the total?",
                                        max_new_tokens=2), api_name="/document")
    status, _ = _get(base + out[2][0]["image"]["path"])
    assert status == 200


def test_document_requests_leave_no_stray_files_in_the_upload_folder(client, examples, upload_dir):
    """Row S11's "temp dir bounded": Gradio 6.31's `gr.File(type="filepath")` left one empty temp file per
    uploaded file per request (ui.documents.without_stray_temp_files says why); repeated requests must add nothing."""
    ex = _doc(examples, ".png")
    args = document_args([handle_file(ex["path"])], ex["question"], max_new_tokens=2)
    client.predict(*args, api_name="/document")  # the upload itself and the gallery's pictures land now
    before = sorted(p for p in upload_dir.rglob("*") if p.is_file())
    for _ in range(3):
        client.predict(*args, api_name="/document")
    after = sorted(p for p in upload_dir.rglob("*") if p.is_file())
    assert after == before, [str(p.relative_to(upload_dir)) for p in set(after) - set(before)]


def test_api_names_and_samples_read_as_words(client):
    """"Use via API" lists every endpoint's parameters and results by name, with samples a user can send: no
    `value_54` / `parameter_65`, no "Hello!!" as a page range."""
    import re

    api = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert {"/document", "/video", "/chat"} <= set(api)
    for name, info in api.items():
        labels = [p["label"] for p in info["parameters"]] + [r["label"] for r in info["returns"]]
        assert not [x for x in labels if re.fullmatch(r"(value|parameter)_\d+", x)], (name, labels)
        samples = str([p["example_input"] for p in info["parameters"]])
        assert "Hello!!" not in samples and "://" not in samples, (name, samples)  # the app fetches no URL
    doc = {p["parameter_name"]: p for p in api["/document"]["parameters"]}
    assert doc["pages"]["example_input"] == "1-3" and doc["question"]["example_input"] == "What is the total?"
    assert {"skip_blank_tiles", "token_pruning_rate"} <= set(doc) and "flag" not in doc
    assert doc["token_pruning_rate"]["parameter_has_default"]  # callers from before these controls keep working


def test_document_token_reduction_before_after_and_kept_tokens(client, examples, reference_engine):
    ex = _doc(examples, ".pdf")
    args = document_args([handle_file(ex["path"])], ex["question"], max_new_tokens=4) + [True, 0.5]
    _, final, _, _ = run_streamed(client, "/document", args)
    want = reference_engine.chat(_messages("pdf", ex["path"], ex["question"]), max_new_tokens=4, thinking=False,
                                 skip_blank_tiles=True, token_pruning_rate=0.5)
    assert final[1] == want.answer
    s = want.stats
    assert s.vision_tokens_after < s.vision_tokens_before
    row = f"| vision tokens before → after reduction | {s.vision_tokens_before} → {s.vision_tokens_after} |"
    assert row in final[3]
    kept = [int(g["caption"].rsplit(" · ", 1)[1].split("/")[0]) for g in final[2]]  # "p1 · tile 1/2 · 3/4 kept"
    assert all(g["caption"].endswith(" kept") for g in final[2]) and sum(kept) == s.vision_tokens_after


def test_long_documents_report_page_progress(client, tmp_path, cold_media_cache):
    """Finding 9: while a PDF is read the page shows "rendering PDF page i/n" (Gradio progress), not one line."""
    from PIL import Image

    from data_recipes.synthetic.export import write_pdf

    pdf = write_pdf([Image.new("RGB", (400, 520), "white")] * 24, tmp_path / "long.pdf")  # ~1 s to render here
    job = client.submit(*document_args([handle_file(pdf)], "How many pages?", max_new_tokens=2), api_name="/document")
    seen = set()
    t0 = time.perf_counter()
    while not job.done():
        assert time.perf_counter() - t0 < 60
        for p in job.status().progress_data or []:
            seen.add((p.desc, p.index, p.length))
        time.sleep(0.01)
    assert "finished by" in job.result()[3]
    # polled, so not every step is seen; "page i/24" must be
    assert any(desc == "rendering PDF page" and n == 24 for desc, _, n in seen), sorted(seen, key=str)


def _progress_seen(job, timeout: float = 60) -> set:
    """Every (desc, index, length) the job's progress showed, polled until it is done."""
    seen, t0 = set(), time.perf_counter()
    while not job.done():
        assert time.perf_counter() - t0 < timeout
        for p in job.status().progress_data or []:
            seen.add((p.desc, p.index, p.length))
        time.sleep(0.01)
    return seen


@pytest.fixture(scope="module")
def long_clip(tmp_path_factory):
    """64 sampled frames of 640x480 noise: decoding takes a good fraction of a second, so polls see it."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "processing"))
    from media_fixtures import make_video

    return make_video(tmp_path_factory.mktemp("clip") / "long.mp4", frames=64, fps=8, size=(640, 480), noise=True)


def test_video_decoding_reports_frames(client, long_clip, cold_media_cache):
    """Finding 9: while a video is decoded (in a sandbox worker) the page shows "video frames decoded i/64"."""
    job = client.submit(*video_args(handle_file(long_clip), "What moves?", fps=8.0, max_frames=64, max_new_tokens=2),
                        api_name="/video")
    seen = _progress_seen(job)
    assert "finished by" in job.result()[4]
    assert any(desc == "video frames decoded" and n == 64 for desc, _, n in seen), sorted(seen, key=str)


def test_chat_attachments_report_progress(client, tmp_path, long_clip, cold_media_cache):
    """Finding 9 in the Chat tab: an attached PDF shows "rendering PDF page i/n", a video "video frames decoded"."""
    from PIL import Image

    from data_recipes.synthetic.export import write_pdf

    pdf = write_pdf([Image.new("RGB", (400, 520), "white")] * 24, tmp_path / "long.pdf")
    for path, desc, n in ((pdf, "rendering PDF page", 24), (long_clip, "video frames decoded", 64)):
        message = {"text": "What is it?", "files": [handle_file(path)]}
        job = client.submit(message, False, 0, 2, 0.0, 12, 8.0, 64, 0.0, api_name="/chat")
        seen = _progress_seen(job)
        assert "finished by" in str(job.result()), job.result()
        assert any(d == desc and length == n for d, _, length in seen), (desc, sorted(seen, key=str))


def test_stop_during_video_decoding_says_stopped(ui_engine, upload_dir, long_clip, cold_media_cache):
    """A Stop pressed while the Video tab's clip is decoded (in a sandbox worker) ends the decode at the next frame;
    the tab's status says "stopped" and no answer is generated."""
    import shutil
    from pathlib import Path

    from ui.controls import AppContext
    from ui.limits import AppLimits
    from ui.stop import STOPPED_TEXT, StopFlag
    from ui.video import answer_video

    clip = shutil.copy(long_clip, Path(upload_dir) / "stop_me.mp4")
    ctx = AppContext(ui_engine, AppLimits(), [Path(upload_dir)])
    flag, frames = StopFlag(), []
    flag.start()

    def progress(step, desc=None, unit=None):  # gr.Progress's call signature
        if desc == "video frames decoded":
            frames.append(step)
            if step[0] == 3:
                flag.stop()  # the user presses Stop while the third frame is shown

    outs = list(answer_video(ctx, clip, "What moves?", 8.0, 64, 0.0, False, 0, 4, 0.0, flag, progress))
    assert outs[-1][1] == "" and outs[-1][4] == STOPPED_TEXT, outs[-1]
    assert frames == [(1, 64), (2, 64), (3, 64)], frames
