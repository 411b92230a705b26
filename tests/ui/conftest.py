"""Fixtures for the app tests: one tiny random checkpoint, the bundled examples, and the app served in-process.

Everything is session-scoped (the tiny checkpoint's tokenizer takes the longest to build). The upload folder is
a fresh directory set through GRADIO_TEMP_DIR before any component is built, as `vl app` does.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from ui_helpers import wait_ready

from ui.measure import free_port, vl_command

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    from tiny_models import make_tiny_vl_dir

    return Path(make_tiny_vl_dir(tmp_path_factory.mktemp("tiny_vl")))


@pytest.fixture(scope="session")
def tiny_omni_dir(tmp_path_factory) -> Path:
    """A tiny random Nemotron 3 Nano Omni directory that hears (tests/tiny_models.py)."""
    from tiny_models import make_tiny_omni_dir

    return Path(make_tiny_omni_dir(tmp_path_factory.mktemp("tiny_omni") / "omni")[0])


@pytest.fixture(scope="session")
def omni_engine(tiny_omni_dir, examples, upload_dir):
    """The app's engine over `tiny_omni_dir`, uploads decoded in sandbox workers, as `vl app --model` loads it."""
    from ui.limits import AppLimits
    from ui.runner import UIEngine

    return UIEngine.from_pretrained(tiny_omni_dir, isolate=True, limits=AppLimits().media,
                                    allowed_roots=[upload_dir, examples.dir])


@pytest.fixture(scope="session")
def endless_dir(tiny_dir, tmp_path_factory) -> Path:
    """`tiny_dir` whose answers never end on their own: the lm_head rows of its stop tokens are zeroed, so
    their logits are 0 while the largest of the other ~300 random logits is positive at every step."""
    import shutil

    from safetensors.torch import load_file, save_file

    import vl

    out = Path(shutil.copytree(tiny_dir, tmp_path_factory.mktemp("endless") / "model"))
    stop_ids = sorted(vl.Engine.from_pretrained(tiny_dir).stop_ids)
    weights = load_file(out / "model.safetensors")
    weights["language_model.lm_head.weight"][stop_ids] = 0
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    return out


@pytest.fixture(scope="session")
def examples(tmp_path_factory):
    from ui.examples import ensure_examples, tab_examples

    directory, records = ensure_examples(tmp_path_factory.mktemp("ui_examples"))
    return SimpleNamespace(dir=directory, records=records, tabs=tab_examples(directory, records))


@pytest.fixture(scope="session")
def upload_dir(tmp_path_factory):
    before = {k: os.environ.get(k) for k in ("GRADIO_TEMP_DIR", "GRADIO_ANALYTICS_ENABLED")}
    path = tmp_path_factory.mktemp("gradio_uploads")
    os.environ["GRADIO_TEMP_DIR"] = str(path)
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
    yield path.resolve()
    for k, v in before.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def ui_engine(tiny_dir, examples, upload_dir):
    from ui.limits import AppLimits
    from ui.runner import UIEngine

    return UIEngine.from_pretrained(tiny_dir, isolate=True, limits=AppLimits().media,
                                    allowed_roots=[upload_dir, examples.dir])


@pytest.fixture()
def cold_media_cache(ui_engine):
    """The app engine's processed attachments forgotten (ui/chat_media.py): a test that watches a file being
    decoded or rendered must not be served from an earlier test's cache."""
    from ui.chat_media import MediaCache

    ui_engine.media_cache = MediaCache(ui_engine.media_cache.max_bytes)
    return ui_engine.media_cache


@pytest.fixture(scope="session")
def reference_engine(tiny_dir):
    """A plain `vl.Engine` (no UI subclass, in-process decoding): what the app's answers must equal."""
    import vl

    return vl.Engine.from_pretrained(tiny_dir)


def _serve(engine, examples, tiny_dir, limits):
    from ui.app import build_app, launch_app

    demo = build_app(engine, limits=limits, examples_dir=examples.dir, examples=examples.records,
                     model_name="tiny")
    launch_app(demo, port=free_port(), limits=limits, model_dir=tiny_dir, examples_dir=examples.dir,
               prevent_thread_lock=True, quiet=True)
    return demo


@pytest.fixture(scope="session")
def app(ui_engine, examples, tiny_dir):
    from ui.limits import AppLimits

    limits = AppLimits()
    demo = _serve(ui_engine, examples, tiny_dir, limits)
    yield SimpleNamespace(url=demo.local_url, demo=demo, engine=ui_engine, limits=limits)
    demo.close()


CLI_LIMITS = dict(queue_size=2, timeout_s=0.8, max_upload_mb=1)  # 0.8 s: the 2048-token run of
# test_time_limit_cuts_the_answer takes ~1.7 s on a busy 2-core machine (~1200 tok/s with the CPU decode GEMV),
# and its model never stops on its own, so only the limit can end it early; the first tokens come in ~0.15 s


