"""A conversation's attachments: counted per message, decoded once, reused by every later turn.

A chat is one request to the engine, but its files come one message at a time. The processor counts media per
request (`MediaLimits`: one PDF, four images, one video), so a second PDF sent two messages after the first was
refused ("at most 1 document(s) per request ... found 2") and the new file's own problem (encrypted, too many
pages) never came to light; and every follow-up decoded and rendered every earlier attachment again (a text
follow-up after a 14-page PDF took 6.7 s).

So the app's engine (`ui.runner.UIEngine.process`) takes a conversation apart: the caps are checked per user
message; each attachment goes through the processor on its own, once, and what it gives (tiles, spans, the
per-item facts, notes) is kept in a `MediaCache` keyed by the file's content and the options that shape it;
the prompt is then rendered for the whole conversation by the one chat format (`vl.processing.chat`), with each
placeholder expanded to its item's run as the processor expands it. The engine's vision cache already keeps the
encoder's output per tile, so a follow-up re-encodes nothing either. Nemotron 3 Nano Omni's inputs (patches,
tubelets, audio clips) are put together by the twin of this module, ui/chat_media_omni.py, over the same cache.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from vl.errors import TooManyItemsError
from vl.processing import chat
from vl.processing.processor import MediaInfo, ProcessedInputs, check_prompt_size
from vl.modeling.vlm import MediaSpan

MEDIA = ("image", "video", "pdf", "audio")
COUNTED = {"image": "image", "video": "video", "pdf": "document", "audio": "audio"}  # MediaLimits.check_count's kinds


@dataclass
class Piece:
    """What the processor made of one attachment: its items in prompt order (a PDF: one per page)."""

    pixel_values: torch.Tensor | None  # (num_tiles, 3, S, S)
    spans: list[MediaSpan]
    items: list[MediaInfo]
    notes: list[str] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return 0 if self.pixel_values is None else self.pixel_values.numel() * self.pixel_values.element_size()


class MediaCache:
    """Pieces by key, least recently used first out, at most `max_bytes` of tiles in all (a piece larger than
    that is not kept). Thread-safe: the model picker may swap engines while a request ends."""

    def __init__(self, max_bytes: int):
        self.max_bytes, self.nbytes = max_bytes, 0
        self._pieces: OrderedDict[tuple, Piece] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._pieces)

    def get(self, key: tuple) -> Piece | None:
        with self._lock:
            piece = self._pieces.get(key)
            if piece is not None:
                self._pieces.move_to_end(key)
            return piece

    def put(self, key: tuple, piece: Piece) -> None:
        if piece.nbytes > self.max_bytes:
            return
        with self._lock:
            if key in self._pieces:
                self.nbytes -= self._pieces.pop(key).nbytes
            self._pieces[key] = piece
            self.nbytes += piece.nbytes
            while self.nbytes > self.max_bytes:
                self.nbytes -= self._pieces.popitem(last=False)[1].nbytes


def content_key(source) -> str | None:
    """sha256 of the attachment's bytes (a path or bytes); None for anything else (not cached)."""
    digest = hashlib.sha256()
    if isinstance(source, (bytes, bytearray)):
        digest.update(source)
    elif isinstance(source, (str, os.PathLike)) and os.path.isfile(source):
        with open(source, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    else:
        return None
    return digest.hexdigest()


def has_media(messages) -> bool:
    return any(isinstance(p, dict) and p.get("type") in MEDIA for m in messages if isinstance(m, dict)
               and isinstance(m.get("content"), (list, tuple)) for p in m["content"])


def check_counts_per_message(messages, limits) -> None:
    """The per-request caps, applied to each user message: a conversation may hold one PDF per message."""
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, (list, tuple)):
            continue
        for kind, counted in COUNTED.items():
            found = sum(1 for p in content if isinstance(p, dict) and p.get("type") == kind)
            limit = {"image": limits.max_images, "video": limits.max_videos, "document": limits.max_documents,
                     "audio": limits.max_audios}[counted]
            if found > limit:
                raise TooManyItemsError(f"at most {limit} {counted}(s) per message are accepted, found {found} in "
                                        f"message {i + 1}; send them in separate messages")


