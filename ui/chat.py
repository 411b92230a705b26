"""Chat tab: multi-turn, multimodal (`gr.ChatInterface` with a multimodal textbox), same controls.

Attachments: images, videos, a PDF (Nano V2 VL) and audio files (a model that hears: Nemotron 3 Nano Omni), each
kept for the later turns of the conversation and processed once (ui/chat_media.py, ui/chat_media_omni.py). For a
model that hears, a video's sound track follows its frames unless the media settings' "Hear the sound track" switch
is off (request option `use_audio_in_video`, as in the Video tab). The upload filter, the switch and the tiling
controls follow the served model across model-picker switches (`AppContext.follow`).

Gradio 6 conventions (gradio-app/gradio `guides/05_chatbots/01_creating-a-chatbot-fast.md`, `03_agents-and-tool-usage.md`): history arrives as OpenAI-style message dicts whose content is a
list of text / file parts; reasoning is shown as a `gr.ChatMessage` with a `title` in its metadata (a
collapsible "thinking" bubble, open while pending, closed when done), followed by the answer message. Past
reasoning bubbles are not sent back to the model (the prompt format keeps only past answers anyway).
"""

from __future__ import annotations

import time
from pathlib import Path

import gradio as gr
from gradio.utils import get_upload_folder

from ui.chat_export import export_files
from ui.controls import AppContext, Controls, api_example, gen_options, shown_if_tiled
from ui.documents import IMAGE_TYPES
from ui.hearing import AUDIO_TYPES, check_hears, is_audio, sound_option, sound_switch
from ui.limits import check_option, check_upload, error_text, slider_max
from ui.runner import gradio_progress, stats_markdown, stream_chat
from ui.stop import StopFlag, stop_state
from ui.video import VIDEO_TYPES
from vl.errors import InputError

THOUGHT_TITLE = "Reasoning"
ERROR_MARK = "⚠️ "  # an assistant message that starts with it reports a failure; it is never sent to the model


def _kind(path: str) -> str:
    """The message part a file becomes, by its name (the decoders then check its bytes; anything unlisted is tried
    as an image and refused by the image decoder with what it found)."""
    ext = Path(path).suffix.lower()
    return ("pdf" if ext == ".pdf" else "video" if ext in VIDEO_TYPES else "audio" if is_audio(path) else "image")


def _parts(content, ctx: AppContext) -> list[dict]:
    """One history message's content (str, file dict, or a list of text/file parts) -> engine content parts."""
    if content is None:
        return []
    if isinstance(content, (list, tuple)):
        return [p for c in content for p in _parts(c, ctx)]
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if isinstance(content, dict):
        if content.get("type") == "text" or "text" in content and "file" not in content:
            return _parts(content.get("text") or "", ctx)
        file = content.get("file", content)
        path = file.get("path") if isinstance(file, dict) else file
        if path:
            path = check_upload(path, ctx.media_roots, ctx.limits.max_upload_mb << 20)
            kind = _kind(path)
            if kind == "audio":
                check_hears(ctx.engine, Path(path).name)
            return [{"type": kind, kind: path}]
        return []
    raise InputError(f"cannot read a chat message part of type {type(content).__name__}")


def is_error_message(m: dict) -> bool:
    """An assistant message made by `respond` from a failure. Gradio 6 hands history content back either as a
    string or as a list of parts ({"type": "text", "text": ...})."""
    if m.get("role") != "assistant":
        return False
    content = m.get("content")
    if isinstance(content, (list, tuple)):
        content = content[0] if len(content) == 1 else None
    if isinstance(content, dict):
        content = content.get("text")
    return isinstance(content, str) and content.startswith(ERROR_MARK)


def chat_messages(ctx: AppContext, message, history) -> list[dict]:
    """Gradio's (message, history) -> engine messages; consecutive parts of one role are one turn.

    A user turn that was answered by an error message is left out (its file may be the broken one), so one bad
    upload does not break every later turn of the conversation."""
    turns: list[dict] = []
    history = list(history or [])
    failed = set()
    for i, m in enumerate(history):
        if is_error_message(m):
            j = i - 1
            while j >= 0 and history[j].get("role") != "user":
                j -= 1
            while j >= 0 and history[j].get("role") == "user":
                failed.add(j)
                j -= 1
    for i, m in enumerate(history):
        role = m.get("role")
        if role not in ("user", "assistant") or i in failed or is_error_message(m):
            continue
        if role == "assistant" and (m.get("metadata") or {}).get("title"):
            continue  # a reasoning bubble
        parts = _parts(m.get("content"), ctx)
        if role == "assistant":
            parts = [p for p in parts if p["type"] == "text"]
        if not parts:
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"] += parts
        else:
            turns.append({"role": role, "content": parts})
    message = message if isinstance(message, dict) else {"text": message or "", "files": []}
    parts = [p for f in message.get("files") or [] for p in _parts({"path": f} if isinstance(f, str) else f, ctx)]
    parts += _parts(message.get("text") or "", ctx)
    if not any(p["type"] == "text" and p["text"].strip() for p in parts):
        raise InputError("type a message (files alone are not a question)")
    if turns and turns[-1]["role"] == "user":
        turns[-1]["content"] += parts
    else:
        turns.append({"role": "user", "content": parts})
    return turns


