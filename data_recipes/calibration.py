"""Calibration samples for `vl quantize` when no prompts are given: the validation split of the synthetic
documents and clips, sent through the real processor by vl/quantize/ptq.py (documents and clips alternate; clips are
encoded to MP4 so that they go through the video decoder)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from data_recipes.synthetic import make_dataset, write_mp4


class SyntheticCalibration:
    """A `vl.quantize.ptq.CalibrationSource` over data_recipes.synthetic."""

    @staticmethod
    def messages(n: int, tile_size: int, seed: int = 0) -> list[tuple[list[dict], str]]:
        return synthetic_messages(n, tile_size, seed)

    @staticmethod
    def texts(n: int, seed: int = 0) -> list[str]:
        """The synthetic questions, reasoning and answers as plain text (for text-only models)."""
        return [f"{s.question} {s.reasoning} {s.answer}"
                for s in make_dataset("document", "val", n, seed=seed, tile_size=32)]


SYNTHETIC = SyntheticCalibration()


def synthetic_messages(n: int, tile_size: int, seed: int = 0) -> list[tuple[list[dict], str]]:
    """n chat conversations (user question with media + the answer), documents and clips alternating, from
    data_recipes.synthetic's validation split; clips are encoded to MP4 so they go through the video decoder."""
    tile = max(32, min(1024, int(tile_size)))
    n_video = n // 2
    docs = make_dataset("document", "val", n - n_video, seed=seed, tile_size=tile)
    clips = make_dataset("video", "val", n_video, seed=seed, tile_size=tile)
    out, next_doc, next_clip = [], iter(docs), iter(clips)
    with tempfile.TemporaryDirectory(prefix="vl-calib-") as tmp:
        for i in range(n):
            s = next(next_clip) if i % 2 == 1 else next(next_doc)
            if s.kind == "video":
                path = write_mp4(list(s.media), s.fps or 2.0, Path(tmp) / f"clip{i}.mp4")
                media = [{"type": "video", "video": path.read_bytes()}]
                what = f"synthetic video {s.family} ({len(s.media)} frames)"
            else:
                media = [{"type": "image", "image": page} for page in s.media]
                what = f"synthetic document {s.family} ({len(s.media)} page(s))"
            msgs = [{"role": "user", "content": media + [{"type": "text", "text": s.question}]},
                    {"role": "assistant", "content": s.answer}]
            out.append((msgs, what))
    return out
