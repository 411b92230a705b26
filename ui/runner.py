"""The one loop every tab runs: engine token stream -> growing (reasoning, answer) snapshots -> final stats.

The UI is a thin shell over `vl.Engine.chat(stream=True)` (docs/design.md §1, nanochat `engine.py`): it never
tokenizes, renders prompts or splits reasoning itself. It adds only what a server needs around the stream:
a time limit (`timeout_s`), a stop that really stops (closing the stream releases the engine at the next
token; Gradio's cancel closes our generator, see `stream_chat`), throttled yields, and the previews and
statistics that the page shows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch
from PIL import Image

from ui.chat_media import MediaCache, conversation_inputs, has_media
from ui.chat_media_omni import omni_conversation_inputs
from vl.options import RequestOptions
from vl.processing.omni_processor import OmniInputs, OmniProcessor
from vl.processing.progress import Work
from vl.runtime.batch import Tokenized
from vl.runtime.cpu.heap import trim_heap
from vl.runtime.engine import ChatResult, Engine, Stats
from vl.runtime.outcome import finish_label, finish_note

MEDIA_CACHE_MB = 1024  # processed attachments kept for follow-ups (float32 tiles: ~3 MB per 512-px tile)
YIELD_EVERY_S = 0.05  # at most ~20 page updates a second; every kind change and the end are always sent


class UIEngine(Engine):
    """`vl.Engine` that also keeps, on each call's `Stats`, what the processor produced, and processes a
    conversation's attachments once each (ui/chat_media.py: the media caps per message, a bounded cache).

    The page shows the tiles and frames the model saw and the timestamps of the EVS chart; both come from the
    `ProcessedInputs` of that very call, so nothing is decoded twice. `chat` itself is the base class's.
    """

    def __init__(self, *args, media_cache_mb: int = MEDIA_CACHE_MB, **kwargs):
        super().__init__(*args, **kwargs)
        self.media_cache = MediaCache(media_cache_mb << 20)

    def process(self, messages, options=None, *, stats=None, work=None):
        """`Engine.process` with the media of each message through `self.media_cache` (prompts without media,
        already tokenized ones and a text-only model's take the base class's path). Nemotron 3 Nano Omni's
        conversations are put together by ui/chat_media_omni.py, Nano V2 VL's by ui/chat_media.py."""
        vision = getattr(self.processor, "has_vision", False)
        if isinstance(messages, Tokenized) or not vision or not has_media(messages):
            return super().process(messages, options, stats=stats, work=work)
        options, stats = options or RequestOptions(), stats or Stats()
        proc = options.processor_kwargs()
        proc.setdefault("context_length", self.context_length)
        assemble = omni_conversation_inputs if isinstance(self.processor, OmniProcessor) else conversation_inputs
        start = time.perf_counter()
        with work or Work():
            inputs = assemble(self.processor, messages, proc, options.thinking, self.media_cache)
        stats.notes += inputs.notes
        stats.stages_s["media"] = time.perf_counter() - start  # as `Engine.process` times it
        return inputs, stats

    def prepare(self, messages, options=None, **kwargs):
        embeds, inputs, stats = super().prepare(messages, options, **kwargs)
        stats.media_items = inputs.items  # [MediaInfo] | [OmniMediaInfo]
        # Nano V2 VL's tiles (num_tiles, 3, S, S), drawn as previews; Omni's native-resolution patches are not
        stats.pixel_values = None if isinstance(inputs, OmniInputs) else inputs.pixel_values
        return embeds, inputs, stats


@dataclass(frozen=True)
class GenOptions:
    """The generation controls shared by every tab."""

    thinking: bool = False
    reasoning_budget: int | None = None  # None = no budget
    max_new_tokens: int = 256
    temperature: float = 0.0

    def engine_kwargs(self) -> dict:
        return dict(thinking=self.thinking, reasoning_budget=self.reasoning_budget,
                    max_new_tokens=self.max_new_tokens, temperature=self.temperature)


