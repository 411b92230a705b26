"""`vl app`: the Gradio app for document and long-video question answering.

    vl app [--model PATH] [--host 127.0.0.1] [--port 7860] [--device-map ...] [--dtype ...]

Loads the model once (the shipped demo model, vl/demo, unless --model is given), then serves three tabs
(Document QA, Video QA, Chat) over one engine. `--model FOLDER` of several checkpoints adds a model picker
(ui/model_picker.py). Configuration follows docs/reliability_policy.md §3.2's safe-run
checklist: bound to localhost, no share link, an upload size cap, a bounded queue with one model slot shared by
every tab, the REST routes closed to queue skipping, monitoring off, and file serving limited to uploads and
the bundled examples (the model folder and the working directory are blocked). Uploads are decoded in sandbox
workers (`Processor(isolate=True)`) and only from the upload folder or the examples (`allowed_roots`).
Nothing happens at import time; `main` does the work.
"""

from __future__ import annotations

import argparse
import errno
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
from pathlib import Path

from ui.examples import ensure_examples, tab_examples
from ui.limits import AppLimits
from ui.page_style import APP_CSS
from ui.steps import Step as _Step
from vl.directory import checkpoint_choices, default_model, synthetic_only
from vl.errors import VLError
from vl.server.client import RemoteEngine

TITLE = "Nemotron Nano V2 VL · documents and video"
NO_VISION = ("This model is text-only (Nemotron-H without a vision tower): it cannot read documents, images or "
             "videos. Use the Chat tab, or start the app with a Nemotron Nano V2 VL checkpoint.")


# --- building ----------------------------------------------------------------------------------------------
DEMO_WARNING = ("**The demo model reads only the small synthetic documents and clips it was trained on** (the "
                "bundled examples below). On real photos, papers or videos its answers are noise. For those, start "
                "the app with a real checkpoint: `vl app --model DIR`.")


def header_text(model_name: str, limits: AppLimits, hears: bool = False) -> str:
    m = limits.media
    audio = (f"up to {m.max_audios} audio clips of at most {m.max_audio_duration_s / 60:g} min · " if hears else "")
    return (f"## {TITLE}\n"
            f"Model: `{model_name}` · "
            f"uploads up to {limits.max_upload_mb} MB · "
            f"up to {m.max_images} images or one PDF of at most {m.max_pdf_pages} pages · one video of at "
            f"most {m.max_video_duration_s / 60:g} min ({limits.max_frames} frames) · {audio}answers stop after "
            f"{limits.request_timeout_s:g} s")


def build_app(engine, *, limits: AppLimits | None = None, examples_dir: str | Path | None = None,
              examples: list[dict] | None = None, model_name: str = "", demo_model: bool = False, models=None):
    """The Blocks app over `engine` (a `ui.runner.UIEngine`); call `launch_app` to serve it.

    `models` (a `ui.model_picker.ModelChoices` whose current one is `engine`): a folder of checkpoints, shown as a
    model picker. Set `GRADIO_TEMP_DIR` before calling: Gradio components fix their upload folder when they are
    built.
    """
    import gradio as gr

    from ui.chat import build_chat_tab
    from ui.controls import MODEL, AppContext, build_controls
    from ui.documents import build_document_tab
    from ui.video import build_video_tab
    from gradio.utils import get_upload_folder

    limits = limits or AppLimits()
    roots = [Path(get_upload_folder()).resolve()] + ([Path(examples_dir).resolve()] if examples_dir else [])
    ctx = AppContext(engine, limits, roots)
    by_tab = tab_examples(Path(examples_dir), examples) if examples_dir and examples else {}
    if not ctx.tiled:  # Nemotron 3 Nano Omni takes no PDF: the PDF examples would only be refused
        by_tab["document"] = [e for e in by_tab.get("document", []) if not e["path"].endswith(".pdf")]
    with gr.Blocks(title=TITLE, delete_cache=(1800, 3600), analytics_enabled=False) as demo:
        header = gr.Markdown(header_text(model_name or type(engine.model).__name__, limits, ctx.hears),
                             label="Header", elem_id="header")
        if demo_model or models is not None:  # with a picker it shows whenever the demo model is the one served
            warning = gr.Markdown(f"⚠️ {DEMO_WARNING}", label="Demo model warning", elem_id="demo-warning",
                                  visible=demo_model)
        if models is not None:
            from ui.model_picker import build_model_picker

            switched = build_model_picker(demo, ctx, models, header, warning,
                                          lambda name: header_text(name, limits, ctx.hears),
                                          dict(concurrency_id=MODEL, concurrency_limit=limits.concurrency))
        controls = build_controls(limits)
        vision = has_vision(engine)
        with gr.Tabs():
            with gr.Tab("Document QA", id="document"):
                if vision:
                    build_document_tab(ctx, controls, by_tab.get("document", []))
                else:
                    gr.Markdown(NO_VISION)
            with gr.Tab("Video QA", id="video"):
                if vision:
                    build_video_tab(ctx, controls, by_tab.get("video", []))
                else:
                    gr.Markdown(NO_VISION)
            with gr.Tab("Chat", id="chat"):
                build_chat_tab(ctx, controls, by_tab.get("document", [])[:1] + by_tab.get("video", [])[:1])
        if models is not None:  # upload filters, sound switches, tiling controls: the served model's, after a switch
            from ui.model_picker import follow_served_model

            follow_served_model(ctx, switched)
    _share_model_slot(demo, MODEL)
    _stop_chat_by_flag(demo)
    demo.queue(max_size=limits.queue_size, default_concurrency_limit=limits.concurrency, api_open=False)
    return demo