def respond(ctx: AppContext, message, history, thinking, reasoning_budget, max_new_tokens, temperature,
            max_tiles, fps, max_frames, evs_rate, skip_blank=False, prune_rate=0.0, flag=None, progress=None,
            hear=True):
    """Streams the assistant's messages. A failure becomes an assistant message (`ERROR_MARK` ...), never a
    `gr.Error`: Gradio 6.31's ChatInterface leaves its textbox disabled after a raised error, until a reload.

    `progress` (a `gr.Progress`): the attachments' pages rendered, frames decoded and tiles encoded, as the
    Document and Video tabs show them. `hear`: the sound switch; a model that hears gets the videos' sound tracks
    when it is on (`ui.hearing.sound_option`)."""
    cancel = flag.start() if isinstance(flag, StopFlag) else None
    out: list = []
    try:
        options = gen_options(ctx.limits, thinking, reasoning_budget, max_new_tokens, temperature)
        tiles = check_option("tiles per image", "max_num_tiles", max_tiles, ctx.limits.max_tiles)
        proc = dict(max_num_tiles=tiles if ctx.tiled else None,  # Omni: images at their own resolution, no tiles
                    fps=check_option("fps", "fps", fps, ctx.limits.max_fps),
                    max_frames=check_option("max frames", "max_frames", max_frames, ctx.limits.max_frames),
                    video_pruning_rate=check_option("EVS rate", "video_pruning_rate", evs_rate),
                    skip_blank_tiles=bool(skip_blank) and ctx.tiled,
                    token_pruning_rate=check_option("redundant-token pruning rate", "token_pruning_rate",
                                                    prune_rate or 0.0),
                    use_audio_in_video=sound_option(ctx.engine, hear))
        messages = chat_messages(ctx, message, history)
        t0 = time.perf_counter()
        for snap in stream_chat(ctx.engine, messages, options, timeout_s=ctx.limits.request_timeout_s,
                                cancel=cancel, progress=gradio_progress(progress), **proc):
            out = []
            if options.thinking:
                thinking_done = snap.done or bool(snap.answer)
                meta = {"title": THOUGHT_TITLE, "status": "done" if thinking_done else "pending"}
                if thinking_done:
                    meta["duration"] = round(time.perf_counter() - t0, 1)
                out.append(gr.ChatMessage(role="assistant", content=snap.reasoning or "…", metadata=meta))
            answer = snap.answer
            if snap.done:
                stats = stats_markdown(snap.result, timeout_s=ctx.limits.request_timeout_s)
                if snap.result.finish_reason == "cancelled":
                    answer = f"{answer}\n\n*(stopped)*" if answer else "*(stopped)*"
                out.append(gr.ChatMessage(role="assistant", content=answer or "*(no answer)*"))
                out.append(gr.ChatMessage(role="assistant", content=stats,
                                          metadata={"title": "Stats", "status": "done"}))
            elif answer or not options.thinking:
                out.append(gr.ChatMessage(role="assistant", content=answer))
            yield out
    except Exception as exc:  # noqa: BLE001 - every failure becomes a message; the app keeps serving
        title, text = error_text(exc, where="chat")
        yield out + [gr.ChatMessage(role="assistant", content=f"{ERROR_MARK}**{title}:** {text}")]


def accept_any_file_type(textbox: gr.MultimodalTextbox, file_types: list[str]) -> gr.MultimodalTextbox:
    """`textbox` (built without `file_types`) showing `file_types` as its upload filter, which only guides the
    browser's file dialog. Gradio 6.31 checks a textbox's `file_types` again before the chat function runs and
    raises "Invalid file type", after which ChatInterface leaves its textbox disabled (see `respond`); a file of
    another type (an audio file for a model that does not hear, a text file) is refused by `respond` instead, as an
    assistant message that names it, and the decoders check every file's bytes anyway.

    The filter is set on the instance (its attributes are what the page is sent) and the instance's check is
    skipped. Gradio rebuilds a per-session copy of the textbox from its constructor arguments whenever a handler
    updates it, and ChatInterface does at every message (disabled while answering, enabled after): built without
    file types, the copies check nothing either, so the second message of a conversation is checked as the first,
    whatever filter the page shows after a model switch (ui/model_picker.py). (Instance attributes, not a
    subclass: Gradio's component metaclass writes a `.pyi` stub next to the module of every component subclass.)"""
    if textbox.constructor_args.get("file_types") is not None:
        raise ValueError("build the textbox without file_types: Gradio's per-session copies would check them")

    def preprocess(payload):
        if payload is None:
            return None
        return {"text": payload.text, "files": [f.path for f in payload.files]}

    textbox.file_types = list(file_types)
    textbox.preprocess = preprocess
    return textbox


