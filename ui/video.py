"""Video QA tab: one clip, fps / max frames / EVS rate, a streamed answer, and what EVS kept per frame.

Frames are sampled by the processor (reference sampling: `fps`, capped at `max frames`, uniform); EVS
(token_reduction/evs.py) then drops the tokens that repeat the previous frame. The chart draws, per sampled
frame at its timestamp, the tokens kept and the tokens removed, from `Stats.reductions[...]["counts"]` of
this very request; at rate 0 every frame keeps all its tokens. Nemotron 3 Nano Omni packs frames into tubelets
(`video_temporal_patch_size` frames each, one EVS group per tubelet), so its bars are tubelets at their first
frame's timestamp. A model that hears also gets the clip's sound track after its frames (request option
`use_audio_in_video`), unless the "Hear the sound track" switch is off; the switch is shown only while the served
model hears (ui/hearing.py).
"""

from __future__ import annotations

import gradio as gr
from matplotlib.figure import Figure

from ui.controls import MODEL, AppContext, Controls, api_example, file_example, gen_options
from ui.documents import check_question
from ui.hearing import sound_option, sound_switch
from ui.limits import check_option, check_upload, slider_max
from ui.runner import gradio_progress, previews, previews_note, stats_markdown, stream_chat
from ui.stop import STOPPED_TEXT, StopFlag, failed, run_with_stop, stop_state, wire_stop
from vl.errors import InputError

VIDEO_TYPES = [".mp4", ".mov", ".mkv", ".webm", ".avi", ".m4v"]