def has_vision(engine) -> bool:
    """Whether the tabs that read media are built. A local engine knows from its processor (False for text-only
    Nemotron-H checkpoints); a remote one says `has_vision` when its server tells (None = unknown: the tabs are
    built, and a server that has no vision answers a media question with a `no_vision` error, shown as such)."""
    known = getattr(engine, "has_vision", None)
    if known is None:
        known = getattr(getattr(engine, "processor", None), "has_vision", None)
    return known is not False


def _share_model_slot(demo, concurrency_id: str) -> None:
    """ChatInterface takes no `concurrency_id`; put its generation events in the model's group so that one
    queue and one slot govern every tab (a chat request must not run beside a document request).

    Its generation events are the queued ones with an explicit concurrency limit (the one we passed); its
    bookkeeping events keep Gradio's default group.
    """
    found = 0
    for block_fn in demo.fns.values():
        if block_fn.queue and block_fn.concurrency_limit != "default" and block_fn.concurrency_id != concurrency_id:
            block_fn.concurrency_id = concurrency_id
            found += 1
    if not found:
        raise RuntimeError("could not find the chat tab's generation events; Gradio's ChatInterface changed")


def _stop_chat_by_flag(demo) -> None:
    """The chat textbox's Stop sets the session's stop flag (ui/chat.py), and the engine ends at its next safe
    point, so the answer can still say "(stopped)" and carry its stats. Gradio's own cancel of the chat event
    would drop that last message, so it is taken off the Stop button's event."""
    found = 0
    for block_fn in demo.fns.values():
        if block_fn.fn is None and block_fn.cancels and any(t[1] == "stop" for t in block_fn.targets):
            block_fn.cancels = []
            found += 1
    if found != 1:
        raise RuntimeError(f"expected one Stop-cancels event of the chat textbox, found {found}; Gradio changed")


def served_paths(model_dir, examples_dir, cwd=None) -> tuple[list[str], list[str]]:
    """(allowed_paths, blocked_paths) for launch: serve the examples; block the model folder and the CWD.

    When the CWD holds the examples, the upload folder or Gradio's own icons (running from the repository, whose
    .venv holds gradio: `make app`), everything in it except the way down to them is blocked instead. Gradio's
    blocked paths win over its allowed ones, so a blocked .venv would turn the Chat tab's "New chat" icon into a
    broken image (HTTP 403).
    """
    import gradio
    from gradio.utils import get_upload_folder

    keep = [Path(get_upload_folder()).resolve(), (Path(gradio.__file__).parent / "icons").resolve()]
    keep += [Path(examples_dir).resolve()] if examples_dir else []
    blocked = [Path(model_dir).resolve()] if model_dir else []
    blocked += _block_all_but(Path(cwd or os.getcwd()).resolve(), keep)
    allowed = [str(Path(examples_dir).resolve())] if examples_dir else []
    return allowed, sorted({str(p) for p in blocked})