def chat_file_types(ctx: AppContext) -> list[str]:
    """The upload filter: images and videos; PDFs for a model that reads them as tiles; audio for one that hears."""
    return (IMAGE_TYPES + VIDEO_TYPES + ([".pdf"] if ctx.tiled else []) + (AUDIO_TYPES if ctx.hears else []))


def chat_box_props(ctx: AppContext) -> dict:
    """The message box's upload filter and the placeholder that says what it takes, for the served model."""
    kinds = ["an image"] + (["a PDF"] if ctx.tiled else []) + ["a video"] + (["an audio file"] if ctx.hears else [])
    return {"file_types": chat_file_types(ctx), "placeholder": f"Ask about {', '.join(kinds[:-1])} or {kinds[-1]}…"}


def build_chat_tab(ctx: AppContext, controls: Controls, examples: list[dict] | None = None):
    lim = ctx.limits
    # the tiling and token-reduction controls apply to Nano V2 VL only: shown while it is served
    with gr.Accordion("Media settings for chat", open=False, elem_id="chat-media-settings"):
        with gr.Row():
            tiles = getattr(ctx.config, "max_num_tiles", lim.max_tiles)  # a text-only model has no tiling
            max_tiles = ctx.follow(gr.Slider(1, lim.max_tiles, value=min(tiles, lim.max_tiles), step=1,
                                             label="Tiles per image (max)", **shown_if_tiled(ctx)), shown_if_tiled)
            fps = gr.Slider(0.1, lim.max_fps, value=2.0, step=0.1, label="Video frames per second")
            max_frames = gr.Slider(1, lim.max_frames, value=min(64, lim.max_frames), step=1, label="Max frames")
            rate = gr.Slider(0.0, slider_max("video_pruning_rate", 0.05),
                             value=float(getattr(ctx.config, "video_pruning_rate", 0.0) or 0.0), step=0.05,
                             label="EVS pruning rate")
        with gr.Row():
            skip_blank = ctx.follow(gr.Checkbox(value=False, label="Skip blank tiles", elem_id="chat-skip-blank",
                                                **shown_if_tiled(ctx),
                                                info="whitespace tiles of images and pages never reach the vision "
                                                     "encoder"), shown_if_tiled)
            prune_rate = ctx.follow(gr.Slider(0.0, slider_max("token_pruning_rate", 0.05), value=0.0, step=0.05,
                                              label="Redundant-token pruning rate", **shown_if_tiled(ctx),
                                              info="fraction of image / page tokens dropped as repeated background"),
                                    shown_if_tiled)
            hear = sound_switch(ctx, "chat-hear", "a video's")
    flag = stop_state()

    def fn(message, history, thinking, reasoning_budget, max_new_tokens, temperature, max_tiles, fps, max_frames,
           rate, skip_blank_tiles, token_pruning_rate, hear, flag, progress=gr.Progress()):
        yield from respond(ctx, message, history, thinking, reasoning_budget, max_new_tokens, temperature,
                           max_tiles, fps, max_frames, rate, skip_blank_tiles, token_pruning_rate, flag, progress,
                           hear)

    box = chat_box_props(ctx)
    textbox = ctx.follow(accept_any_file_type(gr.MultimodalTextbox(
        file_count="multiple", sources=["upload"], placeholder=box["placeholder"], label="Message",
        elem_id="chat-input", stop_btn=True), box["file_types"]), chat_box_props)  # Stop shows while answering
    textbox = api_example(textbox, {"text": "What is the total?", "files": []})
    chat_examples = [[{"text": e["question"], "files": [e["path"]]}] for e in examples or []] or None
    interface = gr.ChatInterface(fn, multimodal=True, textbox=textbox,
                                 chatbot=gr.Chatbot(height=420, label="Chat", elem_id="chat-box"),
                                 # the sound switch after the older controls: API callers that predate it keep working
                                 additional_inputs=controls.inputs + [max_tiles, fps, max_frames, rate, skip_blank,
                                                                      prune_rate, hear, flag],
                                 examples=chat_examples, run_examples_on_click=False,
                                 api_name="chat", concurrency_limit=lim.concurrency,
                                 save_history=True, fill_height=False,  # kept in the browser across reloads
                                 show_progress="full")  # the attachments' progress bar, as in the other tabs
    with gr.Row():
        export = gr.Button("Export conversation (JSON and Markdown)", size="sm", elem_id="chat-export")
        exported = gr.File(label="Conversation", file_count="multiple", interactive=False, visible=False,
                           elem_id="chat-exported")

    def on_export(history):
        return gr.File(value=export_files(history, get_upload_folder()), visible=True)

    export.click(on_export, interface.chatbot, exported, queue=False, api_visibility="private")
    # Stop sets the session's flag: the engine ends at its next safe point and the answer says "(stopped)"
    textbox.stop(lambda f: f.stop() if isinstance(f, StopFlag) else None, flag, None, queue=False,
                 api_visibility="private")
    return interface
