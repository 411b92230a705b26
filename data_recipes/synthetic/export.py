"""Writes synthetic samples to disk the way users supply media: PNG pages, PDF files, MP4 clips, WAV sounds, plus JSONL.

The held-out set on disk makes eval (and the app's examples) go through the real input path: PDF pages
rendered back with pypdfium2, videos decoded with decord/PyAV and sampled with timestamps. Files are
byte-for-byte reproducible: PDF dates are pinned, x264 runs single-threaded, PNGs carry no metadata.

PDF pages are written at 72 dpi, so 1 px = 1 pt and rendering at scale 1 gives back the original page
size. By default pages are lossless JPEG 2000 images (Pillow writes RGBA pages as JPXDecode, reversible
wavelet; pdfium renders them back bit-exact, about 5 KB a 128 px page), so eval sees the very pixels the
generator drew. `lossless=False` writes JPEG (DCT) pages at quality 95 without chroma subsampling, as
scanned PDFs are (about half the size, mean error under 1 grey level).

Each JSONL record: id, family, kind, split, question, answer, reasoning, chance, metadata, and
`content`: the media as message parts, `{"type": "image"|"pdf"|"video"|"audio", <type>: relative path}`. Sounds
are 16-bit PCM mono WAV files at the generator's 16 kHz (the stdlib `wave` writer: the same samples give the same
bytes), read back through the processor's audio decoder.
"""

from __future__ import annotations

import json
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
from PIL import Image

from vl.errors import ConfigError

from .families import generate, make_dataset
from .common import Sample

PDF_DATE = time.gmtime(946684800)  # 2000-01-01, so the same pages give the same bytes
DEFAULT_CODEC = "libx264"


def write_png(image: Image.Image, path: str | Path) -> Path:
    path = Path(path)
    image.save(path, format="PNG", optimize=False)
    return path


def write_pdf(pages: list[Image.Image], path: str | Path, *, lossless: bool = True) -> Path:
    """One PDF page per image at 72 dpi (page size in points = image size in pixels)."""
    if not pages:
        raise ConfigError("write_pdf needs at least one page; found none")
    path = Path(path)
    if lossless:
        images, codec_opts = [p.convert("RGBA") for p in pages], {}  # opaque alpha; JPX, reversible
    else:
        images, codec_opts = [p.convert("RGB") for p in pages], {"quality": 95, "subsampling": 0}
    images[0].save(path, format="PDF", save_all=True, append_images=images[1:], resolution=72.0,
                   creationDate=PDF_DATE, modDate=PDF_DATE, **codec_opts)
    return path


def write_mp4(frames: list[Image.Image], fps: float, path: str | Path, *, codec: str = DEFAULT_CODEC,
              crf: int = 12) -> Path:
    """Encodes `frames` (PIL, all one even size) to an MP4 (yuv420p) at `fps`, every frame kept.

    `codec` is "libx264" (H.264) or "mpeg4"; a low x264 CRF keeps small glyphs and colours intact.
    """
    import av

    if codec not in ("libx264", "mpeg4"):
        raise ConfigError(f"codec must be 'libx264' or 'mpeg4'; found {codec!r}")
    if codec not in av.codecs_available:
        raise ConfigError(f"this PyAV build has no {codec!r} encoder; pass codec='mpeg4' or install a PyAV wheel with it")
    if not frames:
        raise ConfigError("write_mp4 needs at least one frame; found none")
    width, height = frames[0].size
    if width % 2 or height % 2 or any(f.size != (width, height) for f in frames):
        raise ConfigError(f"frames must share one even size for yuv420p; found {sorted({f.size for f in frames})}")
    rate = Fraction(fps).limit_denominator(1001)
    path = Path(path)
    with av.open(str(path), mode="w", format="mp4") as container:
        stream = container.add_stream(codec, rate=rate)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.thread_count = 1  # x264 output is only reproducible single-threaded
        if codec == "libx264":
            stream.options = {"crf": str(crf), "preset": "medium"}
        else:
            stream.codec_context.bit_rate = 4_000_000
        for i, img in enumerate(frames):
            frame = av.VideoFrame.from_image(img.convert("RGB"))
            frame.pts = i
            frame.time_base = 1 / rate
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def write_wav(wave: np.ndarray, sample_rate: int, path: str | Path) -> Path:
    """A mono float waveform in [-1, 1] as a 16-bit PCM WAV file."""
    import wave as wav

    samples = np.asarray(wave, dtype=np.float64)
    if samples.ndim != 1 or samples.size == 0:
        raise ConfigError(f"write_wav needs a non-empty 1-D waveform; found shape {samples.shape}")
    path = Path(path)
    with wav.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(int(sample_rate))
        f.writeframes(np.round(np.clip(samples, -1.0, 1.0) * 32767).astype("<i2").tobytes())
    return path