def _block_all_but(root: Path, keep: list[Path]) -> list[Path]:
    """Every entry under `root` (resolved) except the way down to the `keep` paths (resolved).

    Gradio resolves a blocked path before comparing, so a link blocks what it points to: a venv's `lib64 -> lib`
    link, blocked as such, would block `lib` and the gradio icons in it. A link towards a kept path is therefore
    not blocked: its target is walked instead (where it lies under `root`, it is walked at its real place)."""
    inside = [k for k in keep if k.is_relative_to(root)]
    if not inside:
        return [root]
    if any(k == root for k in inside):
        return []
    out = []
    try:
        children = list(root.iterdir())
    except OSError:
        return []
    for child in children:
        try:
            target = child.resolve()
        except (OSError, RuntimeError):  # a link loop leads nowhere; Gradio would fail resolving it when blocked
            continue
        if not any(k.is_relative_to(target) for k in inside):
            out.append(child.absolute() if child.is_symlink() else target)
        elif not (child.is_symlink() and target.is_relative_to(root)):
            out += _block_all_but(target, inside)
    return out


def launch_app(demo, *, host: str = "127.0.0.1", port: int = 7860, limits: AppLimits | None = None,
               model_dir=None, examples_dir=None, prevent_thread_lock: bool = False, quiet: bool = False):
    limits = limits or AppLimits()
    allowed, blocked = served_paths(model_dir, examples_dir)
    return demo.launch(server_name=host, server_port=port, share=False, max_file_size=limits.max_upload_mb << 20,
                       allowed_paths=allowed, blocked_paths=blocked, show_error=False, enable_monitoring=False,
                       strict_cors=True, ssr_mode=False, prevent_thread_lock=prevent_thread_lock, quiet=quiet,
                       inbrowser=False, css=APP_CSS)


def _is_demo(path) -> bool:
    return synthetic_only(path)  # a config.json key, so copies of the demo (vl quantize) keep the warning


def _model_choices(model, load):
    """(the checkpoint to serve first, a `ui.model_picker.ModelChoices` or None).

    One checkpoint (a directory with config.json, or a folder holding just one): served as before, no picker.
    A folder of several: the picker's first choice, and the picker. Skipped sub-folders are named on the console.
    """
    found, skipped = checkpoint_choices(model)
    for path, why in skipped:
        print(f"vl app: skipping {path.name}: {why}", file=sys.stderr, flush=True)
    if len(found) == 1:
        return found[0][0], None
    from ui.model_picker import ModelChoices

    print(f"vl app: {len(found)} checkpoints in {model}: {', '.join(p.name for p, _ in found)}", file=sys.stderr,
          flush=True)
    models = ModelChoices.from_found(found, load, _is_demo)
    return models.paths[models.current], models