@pytest.fixture(scope="session")
def cli_proc(endless_dir, examples, tmp_path_factory):
    """The real `vl app` command in a subprocess over `endless_dir`, with tight limits: a 2-deep queue, answers
    cut at 3 s, 1 MB uploads. Started without waiting for it (see `_boot_cli_app_early`)."""
    port = free_port()
    # VL_CPU_DECODE=off: the time limit below is sized for decoding through the modules; the fused CPU step
    # (docs/cpu_decode.md) would finish the 2048-token run inside it
    env = {**os.environ, "GRADIO_TEMP_DIR": str(tmp_path_factory.mktemp("cli_uploads")),
           "GRADIO_ANALYTICS_ENABLED": "False", "VL_CPU_DECODE": "off"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(vl_command() + ["app", "--model", str(endless_dir), "--port", str(port),
                                            "--examples-dir", str(examples.dir),
                                            "--queue-size", str(CLI_LIMITS["queue_size"]),
                                            "--timeout", str(CLI_LIMITS["timeout_s"]),
                                            "--max-upload-mb", str(CLI_LIMITS["max_upload_mb"])],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        yield SimpleNamespace(proc=proc, url=f"http://127.0.0.1:{port}/", t0=t0, **CLI_LIMITS)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session", autouse=True)
def _boot_cli_app_early(request):
    """When this session will use `cli_app`, start it now, so it boots while the in-process tests run."""
    if any("cli_app" in getattr(item, "fixturenames", ()) for item in request.session.items):
        request.getfixturevalue("cli_proc")


@pytest.fixture(scope="session")
def cli_app(cli_proc):
    """`cli_proc` once it serves its page; `startup_s` is the time from starting the command to a served page."""
    wait_ready(cli_proc.url, cli_proc.proc, timeout=180)
    if not hasattr(cli_proc, "startup_s"):
        cli_proc.startup_s = time.perf_counter() - cli_proc.t0
    return cli_proc


@pytest.fixture()
def client(app):
    from gradio_client import Client

    return Client(app.url, verbose=False, download_files=False)


@pytest.fixture(scope="session")
def checkpoints_folder(tiny_dir, tmp_path_factory) -> Path:
    """A folder of checkpoints as `vl app --model DIR` gets it: two tiny random models (`alpha` is `tiny_dir`,
    linked; `beta` is `tiny_dir` with its lm_head negated, so its greedy tokens differ at every step), the shipped
    demo model when it exists (`demo`), one whose weights are missing (`broken`), one whose config names an
    unsupported architecture (`stray`, skipped), and a folder that is no checkpoint (`notes`)."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    folder = tmp_path_factory.mktemp("checkpoints")
    (folder / "alpha").symlink_to(tiny_dir, target_is_directory=True)
    beta = Path(shutil.copytree(tiny_dir, folder / "beta"))
    weights = load_file(beta / "model.safetensors")
    weights["language_model.lm_head.weight"] = -weights["language_model.lm_head.weight"]
    save_file(weights, beta / "model.safetensors", metadata={"format": "pt"})
    demo = REPO / "vl" / "demo"
    if (demo / "config.json").is_file():
        (folder / "demo").symlink_to(demo, target_is_directory=True)
    shutil.copytree(tiny_dir, folder / "broken", ignore=shutil.ignore_patterns("*.safetensors"))
    (folder / "stray").mkdir()
    (folder / "stray" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "notes").mkdir()
    (folder / "notes" / "README.txt").write_text("not a checkpoint\n")
    return folder


@pytest.fixture(scope="session")
def picker_served(checkpoints_folder, examples, upload_dir):
    """The app in-process over `checkpoints_folder`, with the model picker, as `vl app --model FOLDER` builds it.
    `loaded` keeps a weak reference to every engine the app loaded (to see that a switch frees the old one);
    each load waits `load_delay_s` more, so that the loading step can be watched."""
    import weakref

    from ui.app import _model_choices, build_app, launch_app
    from ui.limits import AppLimits
    from ui.runner import UIEngine

    limits = AppLimits()
    state = SimpleNamespace(loaded=[], load_delay_s=0.0)

    def load(path):
        time.sleep(state.load_delay_s)
        engine = UIEngine.from_pretrained(path, isolate=True, limits=limits.media,
                                          allowed_roots=[upload_dir, examples.dir])
        state.loaded.append((Path(path).name, weakref.ref(engine)))
        return engine

    first, models = _model_choices(checkpoints_folder, load)
    demo = build_app(load(first), limits=limits, examples_dir=examples.dir, examples=examples.records,
                     model_name=models.current, models=models)
    launch_app(demo, port=free_port(), limits=limits, model_dir=checkpoints_folder, examples_dir=examples.dir,
               prevent_thread_lock=True, quiet=True)
    state.url, state.models = demo.local_url, models
    yield state
    demo.close()


@pytest.fixture(scope="session")
def hearing_picker_served(tiny_dir, tiny_omni_dir, examples, upload_dir, tmp_path_factory):
    """The app in-process with the model picker over a folder of a model that does not hear (`vl`: `tiny_dir`, Nano
    V2 VL, served first) and one that hears (`omni`: `tiny_omni_dir`), as `vl app --model FOLDER` builds it."""
    from ui.app import _model_choices, build_app, launch_app
    from ui.limits import AppLimits
    from ui.runner import UIEngine

    folder = tmp_path_factory.mktemp("deaf_and_hearing")
    (folder / "vl").symlink_to(tiny_dir, target_is_directory=True)
    (folder / "omni").symlink_to(tiny_omni_dir, target_is_directory=True)
    limits = AppLimits()

    def load(path):
        return UIEngine.from_pretrained(path, isolate=True, limits=limits.media,
                                        allowed_roots=[upload_dir, examples.dir])

    first, models = _model_choices(folder, load)
    demo = build_app(load(first), limits=limits, examples_dir=examples.dir, examples=examples.records,
                     model_name=models.current, models=models)
    launch_app(demo, port=free_port(), limits=limits, model_dir=folder, examples_dir=examples.dir,
               prevent_thread_lock=True, quiet=True)
    yield SimpleNamespace(url=demo.local_url, demo=demo, models=models)
    demo.close()
