"""The app over a text-only Nemotron-H checkpoint: the Chat tab answers as the engine does (through
gradio_client), an image sent to it is a message, and the document/video tabs say the model has no vision."""

import pytest
from gradio_client import Client, handle_file

from tiny_models import make_tiny_text_dir
from ui.measure import free_port

QUESTION = "What is the total?"


@pytest.fixture(scope="module")
def text_app(tmp_path_factory, upload_dir):
    import vl
    from ui.app import build_app, launch_app
    from ui.limits import AppLimits
    from ui.runner import UIEngine

    path, _ = make_tiny_text_dir(tmp_path_factory.mktemp("text_app") / "nh")
    limits = AppLimits()
    engine = UIEngine.from_pretrained(path, isolate=True, limits=limits.media, allowed_roots=[upload_dir])
    demo = build_app(engine, limits=limits, model_name="tiny-text")
    launch_app(demo, port=free_port(), limits=limits, model_dir=path, prevent_thread_lock=True, quiet=True)
    yield demo, vl.Engine.from_pretrained(path)
    demo.close()


def test_chat_tab_answers_like_the_engine(text_app):
    demo, reference = text_app
    client = Client(demo.local_url, verbose=False, download_files=False)
    job = client.submit({"text": QUESTION, "files": []}, False, 0, 12, 0.0, 12, 2.0, 16, 0.0, api_name="/chat")
    final = job.result(timeout=60)
    want = reference.chat([{"role": "user", "content": [{"type": "text", "text": QUESTION}]}], max_new_tokens=12,
                          thinking=False)
    assert final[0]["content"] == (want.answer or "*(no answer)*") and final[1]["metadata"]["title"] == "Stats"


def test_image_in_chat_is_a_message_and_tabs_say_no_vision(text_app, tmp_path):
    from PIL import Image

    demo, _ = text_app
    png = tmp_path / "a.png"
    Image.new("RGB", (8, 8), "white").save(png)
    client = Client(demo.local_url, verbose=False, download_files=False)
    # a failed chat turn is answered with the error as the assistant's message (the chat stays usable)
    out = client.predict({"text": QUESTION, "files": [handle_file(str(png))]}, False, 0, 4, 0.0, 12, 2.0, 16, 0.0,
                         api_name="/chat")
    assert "text-only model" in (out if isinstance(out, str) else str(out))
    config = demo.get_config_file()
    texts = [c.get("props", {}).get("value") for c in config["components"] if c.get("type") == "markdown"]
    assert sum(1 for t in texts if isinstance(t, str) and "text-only" in t and "Chat tab" in t) == 2
    names = {d.get("api_name") for d in config["dependencies"]}
    assert "chat" in names and not {"document", "video"} & names
