"""A Nemotron 3 Nano Omni conversation's attachments: counted per message, decoded once, reused by every later turn.

The twin of ui/chat_media.py for the Omni processor (vl/processing/omni_processor.py), whose inputs are
native-resolution image patches, video tubelets and audio clips instead of tiles. The per-request caps (four audio
clips, one video, ...) apply to each user message. Each attachment goes through the processor on its own, once,
and what it gives is kept in the same `MediaCache`, keyed by the file's content and the options that shape it (a
video heard or not is two entries). Its placeholder run is read off that call's own prompt (expanded text minus
rendered text), so the run is the processor's, never rebuilt here. The conversation is then rendered by the one
chat format (`vl.processing.chat`) and its inputs put together by the processor's own assembly (`assemble`: the
placeholder counts checked, the patches and tubelets joined, the clips' mel features computed together).

The engine's encoder cache keeps each image's and video's encoding and the request's clips' (all clips together,
vl/runtime/omni_inputs.py), so a follow-up question about the same audio runs no encoder (`Stats.vision_cache_hits`).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from ui.chat_media import MediaCache, attachment_key, check_counts_per_message, with_stand_ins
from vl.processing import chat
from vl.processing.omni_processor import OmniInputs
from vl.processing.processor import check_prompt_size


@dataclass
class OmniPiece:
    """What the processor made of one attachment (asked about alone) and the placeholder run it fills."""

    inputs: OmniInputs
    run: str

    @property
    def nbytes(self) -> int:
        x = self.inputs
        tensors = [t for t in (x.pixel_values, x.pixel_values_videos, x.input_features) if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors) + sum(a.nbytes for a in x.audio)


def _run(processor, kind: str, inputs: OmniInputs) -> str:
    """The expanded run of the one placeholder in the prompt of a single-attachment call."""
    tokens = processor.tokens
    placeholder = {"image": tokens.img_context, "video": tokens.video_context, "audio": tokens.audio_context}[kind]
    rendered, expanded = inputs.prompt.text, inputs.text
    at = rendered.index(placeholder)
    head, tail = rendered[:at], rendered[at + len(placeholder):]
    if not (expanded.startswith(head) and expanded.endswith(tail)):
        raise RuntimeError("the Omni processor changed more of its prompt than the placeholder; ui/chat_media_omni.py "
                           "needs its run another way")
    return expanded[len(head):len(expanded) - len(tail)]


def omni_piece(processor, part: dict, kind: str, proc: dict, thinking, cache: MediaCache) -> OmniPiece:
    key = attachment_key(part, kind, tuple(sorted(proc.items())), "omni")
    piece = cache.get(key) if key is not None else None
    if piece is None:
        inputs = processor([{"role": "user", "content": [part]}], thinking=thinking, **proc)
        piece = OmniPiece(inputs, _run(processor, kind, inputs))
        if key is not None:
            cache.put(key, piece)
    return piece


def omni_conversation_inputs(processor, messages, proc: dict, thinking, cache: MediaCache) -> OmniInputs:
    """`processor(messages, thinking=thinking, **proc)` for a conversation, the caps per message and each
    attachment processed at most once while it stays in `cache`."""
    check_counts_per_message(messages, processor.limits)
    # a PDF is refused here by the processor, with its message; every other attachment is one placeholder
    stand_ins, pieces = with_stand_ins(messages, lambda part, kind: [
        (kind, omni_piece(processor, part, kind, proc, thinking, cache))])
    prompt = chat.render_prompt(stand_ins, processor.tokenizer, thinking=thinking, tokens=processor.tokens)
    check_prompt_size(prompt.text, processor.tokenizer, processor.chars_per_token, proc.get("context_length"))
    runs, infos, images, videos, clips, notes, seen = [], [], [], [], [], [], set()
    for media in prompt.media:
        piece = pieces[media.source]
        x = piece.inputs
        runs.append(piece.run)
        infos += x.items
        if x.pixel_values is not None:  # one image: its patches and (rows, cols)
            images.append(SimpleNamespace(pixel_values=x.pixel_values, grid=tuple(x.image_grid_hw[0].tolist())))
        if x.pixel_values_videos is not None:  # one video: its tubelets
            videos.append(SimpleNamespace(tubelets=x.pixel_values_videos[0], num_frames=x.video_num_frames[0]))
        clips += x.audio  # an audio file's clip, or the video's sound track after its frames
        if id(piece) not in seen:
            seen.add(id(piece))
            notes += x.notes
    return processor.assemble(prompt, runs, infos, images, videos, clips, notes)
