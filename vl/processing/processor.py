"""Messages -> model inputs: the one path from a user's files and words to `input_ids` and tiles.

Order of work follows the reference processor (HF remote `processing.py`, vLLM `nano_nemotron_vl.py`):
render the chat (vl/processing/chat.py, the only home of the prompt format) with one placeholder per
media item; load and tile each item behind the media limits; expand each placeholder to its
`<img><image>…</img>` run (videos: timestamped frame headers); tokenize without BOS. Placeholder runs
of videos are full-length: token reduction drops positions inside the model after the encoder.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from token_reduction import BlankTileSkipper, TokenLayout
from vl.config import VLConfig
from vl.options import spec
from vl.errors import (ConfigError, ContextLengthError, CorruptMediaError, InputError, RemoteMediaError, item_names,
                       naming)
from vl.modeling.vlm import MediaSpan
from vl.processing import chat
from vl.processing.documents import (
    DEFAULT_SCALE,
    PdfPage,
    check_total_pixels,
    open_pdf_pages,
    plan_document_budget,
    render_pdf_tiles,
)
from vl.processing.images import ImageTiles, normalize, preprocess_image
from vl.processing.limits import DEFAULT_LIMITS, MediaLimits
from vl.processing.progress import Work
from vl.processing.video import load_video


@dataclass
class MediaInfo:
    """Per-item metadata that the model, token reduction, stats and the UI need."""

    kind: str  # "image" | "video"
    num_tiles: int
    grid: tuple[int, int] | None = None  # (cols, rows) for images
    image_size: tuple[int, int] | None = None
    frame_indices: list[int] = field(default_factory=list)
    timestamps: list[float] = field(default_factory=list)
    fps: float | None = None
    document: Any = None  # for PDF pages: the document's name
    page: int | None = None
    thumbnails: list = field(default_factory=list)  # small PIL previews for the UI
    tiles_skipped: list[int] = field(default_factory=list)  # blank tiles dropped before the encoder (their index)


@dataclass
class ProcessedInputs:
    input_ids: torch.Tensor  # (1, t)
    pixel_values: torch.Tensor | None  # (num_tiles, 3, S, S) in placeholder order
    media: list[MediaSpan]
    items: list[MediaInfo]
    prompt: chat.RenderedPrompt
    text: str  # the expanded prompt
    notes: list[str] = field(default_factory=list)  # what was reduced or clamped, for stats and the UI

    @property
    def num_vision_tokens(self) -> int:
        return sum(m.num_tiles for m in self.media)  # multiplied by tokens_per_tile by callers

    @property
    def opened_think(self) -> bool:
        return self.prompt.prompt_opened_think


def _is_url(s: str) -> bool:
    return "://" in s[:16] or s.startswith(("www.", "//"))


def checked_source(source, allowed_roots):
    """A media source as given, once checked: local paths only, and only under `allowed_roots` when set; URLs are
    never fetched. Every processor (Nano V2 VL's, Omni's) checks its sources here."""
    if isinstance(source, (str, os.PathLike)):
        s = os.fspath(source)
        if _is_url(s):
            raise RemoteMediaError(f"{s[:80]!r} looks like a URL; remote media is never fetched. Download it "
                                   f"yourself and pass the bytes or a local path")
        if allowed_roots is not None:
            p = Path(s).resolve()
            if not any(p.is_relative_to(r) for r in allowed_roots):
                raise RemoteMediaError(f"{s!r} is outside the allowed media folders")
    return source


def special_token_id(tokenizer, text: str, configured: int | None) -> int:
    """The id of a media token that must be one token of `tokenizer`, agreeing with the config's id when it has one."""
    found = tokenizer.convert_tokens_to_ids(text)
    if found is None or found == tokenizer.unk_token_id:
        raise ConfigError(f"the tokenizer has no single token for {text!r}")
    if configured is not None and configured != found:
        raise ConfigError(f"config says {text!r} is id {configured} but the tokenizer says {found}")
    return found


_COUNTED = {"image": "image", "video": "video", "pdf": "document", "audio": "audio"}


def count_media_parts(messages) -> dict[str, int]:
    """Media parts by kind, counted on the raw messages so that the per-request caps apply before any PDF is
    rendered (rendering happens while the prompt is built). Malformed messages count what they can; the
    prompt builder reports what is wrong with them."""
    counts = dict.fromkeys(_COUNTED.values(), 0)
    for message in messages if isinstance(messages, (list, tuple)) else ():
        content = message.get("content") if isinstance(message, Mapping) else None
        for item in content if isinstance(content, (list, tuple)) else ():
            kind = _COUNTED.get(item.get("type")) if isinstance(item, Mapping) else None
            if kind:
                counts[kind] += 1
    return counts


