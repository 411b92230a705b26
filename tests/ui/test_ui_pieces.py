"""The app's parts without a server: the stream loop, stop-by-close, previews, the EVS chart, chat history,
option checks, error messages and the served-path rules."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ui.limits import AppLimits, check_upload, user_error
from ui.runner import GenOptions, previews, stream_chat, tile_images
from vl.errors import CorruptMediaError, GenerationOptionError, InputError, RemoteMediaError


def _doc_messages(examples, question="What is the total?"):
    png = next(e["path"] for e in examples.tabs["document"] if e["path"].endswith(".png"))
    return [{"role": "user", "content": [{"type": "image", "image": png}, {"type": "text", "text": question}]}]


def test_stream_chat_snapshots_grow_and_end_equal_to_engine(ui_engine, reference_engine, examples, monkeypatch):
    import ui.runner

    monkeypatch.setattr(ui.runner, "YIELD_EVERY_S", 0.0)  # a snapshot per event: the test sees every step
    messages = _doc_messages(examples)
    opts = GenOptions(thinking=True, max_new_tokens=12)
    snaps = [(s.reasoning, s.answer, s.done) for s in stream_chat(ui_engine, messages, opts, timeout_s=60)]
    want = reference_engine.chat(messages, **opts.engine_kwargs())
    assert snaps[-1] == (want.reasoning, want.answer, True)
    assert all(not d for _, _, d in snaps[:-1]) and len(snaps) >= 3, snaps
    for (r0, a0, _), (r1, a1, _) in zip(snaps, snaps[1:]):
        assert r1.startswith(r0) and a1.startswith(a0)


def test_closing_the_stream_stops_the_engine_at_once(ui_engine, examples):
    """What the Stop button causes: Gradio closes our generator; the engine must be free right after."""
    it = stream_chat(ui_engine, _doc_messages(examples), GenOptions(thinking=True, max_new_tokens=2000), timeout_s=60)
    next(it)
    assert not ui_engine._lock.acquire(blocking=False)  # generating: the engine is busy
    it.close()
    got = ui_engine._lock.acquire(timeout=1.0)
    assert got, "the engine stayed busy after the stream was closed"
    ui_engine._lock.release()


def test_previews_show_the_tiles_the_model_saw(ui_engine, examples):
    snap = list(stream_chat(ui_engine, _doc_messages(examples), GenOptions(max_new_tokens=1), timeout_s=60))[-1]
    stats, cfg = snap.result.stats, ui_engine.model.config
    shown = previews(stats, cfg, limit=100)
    assert len(shown) == stats.pixel_values.shape[0] == stats.vision_tokens_before // cfg.tokens_per_tile
    assert shown[-1].caption == "thumbnail" and shown[0].caption == f"tile 1/{len(shown) - 1}" and len(shown) > 4
    assert len(previews(stats, cfg, limit=4)) == 4
    # the thumbnail is the whole page: mostly white paper, like the PNG itself
    assert sum(shown[-1].image.convert("L").getdata()) / (64 * 64) > 150


def test_tile_images_invert_the_normalization():
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    rgb = torch.tensor([0.2, 0.6, 0.8])
    x = ((rgb - torch.tensor(mean)) / torch.tensor(std)).view(1, 3, 1, 1).expand(1, 3, 2, 2)
    img = tile_images(x, mean, std)[0]
    assert img.getpixel((1, 1)) == tuple(round(v * 255) for v in rgb.tolist())


def test_evs_chart_draws_kept_and_removed_per_frame():
    from ui.video import evs_chart

    fig = evs_chart([0.0, 0.5, 1.0], [4, 1, 2], 4, {"q": 0.5})
    ax = fig.axes[0]
    bars = [p.get_height() for p in ax.patches]
    assert bars == [4, 1, 2, 0, 3, 2]  # kept, then removed on top
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0.0", "0.5", "1.0"]
    assert "7 of 12" in ax.get_title()


def test_kept_per_frame_without_evs_is_every_token():
    from types import SimpleNamespace

    from ui.video import kept_per_frame

    item = SimpleNamespace(kind="video", num_tiles=3, timestamps=[0.0, 0.5, 1.0])
    stats = SimpleNamespace(media_items=[item], reductions=[])
    assert kept_per_frame(stats, SimpleNamespace(tokens_per_tile=256)) == ([0.0, 0.5, 1.0], [256] * 3, 256, {})


def test_kept_per_frame_of_omni_counts_tubelets():
    """Nemotron 3 Nano Omni: 5 frames in tubelets of 2 -> 3 bars at the first frame of each, the video's tokens
    shared among them; with EVS, its per-tubelet counts."""
    from types import SimpleNamespace

    from ui.video import evs_chart, kept_per_frame
    from vl.processing.omni_processor import OmniMediaInfo

    video = OmniMediaInfo("video", 48, (4, 4), num_frames=5, timestamps=[0.0, 0.5, 1.0, 1.5, 2.0])
    sound = OmniMediaInfo("audio", 26, num_samples=32000, from_video=True)
    config = SimpleNamespace(video_temporal_patch_size=2)
    stats = SimpleNamespace(media_items=[video, sound], reductions=[])
    assert kept_per_frame(stats, config) == ([0.0, 1.0, 2.0], [16, 16, 16], 16, {})
    evs = {"method": "evs", "q": 0.5, "counts": [16, 5, 3]}
    stats.reductions = [evs]
    ts, kept, per, info = kept_per_frame(stats, config)
    assert (ts, kept, per, info) == ([0.0, 1.0, 2.0], [16, 5, 3], 16, evs)
    ax = evs_chart(ts, kept, per, info, "tubelets").axes[0]
    assert ax.get_title().startswith("3 tubelets: 24 of 48 vision tokens kept")


def test_chat_history_becomes_engine_turns(tmp_path):
    from types import SimpleNamespace

    from ui.chat import chat_messages

    root = tmp_path / "uploads"
    root.mkdir()
    img = root / "a.png"
    img.write_bytes(b"x")
    ctx = SimpleNamespace(media_roots=[root.resolve()], limits=AppLimits())
    history = [
        {"role": "user", "content": [{"type": "file", "file": {"path": str(img)}}]},
        {"role": "user", "content": [{"type": "text", "text": "What is it?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "thinking..."}],
         "metadata": {"title": "Reasoning"}},
        {"role": "assistant", "content": [{"type": "text", "text": "A page."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "| stats |"}], "metadata": {"title": "Stats"}},
    ]
    turns = chat_messages(ctx, {"text": "And the total?", "files": []}, history)
    assert turns == [
        {"role": "user", "content": [{"type": "image", "image": str(img.resolve())},
                                     {"type": "text", "text": "What is it?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A page."}]},
        {"role": "user", "content": [{"type": "text", "text": "And the total?"}]},
    ]
    with pytest.raises(RemoteMediaError):  # a path the client made up, outside the upload folder
        chat_messages(ctx, {"text": "hi", "files": ["/etc/hostname"]}, [])
    with pytest.raises(InputError, match="type a message"):
        chat_messages(ctx, {"text": " ", "files": [str(img)]}, [])


def test_upload_checks(tmp_path):
    root = tmp_path / "up"
    root.mkdir()
    f = root / "x.pdf"
    f.write_bytes(b"%PDF-" + b"0" * 100)
    assert check_upload(str(f), [root.resolve()], 1000) == str(f.resolve())
    with pytest.raises(InputError, match="capped at"):
        check_upload(str(f), [root.resolve()], 10)
    with pytest.raises(RemoteMediaError):
        check_upload(str(root / ".." / "elsewhere.pdf"), [root.resolve()], 1000)
    with pytest.raises(InputError, match="is gone"):
        check_upload(str(root / "missing.pdf"), [root.resolve()], 1000)


def test_generation_options_are_checked_on_the_server():
    from ui.controls import gen_options

    lim = AppLimits(max_new_tokens=64)
    assert gen_options(lim, True, 0, 10, 0.5) == GenOptions(True, None, 10, 0.5)
    assert gen_options(lim, False, 32, 10.0, 0).reasoning_budget == 32
    for bad in [(False, 0, 65, 0), (False, 0, 1.5, 0), (False, -1, 8, 0), (False, 0, 8, 3.0), (False, 0, "x", 0)]:
        with pytest.raises(GenerationOptionError):
            gen_options(lim, *bad)
    with pytest.raises(GenerationOptionError):
        AppLimits(queue_size=0)


def test_errors_become_safe_messages():
    import gradio as gr

    e = user_error(CorruptMediaError("cannot decode <b>evil.png</b>"))
    assert isinstance(e, gr.Error) and "&lt;b&gt;" in e.message and "corrupt_media" in e.message
    e = user_error(RuntimeError("secret /work/path detail"))
    assert "request id" in e.message and "secret" not in e.message


def test_served_paths_block_everything_but_the_examples(tmp_path, monkeypatch):
    from ui.app import served_paths

    repo = tmp_path / "repo"
    for d in ["ui/examples", "ui/other", "vl/demo", ".venv"]:
        (repo / d).mkdir(parents=True)
    (repo / "README.md").write_text("x")
    (repo / "ui" / "app.py").write_text("x")
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "uploads"))
    allowed, blocked = served_paths(repo / "vl" / "demo", repo / "ui" / "examples", cwd=repo)
    assert allowed == [str((repo / "ui" / "examples").resolve())]
    r = repo.resolve()
    assert set(blocked) == {str(r / p) for p in ["README.md", ".venv", "vl", "vl/demo", "ui/other", "ui/app.py"]}
    # launched elsewhere: the whole working directory is blocked
    _, blocked = served_paths(repo / "vl" / "demo", tmp_path / "ex", cwd=repo)
    assert str(r) in blocked


def test_a_link_towards_a_kept_folder_does_not_block_it(tmp_path):
    """A venv holds `lib64 -> lib`. Gradio resolves blocked paths, so blocking the link blocked `lib`, and with it
    the gradio icons the Chat tab shows ("New chat" was a broken image under `make app`)."""
    from gradio.utils import is_allowed_file

    from ui.app import _block_all_but

    root = tmp_path / "repo"
    icons = root / ".venv" / "lib" / "gradio" / "icons"
    icons.mkdir(parents=True)
    (icons / "plus.svg").write_text("<svg/>")
    (root / ".venv" / "lib" / "gradio" / "utils.py").write_text("x")
    (root / ".venv" / "lib64").symlink_to("lib", target_is_directory=True)
    (root / "secret.txt").write_text("x")
    (root / "loop").symlink_to(root / "loop")
    blocked = [str(p) for p in _block_all_but(root.resolve(), [icons.resolve()])]
    assert is_allowed_file(icons / "plus.svg", blocked, [str(icons)], []) == (True, "allowed")
    for other in (root / ".venv" / "lib" / "gradio" / "utils.py", root / ".venv" / "lib64" / "gradio" / "utils.py",
                  root / "secret.txt"):
        assert is_allowed_file(other, blocked, [str(icons)], [])[1] == "in_blocklist", other


def test_nothing_happens_at_import():
    """`vl app` imports ui.app first: that import must not load gradio, torch or a model, nor start threads."""
    import os
    import subprocess
    import sys

    code = ("import sys, threading, ui.app; heavy = {'gradio', 'torch', 'transformers'} & set(sys.modules); "
            "assert not heavy, heavy; assert threading.active_count() == 1; print('ok')")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(root)})
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_a_failed_chat_turn_is_left_out_of_later_prompts(tmp_path):
    """Issue: one bad upload used to lock the chat. Its error is an assistant message now; the next turn must not
    send the failed turn (its broken file) to the model again, whichever form Gradio gives the history in."""
    from types import SimpleNamespace

    from ui.chat import ERROR_MARK, chat_messages, is_error_message

    root = tmp_path / "uploads"
    root.mkdir()
    bad, good = root / "bad.png", root / "good.png"
    bad.write_bytes(b"text")
    good.write_bytes(b"x")
    ctx = SimpleNamespace(media_roots=[root.resolve()], limits=AppLimits())
    error = f"{ERROR_MARK}**Input refused:** not an image [unsupported_format]"
    for content in (error, [{"type": "text", "text": error}]):
        history = [{"role": "user", "content": [{"type": "file", "file": {"path": str(bad)}}]},
                   {"role": "user", "content": "What is it?"},
                   {"role": "assistant", "content": content}]
        assert is_error_message(history[-1])
        turns = chat_messages(ctx, {"text": "And this one?", "files": [str(good)]}, history)
        assert turns == [{"role": "user", "content": [{"type": "image", "image": str(good.resolve())},
                                                      {"type": "text", "text": "And this one?"}]}]
    assert not is_error_message({"role": "assistant", "content": "A page."})
    assert not is_error_message({"role": "user", "content": error})


def test_advice_is_rewritten_for_where_it_is_shown():
    from ui.limits import app_advice, error_text
    from vl.errors import MediaTooLargeError, TooManyItemsError

    pages = MediaTooLargeError("40 pages selected, at most 32 are rendered per request; pass a page range such as "
                               "'1-20'.")
    assert "PDF pages box" in error_text(pages, "document")[1] and "pass a page range" not in error_text(pages)[1]
    assert "Document QA tab" in error_text(pages, "chat")[1]
    many = TooManyItemsError("at most 4 image(s) per request are accepted, found 5; split the request or raise "
                             "MediaLimits.max_images.")
    title, text = error_text(many, "chat")
    assert title == "Input refused" and "MediaLimits" not in text and text.endswith("[too_many_items]")
    assert app_advice("nothing to rewrite") == "nothing to rewrite"


def test_stats_say_when_the_model_ended_inside_its_reasoning():
    from ui.runner import stats_markdown
    from vl.runtime.engine import ChatResult, Stats

    inside = ChatResult("thinking", "thinking", "", [1, 2], Stats(new_tokens=2), "stop", reasoning_truncated=True)
    text = stats_markdown(inside)
    assert "| finished by | end of turn inside the reasoning |" in text
    assert "raise max new tokens" not in text and "would not change this" in text
    out_of_tokens = ChatResult("t", "t", "", [1], Stats(new_tokens=1), "length", reasoning_truncated=True)
    assert "raise max new tokens" in stats_markdown(out_of_tokens)


def test_kept_tokens_are_drawn_on_their_squares():
    import numpy as np
    import torch
    from PIL import Image

    from ui.kept_tokens import draw_kept, keep_grids

    keep = torch.tensor([True, False, True, True] + [True] * 4)  # two tiles of 2 x 2 tokens
    grids = keep_grids(keep, 2, 4)
    assert [g.tolist() for g in grids] == [[[True, False], [True, True]], [[True, True], [True, True]]]
    tile = Image.new("RGB", (64, 64), (0, 0, 0))
    drawn = np.asarray(draw_kept(tile, grids[0]))
    assert drawn[40:60, 4:28].max() == 0  # a kept square is untouched
    assert drawn[8:28, 40:60].min() > 100  # the dropped one (row 0, column 1) is washed out
    assert keep_grids(None, 2, 4) is None
    with pytest.raises(ValueError):
        keep_grids(keep, 3, 4)


def test_chat_export_names_files_and_keeps_titles(tmp_path):
    import json

    from ui.chat_export import conversation_markdown, export_files

    history = [{"role": "user", "content": [{"type": "file", "file": {"path": "/srv/up/abc/page.png"}},
                                            {"type": "text", "text": "What is the total?"}]},
               {"role": "assistant", "content": "the TOTAL line", "metadata": {"title": "Reasoning"}},
               {"role": "assistant", "content": [{"type": "text", "text": "12"}]}]
    paths = export_files(history, tmp_path)
    data = json.loads(Path(paths[0]).read_text())
    assert data == [{"role": "user", "content": [{"type": "file", "name": "page.png"},
                                                 {"type": "text", "text": "What is the total?"}]},
                    {"role": "assistant", "content": [{"type": "text", "text": "the TOTAL line"}],
                     "title": "Reasoning"},
                    {"role": "assistant", "content": [{"type": "text", "text": "12"}]}]
    md = Path(paths[1]).read_text()
    assert md == conversation_markdown(history) and "/srv/up" not in md and "*(file: page.png)*" in md
    assert "**Assistant · Reasoning:**" in md


def test_page_picker_keeps_the_range_sorted_and_compact():
    from ui.page_picker import add_page

    assert add_page("", 3) == "3"
    assert add_page("3", 1) == "1,3"
    assert add_page("1,3", 2) == "1-3"
    assert add_page("1-3,7", 5) == "1-3,5,7"
    assert add_page("1-3", 2) == "1-3"


def test_the_media_tabs_follow_what_the_engine_says_about_vision():
    """Issue 52 item 1: the app read `engine.processor.has_vision`, which a `RemoteEngine` does not have (the app
    crashed at start-up with --backend). A remote engine says `has_vision` (None when its server does not say:
    the tabs are built, and the server's no_vision error is shown if it has none); a local one has a processor."""
    from types import SimpleNamespace

    from ui.app import has_vision

    assert has_vision(SimpleNamespace(has_vision=True)) and not has_vision(SimpleNamespace(has_vision=False))
    assert has_vision(SimpleNamespace(has_vision=None))  # unknown: assume vision
    assert has_vision(SimpleNamespace())  # an engine that says nothing at all
    assert not has_vision(SimpleNamespace(processor=SimpleNamespace(has_vision=False)))  # text-only Nemotron-H
    assert has_vision(SimpleNamespace(processor=SimpleNamespace(has_vision=True)))


def test_the_upload_filters_name_every_image_format_the_decoder_accepts():
    """A format the decoder reads but the upload filter leaves out is one the app's user can never send
    (TIFF scans and HEIC phone photos were)."""
    from PIL import Image

    from ui.documents import IMAGE_TYPES
    from vl.processing.images import ALLOWED_FORMATS

    Image.init()
    extensions = {fmt: {e for e, f in Image.registered_extensions().items() if f == fmt} for fmt in ALLOWED_FORMATS}
    extensions["HEIF"] = {".heic", ".heif"}  # pillow-heif registers its extensions only once a HEIF file is opened
    extensions["AVIF"] = {".avif"}
    for fmt, names in extensions.items():
        assert names & set(IMAGE_TYPES), f"{fmt} ({sorted(names)}) is decoded but missing from IMAGE_TYPES"
