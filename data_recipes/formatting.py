"""Synthetic sample -> one training example: `input_ids`, `labels` (loss on assistant tokens only), tiles.

The prompt half is what inference sees, built by the same code: documents go through the `Processor`
itself, in the form eval hands them over (one page: the image; several pages: a PDF written with
`data_recipes.synthetic.write_pdf` and rendered back by the processor, so pages are resampled exactly as
at inference), and videos through the same functions the processor calls (`sample_frame_indices`, the frame resize, `normalize`, `frame_timestamps`,
`chat.video_placeholder`, `chat.expand_placeholders`), fed from the generator's frames instead of a
decoded MP4 so that training needs no codec round trip (tests/data_recipes/test_formatting.py checks the
two agree on an exported file). The answer half is the final assistant turn as `chat.render_messages`
writes it: the prompt text is its prefix, and the rest up to and including the end-of-turn token is the
target. Nothing here knows the prompt format; vl/processing/chat.py is its only home (docs/design.md §1).

Targets (the generator's `reasoning` is the /think trace):
    thinking:  "<think>\\n" (prompt) + "{reasoning}\\n</think>\\n{answer}\\n<SPECIAL_12>"
    no think:  "<think></think>" (prompt) + "{answer}\\n<SPECIAL_12>"
Loss is on the target tokens only (`IGNORE` elsewhere), including the end-of-turn token so the model learns
to stop; the newline the template writes after it is not part of the example (nothing ever predicts it).
"""

from __future__ import annotations

import tempfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from data_recipes.synthetic import Sample, write_pdf
from vl.errors import ConfigError, VLError
from vl.modeling.vlm import MediaSpan
from vl.processing import chat
from vl.processing.images import normalize
from vl.processing.video import _to_tile as frame_to_tile  # the processor's per-frame resize (squash, bicubic)
from vl.processing.video import frame_timestamps, sample_frame_indices

IGNORE = -100  # label of positions without loss (torch cross_entropy's ignore_index)


class FormattingError(VLError, ValueError):
    """A conversation whose rendered target does not extend its rendered prompt: a prompt-format bug."""

    code = "formatting"


@dataclass
class Example:
    """One tokenized training conversation. `input_ids`/`labels` are 1-D; `labels[i]` is the target at i."""

    input_ids: torch.Tensor  # (t,) long
    labels: torch.Tensor  # (t,) long, IGNORE outside the assistant's tokens
    pixel_values: torch.Tensor | None  # (n_tiles, 3, S, S) in placeholder order
    media: list[MediaSpan]
    sample_id: str
    family: str
    thinking: bool
    meta: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_tiles(self) -> int:
        return 0 if self.pixel_values is None else int(self.pixel_values.shape[0])

    @property
    def num_target_tokens(self) -> int:
        return int((self.labels != IGNORE).sum())


def assistant_text(sample: Sample, thinking: bool) -> str:
    """The final assistant message: the reasoning trace closed by `</think>`, then the answer; or the answer."""
    if thinking:
        if not sample.reasoning:
            raise ConfigError(f"{sample.id}: thinking=True needs a reasoning trace and the sample has none")
        return f"{sample.reasoning}\n{chat.THINK_CLOSE}\n{sample.answer}"
    return sample.answer


def user_message(sample: Sample, media_source=None) -> dict:
    """The user turn as eval builds it (eval/tasks: media parts first, then the question verbatim).

    Documents: the PDF at `media_source` when given, else one image item per page (a PDF item expands to
    exactly these in the prompt). Videos: one video item whose source is `media_source` (a path for the
    processor) or the sample id (a label for the direct path).
    """
    if sample.kind == "document":
        parts = ([{"type": "pdf", "pdf": media_source}] if media_source is not None else
                 [{"type": "image", "image": page} for page in sample.media])
    elif sample.kind == "video":
        parts = [{"type": "video", "video": media_source if media_source is not None else sample.id}]
    else:
        raise ConfigError(f"{sample.id}: kind must be 'document' or 'video', found {sample.kind!r}")
    return {"role": "user", "content": parts + [{"type": "text", "text": sample.question}]}


@dataclass
class VideoTiles:
    pixel_values: torch.Tensor  # (T, 3, S, S)
    frame_indices: list[int]
    timestamps_s: list[float]


def video_tiles(frames, fps: float, processor, *, target_fps: float = 2.0, max_frames: int = 128) -> VideoTiles:
    """Generator frames -> the tiles `Processor` would make from the same clip written at `fps`.

    The steps and their order are vl/processing/video.py's: `sample_frame_indices`, one squash resize per
    frame, `normalize` with the checkpoint's mean/std, timestamps by the processor's convention.
    """
    cfg = processor.config
    indices = sample_frame_indices(len(frames), fps, target_fps, max_frames)
    tiles = np.stack([frame_to_tile(frames[i], cfg.force_image_size) for i in indices])  # (T, S, S, 3)
    return VideoTiles(normalize(tiles, cfg.norm_mean, cfg.norm_std), indices,
                      frame_timestamps(indices, fps, processor.timestamp_convention))


