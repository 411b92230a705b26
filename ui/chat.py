"""Chat tab: multi-turn, multimodal (`gr.ChatInterface` with a multimodal textbox), same controls.

Gradio 6 conventions (peers.md §5.1-5.2): history arrives as OpenAI-style message dicts whose content is a
list of text / file parts; reasoning is shown as a `gr.ChatMessage` with a `title` in its metadata (a
collapsible "thinking" bubble, open while pending, closed when done), followed by the answer message. Past
reasoning bubbles are not sent back to the model (the prompt format keeps only past answers anyway).
"""

from __future__ import annotations

import time
from pathlib import Path

import gradio as gr

from ui.controls import AppContext, Controls, gen_options
from ui.limits import check_float, check_int, check_upload, user_error
from ui.runner import stats_markdown, stream_chat
from ui.video import VIDEO_TYPES
from vl.errors import InputError

THOUGHT_TITLE = "Reasoning"


def _kind(path: str) -> str:
    ext = Path(path).suffix.lower()
    return "pdf" if ext == ".pdf" else "video" if ext in VIDEO_TYPES else "image"


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
            return [{"type": kind, kind: path}]
        return []
    raise InputError(f"cannot read a chat message part of type {type(content).__name__}")


def chat_messages(ctx: AppContext, message, history) -> list[dict]:
    """Gradio's (message, history) -> engine messages; consecutive parts of one role are one turn."""
    turns: list[dict] = []
    for m in history or []:
        role = m.get("role")
        if role not in ("user", "assistant"):
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
            max_tiles, fps, max_frames, evs_rate):
    try:
        options = gen_options(ctx.limits, thinking, reasoning_budget, max_new_tokens, temperature)
        proc = dict(max_num_tiles=check_int("tiles per image", max_tiles, 1, ctx.limits.max_tiles),
                    fps=check_float("fps", fps, 0.1, ctx.limits.max_fps),
                    max_frames=check_int("max frames", max_frames, 1, ctx.limits.max_frames),
                    video_pruning_rate=check_float("EVS rate", evs_rate, 0.0, 0.95))
        messages = chat_messages(ctx, message, history)
        t0 = time.perf_counter()
        for snap in stream_chat(ctx.engine, messages, options, timeout_s=ctx.limits.request_timeout_s, **proc):
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
                out.append(gr.ChatMessage(role="assistant", content=answer or "*(no answer)*"))
                out.append(gr.ChatMessage(role="assistant", content=stats,
                                          metadata={"title": "Stats", "status": "done"}))
            elif answer or not options.thinking:
                out.append(gr.ChatMessage(role="assistant", content=answer))
            yield out
    except Exception as exc:  # noqa: BLE001 - every failure becomes a message; the app keeps serving
        raise user_error(exc) from None


def build_chat_tab(ctx: AppContext, controls: Controls):
    lim = ctx.limits
    with gr.Accordion("Media settings for chat", open=False):
        with gr.Row():
            tiles = getattr(ctx.config, "max_num_tiles", lim.max_tiles)  # a text-only model has no tiling
            max_tiles = gr.Slider(1, lim.max_tiles, value=min(tiles, lim.max_tiles), step=1,
                                  label="Tiles per image (max)")
            fps = gr.Slider(0.1, lim.max_fps, value=2.0, step=0.1, label="Video frames per second")
            max_frames = gr.Slider(1, lim.max_frames, value=min(64, lim.max_frames), step=1, label="Max frames")
            rate = gr.Slider(0.0, 0.95, value=float(getattr(ctx.config, "video_pruning_rate", 0.0) or 0.0), step=0.05,
                             label="EVS pruning rate")

    def fn(message, history, thinking, reasoning_budget, max_new_tokens, temperature, max_tiles, fps, max_frames,
           rate):
        yield from respond(ctx, message, history, thinking, reasoning_budget, max_new_tokens, temperature,
                           max_tiles, fps, max_frames, rate)

    textbox = gr.MultimodalTextbox(file_count="multiple", file_types=["image", "video", ".pdf"],
                                   sources=["upload"], placeholder="Ask about an image, a PDF or a video…")
    return gr.ChatInterface(fn, multimodal=True, textbox=textbox,
                            chatbot=gr.Chatbot(height=420, label="Chat"),
                            additional_inputs=controls.inputs + [max_tiles, fps, max_frames, rate],
                            api_name="chat", concurrency_limit=lim.concurrency,
                            save_history=False, fill_height=False)
