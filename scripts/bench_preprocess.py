"""Media preprocessing throughput on CPU: images (ours vs transformers), video frames, PDF pages.

Measures, in one process, on inputs generated here (nothing downloaded):
  * a 12-tile page: a 2048 x 1536 picture -> 4 x 3 tiles + thumbnail = 13 normalized 512 px tiles, and a
    4032 x 3024 (12 MP) photo, where the whole-image bicubic resize to 2048 x 1536 dominates.
    Ours from the decoded PIL image (same input transformers gets), ours from JPEG bytes (decode included),
    ours from bytes in the sandbox worker (isolate=True), and transformers' GotOcr2 image processors
    (the same InternVL tiling; torchvision and PIL backends) -> images/s;
  * a 720p, 30 fps, 10 s H.264 clip sampled to 128 frames (one 512 px tile each) with decord and PyAV,
    in-process and isolated -> sampled frames/s;
  * a 50-page Letter PDF of vector drawings rendered at scale 2 (144 dpi, 1224 x 1584 px) -> seconds.
Figures are medians of interleaved rounds after one warm-up (images: 2 x --rounds + 1); on a shared machine
quote ratios, not absolutes.

Usage: .venv/bin/python scripts/bench_preprocess.py [--rounds 3] [--threads 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import tempfile
import time

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFilter

from vl.processing.documents import render_pdf
from vl.processing.images import preprocess_image
from vl.processing.video import load_video

MEAN, STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)


def timed(cases, rounds: int) -> list[float]:
    """Median seconds per case; rounds are interleaved across cases so that load changes on a shared
    machine hit every case alike."""
    for _, fn in cases:
        fn()  # warm-up (imports, worker start, allocator pools)
    times = [[] for _ in cases]
    for _ in range(rounds):
        for k, (_, fn) in enumerate(cases):
            start = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def photo(width: int, height: int) -> Image.Image:
    rng = np.random.default_rng(0)
    base = Image.fromarray(rng.integers(0, 256, (height // 8, width // 8, 3), dtype=np.uint8))
    im = base.resize((width, height), Image.Resampling.BICUBIC).filter(ImageFilter.GaussianBlur(3))
    draw = ImageDraw.Draw(im)
    for k in range(40):
        draw.text((40 + 45 * k % width, 30 * k % height), f"line {k} of some text", fill=(0, 0, 0))
    return im


def make_clip(path: str, frames: int = 300, fps: int = 30, size=(1280, 720)) -> str:
    import av

    w, h = size
    yy, xx = np.mgrid[0:h, 0:w]
    with av.open(path, "w") as container:
        stream = container.add_stream("libx264", rate=fps, options={"preset": "ultrafast"})
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        for i in range(frames):
            a = np.stack([(xx + 4 * i) % 256, (yy + 2 * i) % 256, (xx + yy) % 256], -1).astype(np.uint8)
            a[100:200, (10 * i) % (w - 100) : (10 * i) % (w - 100) + 100] = 255
            for packet in stream.encode(av.VideoFrame.from_ndarray(a, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def make_pdf(pages: int = 50) -> bytes:
    """Letter pages, each with 400 filled rectangles and 100 stroked lines (vector content, no fonts)."""
    rng = np.random.default_rng(0)
    bodies = [b"<< /Type /Catalog /Pages 2 0 R >>",
              f"<< /Type /Pages /Kids [{' '.join(f'{3 + 2 * k} 0 R' for k in range(pages))}] /Count {pages} >>".encode()]
    for k in range(pages):
        ops = []
        for _ in range(400):
            x, y, w, h = rng.uniform(0, 560), rng.uniform(0, 740), rng.uniform(2, 50), rng.uniform(2, 20)
            r, g, b = rng.uniform(0, 1, 3)
            ops.append(f"{r:.2f} {g:.2f} {b:.2f} rg {x:.1f} {y:.1f} {w:.1f} {h:.1f} re f")
        for _ in range(100):
            x0, y0, x1, y1 = rng.uniform(0, 600, 4)
            ops.append(f"0 0 0 RG {x0:.1f} {y0:.1f} m {x1:.1f} {y1:.1f} l S")
        content = "\n".join(ops).encode()
        bodies.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {4 + 2 * k} 0 R >>".encode())
        bodies.append(f"<< /Length {len(content)} >>\nstream\n".encode() + content + b"\nendstream")
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for n, body in enumerate(bodies, start=1):
        offsets.append(len(out))
        out += f"{n} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(bodies) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{o:010d} 00000 n \n".encode() for o in offsets)
    out += f"trailer\n<< /Size {len(bodies) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (transformers' path)")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers.models.got_ocr2.image_processing_got_ocr2 import GotOcr2ImageProcessor
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil

    rows = []
    image = photo(2048, 1536)
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=90)
    jpeg = buf.getvalue()
    hf_kwargs = dict(size={"height": 512, "width": 512}, crop_to_patches=True, min_patches=1, max_patches=12,
                     image_mean=MEAN, image_std=STD)
    hf_tv, hf_pil = GotOcr2ImageProcessor(**hf_kwargs), GotOcr2ImageProcessorPil(**hf_kwargs)
    assert preprocess_image(image, norm_mean=MEAN, norm_std=STD).num_tiles == 13
    image_cases = [
        ("ours, PIL input", lambda: preprocess_image(image, norm_mean=MEAN, norm_std=STD)),
        ("ours, JPEG bytes (decode incl.)", lambda: preprocess_image(jpeg, norm_mean=MEAN, norm_std=STD)),
        ("ours, JPEG bytes, isolate=True", lambda: preprocess_image(jpeg, norm_mean=MEAN, norm_std=STD, isolate=True)),
        ("transformers GotOcr2 (torchvision)", lambda: hf_tv(images=[image], return_tensors="pt")),
        ("transformers GotOcr2 (PIL)", lambda: hf_pil(images=[image], return_tensors="pt")),
    ]
    image_seconds = timed(image_cases, 2 * args.rounds + 1)
    for (name, _), seconds in zip(image_cases, image_seconds):
        rows.append(("12-tile page 2048x1536 -> 13 tiles", name, f"{1 / seconds:.1f} images/s",
                     f"{image_seconds[0] / seconds:.2f}x of ours(PIL)"))
    phone = photo(4032, 3024)  # a 12 MP camera picture: the whole-image resize to 2048 x 1536 dominates
    phone_cases = [
        ("ours, PIL input", lambda: preprocess_image(phone, norm_mean=MEAN, norm_std=STD)),
        ("transformers GotOcr2 (torchvision)", lambda: hf_tv(images=[phone], return_tensors="pt")),
        ("transformers GotOcr2 (PIL)", lambda: hf_pil(images=[phone], return_tensors="pt")),
    ]
    phone_seconds = timed(phone_cases, 2 * args.rounds + 1)
    for (name, _), seconds in zip(phone_cases, phone_seconds):
        rows.append(("12 MP photo 4032x3024 -> 13 tiles", name, f"{1 / seconds:.1f} images/s",
                     f"{phone_seconds[0] / seconds:.2f}x of ours(PIL)"))

    with tempfile.TemporaryDirectory() as tmp:
        clip = make_clip(os.path.join(tmp, "clip720p.mp4"))
        video_cases = [
            (f"{backend}{', isolate=True' if isolate else ''}",
             lambda b=backend, i=isolate: load_video(clip, norm_mean=MEAN, norm_std=STD, backend=b, target_fps=30,
                                                     max_frames=128, isolate=i))
            for backend in ("decord", "pyav") for isolate in (False, True)
        ]
        assert len(video_cases[0][1]().frame_indices) == 128
        for (name, _), seconds in zip(video_cases, timed(video_cases, args.rounds)):
            rows.append(("128 of 300 frames, 1280x720 H.264", name, f"{128 / seconds:.1f} frames/s",
                         f"{seconds:.2f} s per video"))

    pdf = make_pdf(50)
    pdf_cases = [(f"pypdfium2{', isolate=True' if i else ''}", lambda i=i: render_pdf(pdf, scale=2.0, isolate=i))
                 for i in (False, True)]
    for (name, _), seconds in zip(pdf_cases, timed(pdf_cases, args.rounds)):
        rows.append(("50-page Letter PDF at scale 2", name, f"{seconds:.2f} s", f"{50 / seconds:.1f} pages/s"))

    widths = [max(len(str(r[i])) for r in rows) for i in range(4)]
    print(f"torch threads={args.threads}, rounds={args.rounds} (median), cpu_count={os.cpu_count()}")
    for r in rows:
        print(" | ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([dict(zip(("case", "variant", "value", "note"), r)) for r in rows], f, indent=1)


if __name__ == "__main__":
    main()