@dataclass
class Snapshot:
    reasoning: str = ""
    answer: str = ""
    done: bool = False
    result: ChatResult | None = None
    client_ttft_s: float | None = None  # first streamed text, from the start of this request's handler
    events: int = 0


def stream_chat(engine: Engine, messages, options: GenOptions, *, timeout_s: float, cancel=None, progress=None,
                **processor_kwargs):
    """Yields `Snapshot`s as text arrives; the last one has `done=True` and the `ChatResult`.

    Errors from the processor or the engine propagate (the caller turns them into messages). When the
    consumer stops iterating (Gradio cancel, client gone) `finally` closes the engine stream, which ends the
    generation at its next token and releases the engine's lock for the next request. Either way the freed
    heap pages go back to the OS (`vl.runtime.cpu.heap.trim_heap`), so RSS stays flat over many requests.
    """
    t0 = time.perf_counter()
    it = None
    try:
        stream = engine.chat(messages, stream=True, timeout_s=timeout_s, cancel=cancel, progress=progress,
                             **options.engine_kwargs(), **processor_kwargs)
        snap, last_kind, last_yield = Snapshot(), None, 0.0
        it = iter(stream)
        for event in it:
            if event.kind == "reasoning":
                snap.reasoning += event.text
            else:
                snap.answer += event.text
            snap.events += 1
            if snap.client_ttft_s is None and event.text:
                snap.client_ttft_s = time.perf_counter() - t0
            now = time.perf_counter()
            if event.kind != last_kind or now - last_yield >= YIELD_EVERY_S:
                last_kind, last_yield = event.kind, now
                yield snap
        snap.result, snap.done = stream.result, True
        yield snap
    finally:
        if it is not None:
            it.close()
        trim_heap()  # the request's buffers are free now; give their pages back (vl/runtime/cpu/heap.py says why)


def gradio_progress(progress):
    """`Engine.chat(progress=...)` for a `gr.Progress`: "rendering PDF page 3/30", "encoding tiles 12/40"."""
    if progress is None:
        return None

    def report(what: str, done: int, total: int) -> None:
        progress((done, total) if total else None, desc=what, unit="steps")

    return report


# --- what the page shows next to the answer ------------------------------------------------------------


UNREPORTED = "not reported by the server"  # a count only a local engine knows, asked of a remote one


def previews_note(stats: Stats, what: str) -> list[str]:
    """A stats note when the pictures the model saw are not there to show: a remote engine sends text only, and
    Nemotron 3 Nano Omni's native-resolution patches are not drawn."""
    if getattr(stats, "pixel_values", None) is not None:
        return []
    items = getattr(stats, "media_items", None)
    if items is None:
        return [f"the {what} the model saw are not shown: a remote server does not send them back"]
    if any(i.kind in ("image", "video") for i in items):
        return [f"the {what} the model saw are not drawn for this model: it reads images and frames at their own "
                "resolution, not as tiles"]
    return []


def _shown(value, fmt: str) -> str:
    return UNREPORTED if value is None else fmt.format(value)


STAGES = ("media", "vision", "audio", "prefill", "decode")  # `Stats.stages_s`, in the order a request runs them


def stages_text(stages_s: dict | None) -> str:
    """"media 0.21 s · vision 0.30 s · audio 0.05 s · prefill 0.04 s · decode 0.85 s": the stages this request ran,
    in their order (a stage it did not run, such as audio for a page, is left out)."""
    if not stages_s:
        return UNREPORTED  # a remote server reports no stages
    named = [k for k in STAGES if k in stages_s] + sorted(k for k in stages_s if k not in STAGES)
    return " · ".join(f"{k} {stages_s[k]:.2f} s" for k in named)


def memory_text(nbytes: int) -> str:
    """`Stats.peak_memory_bytes` in words: on CUDA the most allocated during the request, on the CPU the process's
    peak resident memory so far (the model's weights included)."""
    return f"{nbytes / (1 << 30):.2f} GiB" if nbytes >= 1 << 30 else f"{nbytes / (1 << 20):.0f} MiB"


