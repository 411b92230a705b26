"""`vl.server.client.RemoteEngine` against the `vl serve` app in this process: the same answers as `Engine.chat` for
media given as paths, bytes and PIL images; retries with backoff when nobody answers; typed errors back; the
Gradio app's runner on a remote engine (stats only a local engine knows are shown as unavailable)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "processing"))
from helpers import DEMO, free_port, in_process_server, png_bytes  # noqa: E402
from media_fixtures import make_pdf, make_video, red_square_page  # noqa: E402

from vl.errors import CorruptMediaError, GenerationOptionError, ServerUnavailableError  # noqa: E402
from vl.server.client import RemoteEngine, to_openai_messages  # noqa: E402

pytestmark = pytest.mark.skipif(not (DEMO / "config.json").is_file(), reason="the demo model is not shipped here")


@pytest.fixture(scope="module")
def engine():
    from vl.runtime.engine import Engine

    return Engine.from_pretrained(str(DEMO))


@pytest.fixture(scope="module")
def served(engine):
    with in_process_server(engine, served_names=("demo",), model_info={"vl": {"max_num_tiles": 2}}) as (base, _):
        yield base


def test_remote_chat_equals_engine_chat(engine, served, tmp_path):
    from PIL import Image

    pdf = tmp_path / "doc.pdf"
    pdf.write_bytes(make_pdf([red_square_page()]))
    video = make_video(tmp_path / "clip.mp4", frames=12, fps=4)
    image = Image.new("RGB", (80, 60), "blue")
    remote = RemoteEngine(served)
    assert remote.model_name == "demo" and remote.context_length == engine.context_length
    assert remote.model.config.max_num_tiles == 2
    for part in ({"type": "image", "image": image}, {"type": "image", "image": png_bytes("red")},
                 {"type": "pdf", "pdf": str(pdf)}, {"type": "video", "video": video}):
        messages = [{"role": "user", "content": [part, {"type": "text", "text": "What is it?"}]}]
        wants = {}
        for thinking in (False, True):
            want = wants[thinking] = engine.chat(messages, max_new_tokens=40, thinking=thinking)
            got = remote.chat(messages, max_new_tokens=40, thinking=thinking)
            assert (got.answer, got.reasoning, got.finish_reason) == (want.answer, want.reasoning, want.finish_reason)
            assert got.stats.prompt_tokens == want.stats.prompt_tokens
            assert got.stats.vision_tokens_after == want.stats.vision_tokens_after
            assert got.stats.peak_memory_bytes is None  # not known here: not made up
        stream = remote.chat(messages, max_new_tokens=40, thinking=False, stream=True)
        text = "".join(e.text for e in stream if e.kind == "answer")
        assert text == stream.result.answer == wants[False].answer


def test_errors_come_back_typed_and_retries_back_off(served, monkeypatch):
    remote = RemoteEngine(served)
    with pytest.raises(CorruptMediaError):
        remote.chat([{"role": "user", "content": [{"type": "image", "image": b"\x89PNG\r\n\x1a\nbroken"}]}])
    with pytest.raises(GenerationOptionError):
        remote.chat([{"role": "user", "content": "hi"}], max_new_tokens=10**6)
    nobody = RemoteEngine(f"http://127.0.0.1:{free_port()}", model="x", max_retries=2, backoff_s=0.2)
    waits, sleep, me = [], time.sleep, threading.get_ident()  # the waits this thread asks for, counted not slept
    monkeypatch.setattr(time, "sleep", lambda s: waits.append(s) if threading.get_ident() == me else sleep(s))
    with pytest.raises(ServerUnavailableError, match="3 attempts"):
        nobody.chat([{"role": "user", "content": "hi"}])
    assert waits == [0.2, 0.4]  # exponential backoff between the 3 attempts


def test_messages_carry_media_as_data_uris(tmp_path):
    pdf = tmp_path / "a.pdf"
    pdf.write_bytes(make_pdf([red_square_page()]))
    parts = to_openai_messages([{"role": "user", "content": [{"type": "image", "image": png_bytes()},
                                                             {"type": "pdf", "pdf": str(pdf)},
                                                             {"type": "text", "text": "q"}]}])[0]["content"]
    assert parts[0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert parts[1]["file"]["file_data"].startswith("data:application/pdf;base64,")
    assert parts[1]["file"]["filename"] == "a.pdf" and parts[2] == {"type": "text", "text": "q"}


def test_app_runner_on_a_remote_engine(engine, served):
    from ui.runner import GenOptions, stats_markdown, stream_chat

    remote = RemoteEngine(served)
    messages = [{"role": "user", "content": [{"type": "image", "image": png_bytes("green")},
                                             {"type": "text", "text": "What colour?"}]}]
    snaps = list(stream_chat(remote, messages, GenOptions(max_new_tokens=20), timeout_s=60))
    final = snaps[-1]
    assert final.done and final.answer == engine.chat(messages, max_new_tokens=20, thinking=False).answer
    table = stats_markdown(final.result, timeout_s=60)
    assert "prompt tokens" in table and "remote model 'demo'" in table


def test_eval_sweep_over_a_remote_server(served, tmp_path):
    import json

    from data_recipes.synthetic.export import export_split
    from eval.runner import RunConfig
    from eval.sweep import run_sweep

    tile = json.loads((DEMO / "config.json").read_text())["force_image_size"]
    data = export_split("document", "test", 2, tmp_path / "docs", tile_size=tile)
    cfg = RunConfig(task="synthetic_docs", data=str(data), out=str(tmp_path / "sweep"), backend="openai",
                    base_url=served + "/v1", concurrency=2, batch_size=2, progress=False)
    table = run_sweep(cfg, "max_new_tokens", [2, 16])
    assert [r["n"] for r in table["rows"]] == [2, 2] and all(r["n_error"] == 0 for r in table["rows"])
    assert {r["vision_tokens_after"] for r in table["rows"]} != {None}  # reported by our server