def _video_prompt(sample: Sample, processor, thinking: bool, target_fps: float, max_frames: int):
    """(input_ids (1, t), pixel_values, media, rendered prompt) for a clip, the way `Processor.__call__` builds
    them: render with one `<video>` placeholder, expand it to the timestamped frame run, tokenize without BOS."""
    prompt = chat.render_prompt([user_message(sample)], processor.tokenizer, thinking=thinking,
                                tokens=processor.tokens)
    vid = video_tiles(sample.media, sample.fps, processor, target_fps=target_fps, max_frames=max_frames)
    n = vid.pixel_values.shape[0]
    run = chat.video_placeholder([processor.config.tokens_per_tile] * n, vid.timestamps_s, processor.tokens)
    text = chat.expand_placeholders(prompt.text, [run], processor.tokens)
    ids = processor.tokenizer(text, add_special_tokens=False)["input_ids"]
    return torch.tensor([ids], dtype=torch.long), vid.pixel_values, [MediaSpan("video", n)], prompt


def prompt_inputs(sample: Sample, processor, thinking: bool, *, target_fps: float | None = None,
                  max_frames: int = 128):
    """(input_ids (1, t), pixel_values, media spans, rendered prompt) of the question alone, as at inference.

    `target_fps` defaults to the clip's own fps, so every frame is kept (the synthetic clips are built for
    that: a one-frame flash must not be sampled away)."""
    if sample.kind == "video":
        return _video_prompt(sample, processor, thinking, target_fps or sample.fps, max_frames)
    if sample.num_pages > 1:  # as a PDF, the way export_split writes multi-page samples
        with tempfile.TemporaryDirectory(prefix="vl-train-") as tmp:
            pdf = write_pdf(sample.media, Path(tmp) / "pages.pdf")
            inputs = processor([user_message(sample, str(pdf))], thinking=thinking)
    else:
        inputs = processor([user_message(sample)], thinking=thinking)
    return inputs.input_ids, inputs.pixel_values, inputs.media, inputs.prompt


def format_example(sample: Sample, processor, *, thinking: bool, target_fps: float | None = None,
                   max_frames: int = 128) -> Example:
    """One synthetic sample as a supervised conversation in the given reasoning mode."""
    input_ids, pixel_values, media, prompt = prompt_inputs(sample, processor, thinking, target_fps=target_fps,
                                                           max_frames=max_frames)
    conversation = [user_message(sample), {"role": "assistant", "content": assistant_text(sample, thinking)}]
    full = chat.render_messages(conversation, thinking=thinking, add_generation_prompt=False,
                                tokens=processor.tokens).text
    if not full.startswith(prompt.text):
        raise FormattingError(f"{sample.id}: the rendered conversation does not start with the rendered prompt; "
                              f"the generation prompt and the training target disagree (vl/processing/chat.py)")
    completion = full[len(prompt.text):]
    end = completion.rfind(chat.END_OF_TURN)
    if end < 0:
        raise FormattingError(f"{sample.id}: no end-of-turn token {chat.END_OF_TURN!r} after the assistant text")
    target = processor.tokenizer(completion[:end + len(chat.END_OF_TURN)], add_special_tokens=False)["input_ids"]
    prompt_ids = input_ids[0]
    ids = torch.cat([prompt_ids, torch.tensor(target, dtype=torch.long)])
    labels = torch.cat([torch.full_like(prompt_ids, IGNORE), torch.tensor(target, dtype=torch.long)])
    return Example(ids, labels, pixel_values, list(media), sample.id, sample.family, thinking,
                   {"answer": sample.answer, "prompt_len": int(prompt_ids.shape[0])})


def choose_thinking(sample_id: str, fraction: float, seed: int = 0) -> bool:
    """Deterministic per-sample reasoning mode: True for about `fraction` of ids (stable across runs)."""
    if not 0.0 <= fraction <= 1.0:
        raise ConfigError(f"think fraction must be in [0, 1], found {fraction}")
    h = zlib.crc32(f"{seed}:{sample_id}".encode())
    return h / 2**32 < fraction


def tokenizer_corpus(samples: Iterable[Sample]) -> Iterator[str]:
    """Texts to train the demo BPE on: each sample's whole conversation in both modes, media runs included
    (one frame header per frame, with the timestamps the model will read), rendered by chat.py."""
    for sample in samples:
        for thinking in (False, True):
            conversation = [user_message(sample), {"role": "assistant", "content": assistant_text(sample, thinking)}]
            rendered = chat.render_messages(conversation, thinking=thinking, add_generation_prompt=False)
            runs = []
            for item in rendered.media:
                if item.kind == "video":
                    ts = frame_timestamps(range(sample.num_frames), sample.fps, "reference")
                    runs.append(chat.video_placeholder([1] * sample.num_frames, ts))
                else:
                    runs.append(chat.image_placeholder(1, 1))
            yield chat.expand_placeholders(rendered.text, runs)