# pre-tokenizers that drop characters (whitespace, delimiters): text they drop costs no token at all
_DROPPING = {"Whitespace", "WhitespaceSplit", "BertPreTokenizer", "CharDelimiterSplit"}


def max_chars_per_token(tokenizer) -> int | None:
    """The most characters of input text one token can stand for, read from the tokenizer's vocabulary (its
    longest token or added token, in the characters of the vocabulary, which are bytes for byte-level BPE and
    characters for SentencePiece-style pieces: each covers at least one character of input), or None when no such
    bound holds: a slow tokenizer, a model that fuses unknown characters into one token (Unigram, BPE with
    `fuse_unk`), or a pre-tokenizer that drops characters."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    spec = json.loads(backend.to_str())
    model = spec.get("model") or {}
    if model.get("type") not in ("BPE", "WordPiece") or (model.get("fuse_unk") and model.get("unk_token")):
        return None
    stack = [spec.get("pre_tokenizer")]
    while stack:
        pre = stack.pop()
        if not pre:
            continue
        if pre.get("type") in _DROPPING or (pre.get("type") == "Split" and pre.get("behavior") == "Removed"):
            return None
        stack += pre.get("pretokenizers") or []
    longest = max((len(t) for t in model.get("vocab") or ()), default=1)
    longest = max([longest] + [len(t.get("content", "")) for t in spec.get("added_tokens") or ()])
    if model.get("type") == "WordPiece":  # a word it cannot split is one unknown token
        longest = max(longest, int(model.get("max_input_chars_per_word") or 100))
    return longest


def check_prompt_size(text: str, tokenizer, chars_per_token: int | None, context_length: int | None) -> None:
    """Refuse, before tokenizing, a prompt whose characters cannot fit the context: at most `chars_per_token`
    characters per token means at least len / chars_per_token tokens. So the tokenizer never sees more than
    `context_length * chars_per_token` characters (a 60 MB prompt was tokenized in full before the check)."""
    if not context_length or not chars_per_token:
        return
    normalizer = getattr(getattr(tokenizer, "backend_tokenizer", None), "normalizer", None)
    n = len(text) if normalizer is None or len(text) <= context_length * chars_per_token else len(
        normalizer.normalize_str(text))  # a normalizer may shorten the text: count what the tokenizer gets
    if n > context_length * chars_per_token:
        least = -(-n // chars_per_token)
        raise ContextLengthError(f"the prompt has {n} characters, at least {least} tokens (a token of this model "
                                 f"covers at most {chars_per_token} characters), but the model's context is "
                                 f"{context_length} tokens; shorten it")


class Processor:
    has_vision = True

    def __init__(self, tokenizer, config: VLConfig, *, limits: MediaLimits = DEFAULT_LIMITS,
                 allowed_roots=None, isolate: bool = False, video_backend: str = "decord",
                 timestamp_convention: str = "exact"):
        self.tokenizer, self.config, self.limits = tokenizer, config, limits
        self.allowed_roots = None if allowed_roots is None else [Path(r).resolve() for r in allowed_roots]
        self.isolate, self.video_backend, self.timestamp_convention = isolate, video_backend, timestamp_convention
        t = config.tokens
        self.tokens = chat.MediaTokens(t.img_start, t.img_end, t.img_context, t.video_context)
        self.image_token_id = self._token_id(t.img_context, t.img_context_id)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.chars_per_token = max_chars_per_token(tokenizer)

    def _token_id(self, text: str, configured: int | None) -> int:
        return special_token_id(self.tokenizer, text, configured)

    # --- sources -----------------------------------------------------------------------------------
    def _check_source(self, source):
        return checked_source(source, self.allowed_roots)

    def _pdf_pages(self, scale: float, page_range: str | None, max_pages: int | None = None):
        """PDF -> page items, checked against every cap but not rendered yet: pages are rendered and tiled one at a
        time once the token budget has fixed each page's tile cap (`_page_tiles`). `max_pages` (a request option,
        vl/options.py) lowers the processor's page cap for this request only, never raises it."""
        limits = self.limits
        if max_pages is not None and max_pages < limits.max_pdf_pages:
            limits = replace(limits, max_pdf_pages=max_pages)

        def load(source):
            doc = open_pdf_pages(self._check_source(source), pages=page_range, scale=scale, limits=limits,
                                 isolate=self.isolate)
            return [PdfPage(doc, k) for k in range(len(doc.page_numbers))]
        return load

    def _page_tiles(self, page: PdfPage, caps: dict, rendered: dict) -> ImageTiles:
        """Tiles of one PDF page; the first page asked of a document renders and tiles all of its pages."""
        key = id(page.document)
        if key not in rendered:
            cfg = self.config
            rendered[key] = render_pdf_tiles(page.document, caps[key], tile_size=cfg.force_image_size,
                                             use_thumbnail=cfg.use_thumbnail, limits=self.limits, isolate=self.isolate)
        tiles, grid, size = rendered[key][page.position]
        return ImageTiles(normalize(tiles, self.config.norm_mean, self.config.norm_std), grid,
                          tiles.shape[0] > grid[0] * grid[1], tuple(size))

    # --- the call ----------------------------------------------------------------------------------
    def __call__(self, messages, *, thinking: bool | None = None, add_generation_prompt: bool = True,
                 max_num_tiles: int | None = None, fps: float = 2.0, max_frames: int = 128,
                 pages: str | None = None, pdf_scale: float = DEFAULT_SCALE, context_length: int | None = None,
                 reserved_tokens: int = 1024, skip_blank_tiles: bool = False,
                 max_pages: int | None = None, use_audio_in_video: bool | None = None,
                 template_kwargs: Mapping | None = None) -> ProcessedInputs:
        cfg = self.config
        # the option's one range (vl/options.py); the checkpoint's own default is taken as it is
        max_num_tiles = cfg.max_num_tiles if max_num_tiles is None else spec("max_num_tiles").check(max_num_tiles)
        for kind, count in count_media_parts(messages).items():  # before anything is decoded (matrix I10)
            self.limits.check_count(kind, count)
        prompt = chat.render_prompt(messages, self.tokenizer, thinking=thinking,
                                    add_generation_prompt=add_generation_prompt,
                                    pdf_pages=self._pdf_pages(pdf_scale, pages, max_pages), tokens=self.tokens,
                                    template_kwargs=template_kwargs)
        check_prompt_size(prompt.text, self.tokenizer, self.chars_per_token, context_length)  # before any decoding
        images = [m for m in prompt.media if m.kind == "image"]
        videos = [m for m in prompt.media if m.kind == "video"]
        documents = {id(m.document) for m in images if m.document is not None}
        self.limits.check_count("video", len(videos))
        self.limits.check_count("document", len(documents))
        self.limits.check_count("image", len([m for m in images if m.document is None]))
        notes = list(prompt.notes)
        if use_audio_in_video and videos:
            notes.append("this model does not hear (no audio encoder): the video's sound was not used")
        caps = [max_num_tiles] * len(prompt.media)
        pages_idx = [i for i, m in enumerate(prompt.media) if m.document is not None]
        if pages_idx and context_length:
            sizes = [prompt.media[i].source.size for i in pages_idx]
            plan = plan_document_budget(sizes, context_length, reserved_tokens, cfg.tokens_per_tile, max_num_tiles,
                                        tile_size=cfg.force_image_size, use_thumbnail=cfg.use_thumbnail)
            for i, cap in zip(pages_idx, plan.max_tiles_per_page):
                caps[i] = cap
            if plan.reduced:
                notes.append(plan.reason)
        pages = [(m.source, cap) for m, cap in zip(prompt.media, caps) if isinstance(m.source, PdfPage)]
        check_total_pixels(sum(p.size[0] * p.size[1] for p, _ in pages), len(pages), pdf_scale, self.limits)
        page_caps: dict[int, list[int]] = {}  # id(PdfPages) -> tile cap of each of its pages
        for page, cap in pages:
            page_caps.setdefault(id(page.document), [max_num_tiles] * len(page.document.page_numbers))
            page_caps[id(page.document)][page.position] = cap
        rendered: dict = {}
        tiles, spans, infos, runs = [], [], [], []
        work = Work.current()
        names = item_names([item.kind if item.document is None else "page" for item in prompt.media])
        for k, (item, cap) in enumerate(zip(prompt.media, caps)):
            opts = item.options  # the part's own options, checked by their ranges (vl/processing/chat.py PART_OPTIONS)
            if item.kind == "image":
                work.report("tiling page" if item.document is not None else "tiling image", k, len(prompt.media))
                if isinstance(item.source, PdfPage):
                    img = self._page_tiles(item.source, page_caps, rendered)
                else:
                    with naming(names[k]):
                        img = preprocess_image(self._check_source(item.source), norm_mean=cfg.norm_mean,
                                               norm_std=cfg.norm_std, tile_size=cfg.force_image_size,
                                               max_num_tiles=opts.get("max_num_tiles", cap),
                                               use_thumbnail=cfg.use_thumbnail, limits=self.limits,
                                               isolate=self.isolate)
                pixels, skipped = img.pixel_values, []
                if skip_blank_tiles and img.num_tiles > 1:
                    pixels, note, skipped = self._skip_blank(pixels, img.has_thumbnail)
                    notes += [note] if note else []
                n = int(pixels.shape[0])
                tiles.append(pixels)
                spans.append(MediaSpan("image", n))
                infos.append(MediaInfo("image", n, img.grid, img.image_size,
                                       document=None if item.document is None else str(item.document)[:200],
                                       page=item.page, tiles_skipped=skipped))
                runs.append(chat.image_placeholder(n, cfg.tokens_per_tile, self.tokens))
            else:
                work.report(f"decoding the video (up to {opts.get('max_frames', max_frames)} frames)", 0, 0)
                with naming(names[k]):
                    vid = self._load_video(self._check_source(item.source), opts.get("fps", fps),
                                           opts.get("max_frames", max_frames), notes)
                n = vid.pixel_values.shape[0]  # "video frames decoded" i/n was reported frame by frame (video.py)
                tiles.append(vid.pixel_values)
                spans.append(MediaSpan("video", n))
                infos.append(MediaInfo("video", n, frame_indices=list(vid.frame_indices),
                                       timestamps=list(vid.timestamps_s), fps=vid.fps))
                if vid.partial:
                    notes.append("some video frames could not be decoded and were skipped")
                if vid.backend_note:
                    notes.append(f"video decoded with PyAV instead of {self.video_backend}: {vid.backend_note}")
                runs.append(chat.video_placeholder([cfg.tokens_per_tile] * n, vid.timestamps_s, self.tokens))
        if prompt.media:
            work.report("media ready", len(prompt.media), len(prompt.media))
        text = chat.expand_placeholders(prompt.text, runs, self.tokens)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        input_ids = torch.tensor([ids], dtype=torch.long)
        pixel_values = torch.cat(tiles) if tiles else None
        expected = sum(s.num_tiles for s in spans) * cfg.tokens_per_tile
        found = int((input_ids == self.image_token_id).sum())
        if found != expected:
            raise InputError(f"the prompt text itself contains {found - expected} extra {cfg.tokens.img_context!r} "
                             f"tokens; remove them from the messages")
        return ProcessedInputs(input_ids, pixel_values, spans, infos, prompt, text, notes)

    def _load_video(self, source, fps: float, max_frames: int, notes: list):
        """decord first; a file decord cannot decode (it mishandles some valid streams, e.g. odd widths) is
        retried once with PyAV, which is stricter and better tested against broken input."""
        kwargs = dict(norm_mean=self.config.norm_mean, norm_std=self.config.norm_std,
                      tile_size=self.config.force_image_size, target_fps=fps, max_frames=max_frames,
                      timestamp_convention=self.timestamp_convention, limits=self.limits, isolate=self.isolate)
        try:
            return load_video(source, backend=self.video_backend, **kwargs)
        except CorruptMediaError:
            if self.video_backend != "decord":
                raise
            notes.append("decord could not decode the video; decoded with PyAV instead")
            return load_video(source, backend="pyav", **kwargs)

    def _skip_blank(self, pixels, has_thumbnail: bool):
        """Drop whitespace tiles before the encoder (the thumbnail stays); returns (tiles, note or None,
        indices of the dropped tiles)."""
        side = int(round(self.config.tokens_per_tile ** 0.5))
        layout = TokenLayout.page(int(pixels.shape[0]), side, side, has_thumbnail=has_thumbnail)
        red = BlankTileSkipper(pixel_std=tuple(self.config.norm_std))(pixels, layout)
        removed = red.info["tiles_removed"]
        note = (f"skipped {len(removed)} blank tile(s) of {layout.groups} "
                f"({len(removed) * self.config.tokens_per_tile} tokens)") if removed else None
        return red.tokens, note, list(removed)

    # --- helpers -----------------------------------------------------------------------------------
    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def stop_token_ids(self) -> set[int]:
        return tokenizer_stop_ids(self.tokenizer)


def tokenizer_stop_ids(tokenizer) -> set[int]:
    """End of turn plus the tokenizer's EOS (generation_config.json is read by the engine)."""
    out = set()
    for tok in (chat.END_OF_TURN, tokenizer.eos_token):
        if tok:
            i = tokenizer.convert_tokens_to_ids(tok)
            if i is not None and i != tokenizer.unk_token_id:
                out.add(int(i))
    return out