def stats_markdown(result: ChatResult | None, *, timeout_s: float = 0, extra: list[str] | None = None) -> str:
    if result is None:
        return "*generating…*"
    s: Stats = result.stats
    if s.vision_tokens_before is None:  # a remote server that does not report them (vl/remote.py)
        reduced = UNREPORTED
    else:
        reduced = f"{s.vision_tokens_before} → {s.vision_tokens_after}" if s.vision_tokens_before else "—"
    rows = [("prompt tokens (after reduction)", _shown(s.prompt_tokens, "{}")),
            ("vision tokens before → after reduction", reduced),
            ("time to first token", f"{s.time_to_first_token_s:.2f} s"),
            ("decode speed", _shown(s.decode_tokens_per_s, "{:.1f} tokens/s")),
            ("new tokens", _shown(s.new_tokens, "{}")),
            ("total time", f"{s.total_s:.2f} s"),
            ("finished by", finish_label(result))]
    if s.audio_tokens:  # a model that hears (Nemotron 3 Nano Omni): audio files and videos' sound tracks
        rows.append(("audio tokens", f"{s.audio_tokens}"))
    rows.append(("time per stage", stages_text(s.stages_s)))
    rows.append(("peak memory", UNREPORTED if s.peak_memory_bytes is None else memory_text(s.peak_memory_bytes)))
    if s.vision_cache_hits:
        rows.append(("vision encoder cache hits", f"{s.vision_cache_hits}"))
    lines = ["| this answer | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
    notes = list(s.notes) + list(extra or [])
    if result.finish_reason == "timeout":
        notes.append(f"generation was stopped at this server's time limit of {timeout_s:g} s")
    if note := finish_note(result):
        notes.append(note)
    if notes:
        lines.append("")
        lines += [f"- {n}" for n in notes]
    return "\n".join(lines)


def tile_images(pixel_values: torch.Tensor, mean, std) -> list[Image.Image]:
    """Normalized tiles (N, 3, S, S) back to RGB pictures of what the vision tower saw."""
    x = pixel_values.detach().float().cpu()
    x = x * torch.tensor(std).view(1, 3, 1, 1) + torch.tensor(mean).view(1, 3, 1, 1)
    arr = (x.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()  # (N, S, S, 3)
    return [Image.fromarray(np.ascontiguousarray(a)) for a in arr]


@dataclass
class Preview:
    image: Image.Image
    caption: str
    item: int  # index into media_items
    timestamp_s: float | None = None
    extra: dict = field(default_factory=dict)


def previews(stats: Stats, config, limit: int, page_numbers: list[int] | None = None) -> list[Preview]:
    """One captioned picture per tile / frame that went into the prompt, in prompt order, at most `limit`.

    `page_numbers`: the 1-based PDF page of each rendered page, when a page range selected them.
    """
    items = getattr(stats, "media_items", None) or []
    pixels = getattr(stats, "pixel_values", None)
    if pixels is None or not items:
        return []
    out, start = [], 0
    for k, info in enumerate(items):
        n = info.num_tiles
        if len(out) < limit:
            pics = tile_images(pixels[start:start + min(n, limit - len(out))], config.norm_mean, config.norm_std)
            for j, pic in enumerate(pics):
                if info.kind == "video":
                    t = info.timestamps[j] if j < len(info.timestamps) else None
                    cap = f"{t:.2f} s" if t is not None else f"frame {j + 1}/{n}"
                    out.append(Preview(pic, cap, k, t))
                    continue
                if info.page is None:
                    where = f"image {k + 1} · " if len(items) > 1 else ""
                elif page_numbers and info.page < len(page_numbers):
                    where = f"p{page_numbers[info.page]} · "
                else:
                    where = f"p{info.page + 1} · "
                cols, rows = info.grid or (1, 1)
                thumb = n > cols * rows and j == n - 1
                out.append(Preview(pic, where + ("thumbnail" if thumb else f"tile {j + 1}/{cols * rows}"), k))
        start += n
    return out
