"""`vl app` as a command: its limit flags take effect, and a model that cannot load is never served (S13)."""

from __future__ import annotations

import re
import shutil
import urllib.error
import urllib.request

import pytest
from gradio_client import Client, handle_file
from ui_helpers import document_args

from ui.measure import free_port, vl_command

pytestmark = pytest.mark.timeout(240)


def test_time_limit_cuts_the_answer(cli_app, examples):
    ex = next(e for e in examples.tabs["document"] if e["path"].endswith(".png"))
    c = Client(cli_app.url, verbose=False, download_files=False)
    # the app's model never stops on its own (conftest.endless_dir): only the time limit ends this run early
    out = c.predict(*document_args([handle_file(ex["path"])], ex["question"], thinking=True, max_new_tokens=2048),
                    api_name="/document")
    assert "time limit reached" in out[3] and f"time limit of {cli_app.timeout_s:g} s" in out[3], out[3]
    new_tokens = int(re.search(r"\| new tokens \| (\d+) \|", out[3]).group(1))
    assert out[0] and 0 < new_tokens < 2048, out[3]  # cut by the limit: the model alone would run all 2048


def test_upload_over_the_cap_is_refused(cli_app):
    body = b"\x89PNG\r\n\x1a\n" + b"\x00" * (2 << 20)  # 2 MB against --max-upload-mb 1
    req = urllib.request.Request(cli_app.url + "gradio_api/upload", method="POST",
                                 data=b"--B\r\nContent-Disposition: form-data; name=\"files\"; filename=\"big.png\"\r\n"
                                      b"Content-Type: image/png\r\n\r\n" + body + b"\r\n--B--\r\n",
                                 headers={"Content-Type": "multipart/form-data; boundary=B"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=30)
    assert err.value.code == 413


def test_startup_fails_cleanly_without_a_model(tmp_path, examples, monkeypatch, capsys):
    """Matrix S13: a missing or broken checkpoint exits non-zero with a clear message; nothing is served."""
    from ui import app

    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "uploads"))
    port = ["--port", str(free_port())]  # the port is checked first: one in use here must not decide this test
    assert app.main(["--model", str(tmp_path / "nowhere"), "--examples-dir", str(examples.dir)] + port) == 2
    assert "could not load the model" in capsys.readouterr().err

    monkeypatch.setattr(app, "default_model", lambda: str(tmp_path / "demo"))  # the name the app calls
    assert app.main(["--examples-dir", str(examples.dir)] + port) == 2
    assert "the demo model is not in" in capsys.readouterr().err


def test_startup_fails_cleanly_with_a_missing_shard(tmp_path, tiny_dir, examples, monkeypatch, capsys):
    from ui import app

    broken = tmp_path / "broken"
    shutil.copytree(tiny_dir, broken)
    for f in broken.glob("*.safetensors"):
        f.unlink()
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "uploads"))
    assert app.main(["--model", str(broken), "--examples-dir", str(examples.dir), "--port", str(free_port())]) == 2
    err = capsys.readouterr().err
    assert "could not load the model" in err and "safetensors" in err, err


def test_bad_limit_flags_are_refused(capsys):
    from ui import app

    assert app.main(["--queue-size", "0"]) == 2
    assert "queue_size must be a positive int" in capsys.readouterr().err


def test_port_in_use_is_refused_before_loading(tiny_dir, examples, tmp_path):
    """`vl app` on a port that is taken used to load the model (30 s on a real one) and then die with Gradio's
    traceback naming GRADIO_SERVER_PORT. It must stop before loading anything and name --port."""
    import os
    import socket
    import subprocess

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "GRADIO_TEMP_DIR": str(tmp_path / "uploads"), "GRADIO_ANALYTICS_ENABLED": "False"}
        done = subprocess.run(vl_command() + ["app", "--model", str(tiny_dir), "--port", str(port),
                                              "--examples-dir", str(examples.dir)],
                              env=env, capture_output=True, text=True, timeout=180)
    err = done.stderr
    assert done.returncode == 2, err
    assert f"port {port} on 127.0.0.1 is already in use" in err and "--port" in err, err
    assert "GRADIO_SERVER_PORT" not in err and "Traceback" not in err, err
    assert "loading the model" not in err and "[1/5]" not in err, err  # nothing was imported or loaded