def _safe_name(sample_id: str) -> str:
    return sample_id.replace("/", "_")


def export_sample(sample: Sample, out_dir: str | Path, *, codec: str = DEFAULT_CODEC) -> dict:
    """Writes the sample's media under `out_dir` and returns its JSONL record (paths relative to out_dir)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = _safe_name(sample.id)
    if sample.kind == "video":
        name = f"{stem}.mp4"
        write_mp4(sample.media, sample.fps, out_dir / name, codec=codec)
        content = [{"type": "video", "video": name}]
    elif sample.kind == "audio":
        name = f"{stem}.wav"
        write_wav(sample.media[0], sample.metadata["sample_rate"], out_dir / name)
        content = [{"type": "audio", "audio": name}]
    elif len(sample.media) == 1:
        name = f"{stem}.png"
        write_png(sample.media[0], out_dir / name)
        content = [{"type": "image", "image": name}]
    else:
        name = f"{stem}.pdf"
        write_pdf(sample.media, out_dir / name)
        content = [{"type": "pdf", "pdf": name}]
    return {
        "id": sample.id, "family": sample.family, "kind": sample.kind, "split": sample.metadata.get("split"),
        "question": sample.question, "answer": sample.answer, "reasoning": sample.reasoning,
        "chance": sample.chance, "fps": sample.fps, "num_frames": sample.num_frames,
        "num_pages": sample.num_pages, "content": content, "metadata": _jsonable(sample.metadata),
    }


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    return value


def export_split(kind: str, split: str, n: int, out_dir: str | Path, *, seed: int = 0, codec: str = DEFAULT_CODEC,
                 families: list[str] | None = None, **opts) -> Path:
    """Renders `make_dataset(kind, split, n, seed, ...)` into `out_dir` and writes `<kind>_<split>.jsonl`."""
    out_dir = Path(out_dir)
    media_dir = out_dir / "media"
    dataset = make_dataset(kind, split, n, seed, families=families, **opts)
    jsonl = out_dir / f"{kind}_{split}.jsonl"
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(jsonl, "w", encoding="utf-8") as fh:
        for sample in dataset:
            record = export_sample(sample, media_dir, codec=codec)
            for part in record["content"]:
                part[part["type"]] = f"media/{part[part['type']]}"
            fh.write(json.dumps(record, sort_keys=True) + "\n")
    return jsonl


# (family, index, options) of the bundled examples, drawn from the "examples" split (never train/val/test).
# Clips have the demo recipe's length (data_recipes.recipes.VIDEO_OPTIONS: 8 frames at 2 fps).
EXAMPLES = [("doc_total", 0, {}), ("doc_multipage", 1, {"min_pages": 4, "max_pages": 4}),
            ("video_direction", 0, {"num_frames": 8}), ("video_when", 2, {"num_frames": 8})]


def examples_stamp(tile_size: int) -> dict:
    """What a folder of examples was made from; a folder whose stamp differs is made again."""
    return {"tile_size": tile_size, "examples": [[family, index, opts] for family, index, opts in EXAMPLES]}


def write_examples(out_dir: str | Path, *, tile_size: int) -> list[dict]:
    """Writes two documents (a PNG page and a 4-page PDF) and two MP4 clips plus `examples.json`.

    For the app: files are made at run time (nothing binary is committed). The app draws them at its demo
    model's tile size, the size that model was trained on (ui/examples.py says why).
    """
    out_dir = Path(out_dir)
    records = []
    for family, index, opts in EXAMPLES:
        sample = generate(family, "examples", index, tile_size=tile_size, **opts)
        records.append(export_sample(sample, out_dir))
    (out_dir / "examples.json").write_text(json.dumps(records, indent=1, sort_keys=True), encoding="utf-8")
    (out_dir / "examples.stamp.json").write_text(json.dumps(examples_stamp(tile_size)), encoding="utf-8")
    return records