def kept_per_frame(stats, config) -> tuple[list[float], list[int], int, dict]:
    """(timestamps_s, kept tokens per frame, tokens per frame before EVS, EVS info) of the request's video.

    A "frame" is what EVS compares: a sampled frame for Nano V2 VL (`config.tokens_per_tile` tokens each); a
    tubelet for Nemotron 3 Nano Omni, stamped with its first frame's time, its tokens the video's share."""
    items = [m for m in getattr(stats, "media_items", None) or [] if m.kind == "video"]
    if not items:
        return [], [], 0, {}
    video = items[0]
    stamps = list(video.timestamps)
    if hasattr(video, "num_tiles"):  # Nano V2 VL: one tile per frame
        groups, per = video.num_tiles, config.tokens_per_tile
    else:  # Omni: tubelets of `video_temporal_patch_size` frames
        t = config.video_temporal_patch_size
        groups = -(-video.num_frames // t)
        stamps, per = stamps[::t], video.num_tokens // max(groups, 1)
    evs = [r for r in stats.reductions if r.get("method") == "evs"]
    if evs:
        return stamps, list(evs[0]["counts"]), per, evs[0]
    return stamps, [per] * groups, per, {}


def evs_chart(timestamps: list[float], kept: list[int], tokens_per_frame: int, info: dict,
              unit: str = "frames") -> Figure:
    """Stacked bars per sampled frame (`unit` "tubelets" for Omni): kept tokens, and the ones EVS removed; x = frame
    timestamp."""
    fig = Figure(figsize=(7.0, 2.6), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    n = len(kept)
    xs = list(range(n))
    removed = [tokens_per_frame - k for k in kept]
    ax.bar(xs, kept, color="#76b900", label="kept")
    ax.bar(xs, removed, bottom=kept, color="#d0d0d0", label="removed by EVS")
    step = max(1, n // 12)
    ax.set_xticks(xs[::step], [f"{t:.1f}" for t in timestamps[::step]])
    ax.set_xlabel("frame timestamp (s)")
    ax.set_ylabel("tokens")
    ax.set_ylim(0, tokens_per_frame * 1.4)  # room for the legend above full bars
    total = sum(kept)
    q = info.get("q", 0.0)
    ax.set_title(f"{n} {unit}: {total} of {n * tokens_per_frame} vision tokens kept (EVS rate {q:g})", fontsize=10)
    ax.legend(loc="upper center", ncols=2, fontsize=8, frameon=False)
    return fig


def answer_video(ctx: AppContext, video, question, fps, max_frames, evs_rate, thinking, reasoning_budget,
                 max_new_tokens, temperature, flag=None, progress=None, hear=True):
    cancel = flag.event if isinstance(flag, StopFlag) else None  # cleared at the click (ui/stop.py)
    try:
        options = gen_options(ctx.limits, thinking, reasoning_budget, max_new_tokens, temperature)
        if not video:
            raise InputError("upload a video first")
        path = check_upload(video, ctx.media_roots, ctx.limits.max_upload_mb << 20)
        question = check_question(question)
        proc = dict(fps=check_option("fps", "fps", fps, ctx.limits.max_fps),
                    max_frames=check_option("max frames", "max_frames", max_frames, ctx.limits.max_frames),
                    video_pruning_rate=check_option("EVS rate", "video_pruning_rate", evs_rate),
                    use_audio_in_video=sound_option(ctx.engine, hear))
        messages = [{"role": "user", "content": [{"type": "video", "video": path},
                                                 {"type": "text", "text": question}]}]
        yield "", "", None, [], "*sampling frames…*"
        for snap in stream_chat(ctx.engine, messages, options, timeout_s=ctx.limits.request_timeout_s,
                                cancel=cancel, progress=gradio_progress(progress), **proc):
            if not snap.done:
                yield snap.reasoning, snap.answer, gr.skip(), gr.skip(), "*generating…*"
                continue
            if snap.result.finish_reason == "cancelled" and not snap.result.token_ids:
                yield snap.reasoning, snap.answer, None, [], STOPPED_TEXT
                return
            stats = snap.result.stats
            ts, kept, tpf, info = kept_per_frame(stats, ctx.config)
            chart = evs_chart(ts, kept, tpf, info, "frames" if ctx.tiled else "tubelets") if kept else None
            frames = [(p.image, f"{p.caption} · {kept[i]}/{tpf}" if i < len(kept) else p.caption)
                      for i, p in enumerate(previews(stats, ctx.config, ctx.limits.max_gallery))]
            text = stats_markdown(snap.result, timeout_s=ctx.limits.request_timeout_s,
                                  extra=previews_note(stats, "frames"))
            yield snap.reasoning, snap.answer, chart, frames, text
    except Exception as exc:  # noqa: BLE001 - every failure becomes a message; the app keeps serving
        raise failed(flag, exc, where="video") from None


def build_video_tab(ctx: AppContext, controls: Controls, examples: list[dict]):
    lim = ctx.limits
    default_rate = float(ctx.config.video_pruning_rate or 0.0)
    with gr.Row():
        with gr.Column(scale=1):
            video = api_example(gr.Video(sources=["upload"], format=None, include_audio=True, label="Video",
                                         height=260, elem_id="video-file"), file_example("clip.mp4"))
            question = api_example(gr.Textbox(label="Question", placeholder="Which way does the square move?",
                                              lines=2, elem_id="video-question"), "Which way does the square move?")
            with gr.Row():
                fps = gr.Slider(0.1, lim.max_fps, value=2.0, step=0.1, label="Frames per second sampled")
                max_frames = gr.Slider(1, lim.max_frames, value=min(128, lim.max_frames), step=1,
                                       label="Max frames")
                rate = gr.Slider(0.0, slider_max("video_pruning_rate", 0.05), value=default_rate, step=0.05,
                                 label="EVS pruning rate",
                                 info="fraction of video tokens removed (0 = off)")
            hear = sound_switch(ctx, "video-hear")
            with gr.Row():
                ask = gr.Button("Ask", variant="primary", elem_id="video-ask")
                stop = gr.Button("Stop", variant="stop", elem_id="video-stop", interactive=False)
            if examples:
                gr.Examples([[e["path"], e["question"]] for e in examples], inputs=[video, question],
                            label="Bundled examples (click one, then Ask)")
        with gr.Column(scale=1):
            with gr.Accordion("Reasoning", open=False) as reasoning_box:
                reasoning = gr.Textbox(label="Reasoning (streams when /think is on)", lines=6, max_lines=20,
                                       interactive=False, autoscroll=True)
            answer = gr.Textbox(label="Answer", lines=4, max_lines=20, interactive=False, elem_id="video-answer")
            chart = gr.Plot(label="Vision tokens kept per frame", show_label=False)
            stats = gr.Markdown(label="Stats", elem_id="video-stats")
            frames = gr.Gallery(label="Frames the model saw (timestamp · tokens kept; click one to seek the video)",
                                columns=6, height=200, elem_id="video-frames", object_fit="contain", format="png")
            seek_to = gr.Number(visible=False)

    flag = stop_state()

    def handler(video, question, fps, max_frames, rate, thinking, reasoning_budget, max_new_tokens, temperature,
                hear, flag, progress=gr.Progress()):
        yield from answer_video(ctx, video, question, fps, max_frames, rate, thinking, reasoning_budget,
                                max_new_tokens, temperature, flag, progress, hear)

    # the switch comes after the shared controls, so API callers that predate it keep working
    inputs = [video, question, fps, max_frames, rate] + controls.inputs + [hear, flag]
    outputs = [reasoning, answer, chart, frames, stats]
    run = dict(scroll_to="video-answer", status=stats, concurrency_id=MODEL, concurrency_limit=lim.concurrency)
    event = run_with_stop(ask.click, stop, flag, handler, inputs, outputs, api_name="video", **run)
    run_with_stop(question.submit, stop, flag, handler, inputs, outputs, api_visibility="private", **run)
    wire_stop(stop, flag, stats)
    # a click on a frame seeks the video to that frame's timestamp (its caption: "12.50 s · 180/256")
    frames.select(frame_time, None, seek_to, queue=False, api_visibility="private").then(
        None, seek_to, None, js=SEEK_JS, api_visibility="private")
    # the reasoning section opens when /think is switched on, so the thinking is seen as it streams
    controls.thinking.change(lambda on: gr.Accordion(open=bool(on)), controls.thinking, reasoning_box, queue=False,
                             api_visibility="private")
    return event


SEEK_JS = """(t) => { const v = document.querySelector('#video-file video');
    if (v && t !== null && t !== undefined) { v.currentTime = t; v.scrollIntoView({block: 'nearest'}); } }"""


def frame_time(evt: gr.SelectData):
    """The clicked frame's timestamp in seconds, from its caption; nothing when the caption has none."""
    value = evt.value if isinstance(evt.value, dict) else {}
    head = str(value.get("caption") or "").split(" · ", 1)[0]
    if not head.endswith(" s"):
        return gr.skip()
    try:
        return float(head[:-2])
    except ValueError:
        return gr.skip()