def attachment_key(part: dict, kind: str, shaping: tuple, family: str = "") -> tuple | None:
    """An attachment's cache key: its bytes, its part's own options and the request options that shape it (the
    `family` of processor that made it); None for a source that is neither a file nor bytes (not cached)."""
    digest = content_key(part.get(kind))
    own = tuple(sorted((k, v) for k, v in part.items() if k not in ("type", kind) and isinstance(v, (str, int, float))))
    return None if digest is None else (family, kind, digest, own, shaping)


def with_stand_ins(messages, attach) -> tuple[list, dict]:
    """The conversation with each attachment of a user message replaced by stand-in parts, one per item that
    `attach(part, kind)` returns as (item kind, value): -> (messages, {stand-in source: value}). Rendering the
    stand-ins puts the items in prompt order, each found again by its stand-in source."""
    stand_ins, values = [], {}
    for message in messages:
        content = message.get("content")
        if message.get("role") != "user" or not isinstance(content, (list, tuple)):
            stand_ins.append(message)
            continue
        parts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in MEDIA:
                parts.append(part)
                continue
            for item_kind, value in attach(part, kind):
                tag = ("attachment", len(values))  # a stand-in source: finds the value again in prompt order
                values[tag] = value
                parts.append({"type": item_kind, item_kind: tag})
        stand_ins.append({**message, "content": parts})
    return stand_ins, values


def conversation_inputs(processor, messages, proc: dict, thinking, cache: MediaCache) -> ProcessedInputs:
    """`processor(messages, thinking=thinking, **proc)` for a conversation, the caps per message and each
    attachment processed at most once while it stays in `cache`."""
    check_counts_per_message(messages, processor.limits)
    shaping = tuple(sorted(proc.items()))  # every processor option can change what a file becomes

    def attach(part, kind):  # a PDF gives one item per page
        piece = _piece(processor, part, kind, proc, thinking, shaping, cache)
        return [(item.kind, (piece, j)) for j, item in enumerate(piece.items)]

    stand_ins, pieces = with_stand_ins(messages, attach)
    prompt = chat.render_prompt(stand_ins, processor.tokenizer, thinking=thinking, tokens=processor.tokens)
    check_prompt_size(prompt.text, processor.tokenizer, getattr(processor, "chars_per_token", None),
                      proc.get("context_length"))
    tpt = processor.config.tokens_per_tile
    tiles, spans, infos, runs, notes, seen = [], [], [], [], [], set()
    for media in prompt.media:
        piece, j = pieces[media.source]
        item, span = piece.items[j], piece.spans[j]
        start = sum(s.num_tiles for s in piece.spans[:j])
        tiles.append(piece.pixel_values[start:start + span.num_tiles])
        spans.append(span)
        infos.append(item)
        runs.append(chat.video_placeholder([tpt] * span.num_tiles, item.timestamps, processor.tokens)
                    if span.kind == "video" else chat.image_placeholder(span.num_tiles, tpt, processor.tokens))
        if id(piece) not in seen:
            seen.add(id(piece))
            notes += piece.notes
    text = chat.expand_placeholders(prompt.text, runs, processor.tokens)
    ids = processor.tokenizer(text, add_special_tokens=False)["input_ids"]
    return ProcessedInputs(torch.tensor([ids], dtype=torch.long), torch.cat(tiles) if tiles else None, spans,
                           infos, prompt, text, notes)


def _piece(processor, part: dict, kind: str, proc: dict, thinking, shaping: tuple, cache: MediaCache) -> Piece:
    key = attachment_key(part, kind, shaping)
    piece = cache.get(key) if key is not None else None
    if piece is None:
        inputs = processor([{"role": "user", "content": [part]}], thinking=thinking, **proc)
        piece = Piece(inputs.pixel_values, list(inputs.media), list(inputs.items), list(inputs.notes))
        if key is not None:
            cache.put(key, piece)
    return piece