def port_problem(host: str, port: int) -> str | None:
    """Why `vl app` cannot listen on host:port, or None. Checked before anything loads: loading a model takes
    seconds to minutes, and Gradio's own refusal comes after it, naming its environment variable, not `--port`.
    Bound as Gradio binds (SO_REUSEADDR), so a port in TIME_WAIT counts as free."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
        return None
    except socket.gaierror as exc:
        return f"cannot listen on --host {host!r} ({exc.strerror}); pass an address of this machine"
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return (f"port {port} on {host} is already in use (another vl app or server?); pass --port N with a "
                    "free port")
        if exc.errno == errno.EACCES:
            return f"port {port} needs administrator rights on this system; pass --port N above 1023"
        return f"cannot listen on {host}:{port} ({exc.strerror}); pass another --port or --host"


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


# --- command line ------------------------------------------------------------------------------------------
def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="vl app", description="Serve the Gradio app (documents, video, chat).")
    p.add_argument("--model", default=None, help="checkpoint directory, or a folder of checkpoint directories (the "
                   "app then offers a model picker); default: the shipped demo model, vl/demo")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; put a proxy in front "
                   "for anything else)")
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--device-map", default=None, help='accelerate device map, e.g. "auto" (default: CPU, or the '
                   "first GPU)")
    p.add_argument("--dtype", default=None, help="bfloat16 | float16 | float32 (default: the checkpoint's)")
    p.add_argument("--max-upload-mb", type=int, default=AppLimits.max_upload_mb)
    p.add_argument("--queue-size", type=int, default=AppLimits.queue_size)
    p.add_argument("--timeout", type=float, default=AppLimits.request_timeout_s,
                   help="seconds after which an answer is cut off")
    p.add_argument("--examples-dir", default=None, help="where the bundled examples are written on first run")
    p.add_argument("--backend", default=None, metavar="URL", help="answer with the model of an OpenAI-compatible "
                   "server at URL (vl serve, vLLM, ...) instead of loading one here (docs/server.md)")
    p.add_argument("--api-key", default=None, help="with --backend: bearer token (default: $OPENAI_API_KEY)")
    p.add_argument("--served-model", default=None, help="with --backend: model id (default: the one it lists)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    steps = 5
    try:
        limits = AppLimits(max_upload_mb=args.max_upload_mb, queue_size=args.queue_size,
                           request_timeout_s=args.timeout)
    except ValueError as exc:
        print(f"vl app: {exc}", file=sys.stderr)
        return 2

    if problem := port_problem(args.host, args.port):
        print(f"vl app: {problem}", file=sys.stderr)
        return 2
    model = args.model or default_model()
    shown = Path(model).name
    if not (Path(model) / "config.json").is_file() and args.model is None and not args.backend:
        print(f"vl app: the demo model is not in {model} yet; pass --model DIR (a checkpoint directory)",
              file=sys.stderr)
        return 2
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no calls home from a local app
    with _Step(1, steps, "importing torch, transformers and gradio"):
        import gradio  # noqa: F401 - imported here so that the steps below time only their own work
        import transformers  # noqa: F401

        from ui.runner import UIEngine
    with _Step(2, steps, "preparing the upload folder and the bundled examples"):
        own_uploads = None
        if not os.environ.get("GRADIO_TEMP_DIR"):  # a fresh folder per run, removed when the app stops
            own_uploads = os.environ["GRADIO_TEMP_DIR"] = tempfile.mkdtemp(prefix="vl-app-uploads-")
        from gradio.utils import get_upload_folder


        examples_dir, examples = ensure_examples(args.examples_dir)
    models = None
    try:
        with _Step(3, steps, f"asking {args.backend} for its model" if args.backend
                   else f"loading the model from {model}"):
            if args.backend:  # stats only a local engine knows are shown as unavailable (ui/runner.py)
                engine = RemoteEngine(args.backend, api_key=args.api_key or os.environ.get("OPENAI_API_KEY"),
                                      model=args.served_model, limits=limits.media)
                shown, model, served = f"{engine.model_name} at {args.backend}", None, None
            else:
                def load(path):
                    return UIEngine.from_pretrained(path, dtype=args.dtype, device_map=args.device_map,
                                                    isolate=True, limits=limits.media,
                                                    allowed_roots=[get_upload_folder(), examples_dir])

                served, models = _model_choices(model, load)
                engine = load(served)
                if models is not None:
                    shown = models.current
                elif Path(served).parent == Path(model).expanduser():  # a folder holding one checkpoint
                    shown = Path(served).name
    except (VLError, OSError) as exc:  # S13: a broken checkpoint is never served
        what = f"reach the server at {args.backend}" if args.backend else "load the model"
        print(f"vl app: could not {what}: {exc}", file=sys.stderr)
        if own_uploads:
            shutil.rmtree(own_uploads, ignore_errors=True)
        return 2
    with _Step(4, steps, "building the interface"):
        demo = build_app(engine, limits=limits, examples_dir=examples_dir, examples=examples, model_name=shown,
                         demo_model=served is not None and _is_demo(served), models=models)
    print(f"[5/5] serving on http://{args.host}:{args.port} (Ctrl-C stops)", file=sys.stderr, flush=True)
    if threading.current_thread() is threading.main_thread():  # SIGTERM stops like Ctrl-C: uploads are removed
        signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        # quiet: Gradio's own start-up lines repeat the URL above and suggest `share=True`, which vl app never sets
        launch_app(demo, host=args.host, port=args.port, limits=limits, model_dir=model, examples_dir=examples_dir,
                   quiet=True)
    except KeyboardInterrupt:
        pass
    except OSError as exc:  # the port was free before loading and was taken meanwhile
        print(f"vl app: {port_problem(args.host, args.port) or exc}", file=sys.stderr)
        return 2
    finally:
        demo.close()
        if own_uploads:
            shutil.rmtree(own_uploads, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
