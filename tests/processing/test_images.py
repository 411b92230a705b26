"""vl/processing/images.py: safe decoding of untrusted images, docs/reliability_policy.md rows I1-I12.
Tiling and normalization against the references live in test_tiling.py."""

import io
import logging
import os
import struct
import subprocess
import sys
import warnings
import zlib

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageFile

sys.path.insert(0, os.path.dirname(__file__))
from media_fixtures import (  # noqa: E402
    animated,
    bmp_rle,
    corner_marked,
    encode,
    encode_heif,
    exif_block,
    mpo_with_huge_second_frame,
    mutate_bytes,
    noise_image,
    orientation_short,
    orientation_srational,
    png_chunk,
    png_header_only,
)

from vl.errors import (  # noqa: E402
    ConfigError,
    CorruptMediaError,
    MediaError,
    MediaTooLargeError,
    RemoteMediaError,
    TooManyItemsError,
    UnsupportedFormatError,
    VLError,
)
from vl.processing.images import (  # noqa: E402
    BACKGROUND_RGB,
    decode_image_bytes,
    load_image,
    preprocess_image,
    sniff_image,
)
from vl.processing.limits import MediaLimits  # noqa: E402

CLIP_MEAN, CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)


def _rss_mb():
    import psutil

    return psutil.Process().memory_info().rss / 2**20


# --- I1-I3: sizes checked from the header ------------------------------------------------------------


def test_i1_header_bomb_refused_before_decode_rss_flat():
    before = _rss_mb()
    with pytest.raises(MediaTooLargeError, match="too large"):
        load_image(png_header_only(40000, 40000))
    # 8000 x 8000 is below Pillow's 2x bomb error but above our 50 MP cap: our header check must fire (its
    # tiny IDAT would otherwise surface as a truncation error at decode time)
    with pytest.raises(MediaTooLargeError, match="64,000,000 pixels"):
        load_image(png_header_only(8000, 8000))
    assert _rss_mb() - before < 50


def test_i2_exact_pixel_boundary():
    limits = MediaLimits(max_image_pixels=100 * 100)
    assert load_image(encode(noise_image(100, 100), "PNG"), limits).size == (100, 100)
    assert load_image(encode(noise_image(50, 200), "PNG"), limits).size == (50, 200)
    with pytest.raises(MediaTooLargeError, match="10,100 pixels"):
        load_image(encode(noise_image(101, 100), "PNG"), limits)


def test_bomb_warning_threshold_is_folded_into_our_cap(monkeypatch):
    """An image Pillow would only *warn* about is refused, whatever the warnings filter says."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    data = encode(noise_image(40, 40), "PNG")  # 1600 px: above the warning threshold, below the 2x error
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(MediaTooLargeError):
            load_image(data)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # promoted warning is mapped too
        with pytest.raises(MediaTooLargeError):
            load_image(data)


@pytest.mark.parametrize("size", [(100000, 0), (0, 0), (0, 100000)])
def test_i3_zero_dimensions(size):
    with pytest.raises(MediaError):
        load_image(png_header_only(*size))


def test_i3_zero_sized_pil_input():
    with pytest.raises(CorruptMediaError):
        load_image(Image.new("RGB", (0, 5)))


# --- I4: truncation and corruption (strict) -----------------------------------------------------------


def _flip(data: bytes, pos: int) -> bytes:
    b = bytearray(data)
    b[pos] ^= 0xFF
    return bytes(b)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
@pytest.mark.parametrize("cut", ["half", "last_byte"])
def test_i4_truncated(fmt, cut):
    data = encode(noise_image(64, 64), fmt)
    data = data[: len(data) // 2] if cut == "half" else data[:-1]
    with pytest.raises(CorruptMediaError):
        load_image(data)


@pytest.mark.parametrize("chunk", [b"IHDR", b"IDAT"])
def test_i4_bad_png_crc(chunk):
    data = encode(noise_image(32, 32), "PNG")
    at = data.index(chunk)
    (length,) = struct.unpack(">I", data[at - 4 : at])
    with pytest.raises(CorruptMediaError, match="CRC"):
        load_image(_flip(data, at + 4 + length))  # first CRC byte of that chunk


def test_i4_strict_mode_cannot_be_bypassed(monkeypatch):
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    with pytest.raises(ConfigError, match="LOAD_TRUNCATED_IMAGES"):
        load_image(encode(noise_image(8, 8), "JPEG"))


# --- I5: format by content ------------------------------------------------------------------------------

_EPS = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nnewpath 0 0 moveto 10 10 lineto stroke\n%%EOF\n"


@pytest.mark.parametrize(
    "data, found",
    [
        (b"", "empty"),
        (bytes(np.random.default_rng(0).integers(0, 256, 300, dtype=np.uint8)), "unrecognized"),
        (b"hello, I am text in a .png file\n", "unrecognized"),
        (_EPS, "EPS"),
        (b"%PDF-1.4\n1 0 obj<<>>endobj\n", "PDF"),
        (b"\x00\x00\x00\x18ftypisom\x00\x00\x02\x00isomiso2" + bytes(64), "MP4/MOV video"),
        (b"8BPS\x00\x01" + bytes(64), "PSD"),
    ],
    ids=["empty", "random", "text", "eps", "pdf", "mp4", "psd"],
)
def test_i5_unsupported_formats_by_magic_bytes(tmp_path, monkeypatch, data, found):
    from PIL import EpsImagePlugin

    def no_ghostscript(*a, **k):
        raise AssertionError("a subprocess was started while decoding an image")

    def no_eps_parser(*a, **k):
        raise AssertionError("Pillow's EPS parser was reached")

    monkeypatch.setattr(subprocess, "Popen", no_ghostscript)
    monkeypatch.setattr(EpsImagePlugin.EpsImageFile, "_open", no_eps_parser)
    path = tmp_path / "safe.png"
    path.write_bytes(data)
    with pytest.raises(UnsupportedFormatError, match=found):
        load_image(str(path))
    with pytest.raises(UnsupportedFormatError):
        load_image(data)


def test_i5_allowlisted_formats_decode(tmp_path):
    im = noise_image(16, 12)
    for fmt in ["PNG", "JPEG", "GIF", "WEBP", "BMP", "TIFF", "AVIF", "HEIF"]:
        data = encode_heif(im) if fmt == "HEIF" else encode(im, fmt)
        assert load_image(data).size == (16, 12), fmt
        path = tmp_path / "safe.png"  # by content, whatever the name says
        path.write_bytes(data)
        assert load_image(str(path)).size == (16, 12) and sniff_image(str(path)) == fmt, fmt


def test_urls_are_refused():
    for url in ["http://169.254.169.254/latest", "https://x/y.png", "file:///etc/passwd", "data:image/png;base64,"]:
        with pytest.raises(RemoteMediaError):
            load_image(url)


# --- I6, I7: EXIF orientation ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
@pytest.mark.parametrize("name", ["zero", "nine", "rational_-1_0"])
def test_i6_invalid_orientation_kept_unrotated_with_warning(fmt, name, caplog):
    entry = {
        "zero": exif_block(orientation_short(0)),
        "nine": exif_block(orientation_short(9)),
        "rational_-1_0": exif_block(*orientation_srational(-1, 0)),
    }[name]
    with caplog.at_level(logging.WARNING, logger="vl.processing.images"):
        im = load_image(encode(corner_marked(40, 20), fmt, exif=entry))
    assert im.size == (40, 20)
    assert im.getpixel((1, 1))[0] > 200 and im.getpixel((1, 1))[1] < 50  # red corner still top-left
    assert any("orientation" in r.message or "EXIF" in r.message for r in caplog.records)


def test_i6_duplicated_exif_header_accepted():
    """Pillow 12.3 reads through a doubled "Exif\\0\\0" prefix, so the valid orientation 6 inside is applied
    (the matrix expects "accepted"; un-rotated would also pass it; what must not happen is an exception)."""
    doubled = b"Exif\x00\x00" + exif_block(orientation_short(6))
    im = load_image(encode(corner_marked(40, 20), "PNG", exif=doubled))
    assert im.size in ((20, 40), (40, 20))


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_i7_orientation_6_and_8_swap_and_move_the_corner(fmt):
    # 6: display = stored rotated 90 deg clockwise, so the stored top-left lands top-right
    im6 = load_image(encode(corner_marked(40, 20), fmt, exif=exif_block(orientation_short(6))))
    assert im6.size == (20, 40)
    assert im6.getpixel((18, 1))[0] > 200 and im6.getpixel((1, 1))[0] < 200
    # 8: rotated 90 deg counter-clockwise, so the stored top-left lands bottom-left
    im8 = load_image(encode(corner_marked(40, 20), fmt, exif=exif_block(orientation_short(8))))
    assert im8.size == (20, 40)
    assert im8.getpixel((1, 38))[0] > 200 and im8.getpixel((1, 1))[0] < 200


def test_orientation_size_used_for_tiling():
    tiles = preprocess_image(
        encode(corner_marked(1024, 512), "PNG", exif=exif_block(orientation_short(6))),
        norm_mean=CLIP_MEAN, norm_std=CLIP_STD,
    )
    assert tiles.image_size == (512, 1024) and tiles.grid == (1, 2)


# --- I8: modes -------------------------------------------------------------------------------------------


def _png16(width, height, rgb16) -> bytes:
    """A 16-bit-per-channel RGB PNG (Pillow cannot write one) filled with `rgb16`."""
    row = b"\x00" + struct.pack(">HHH", *rgb16) * width
    ihdr = struct.pack(">II", width, height) + b"\x10\x02\x00\x00\x00"
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", zlib.compress(row * height))
            + png_chunk(b"IEND", b""))


def _palette_with_transparency():
    im = Image.new("P", (4, 4), 0)
    im.putpalette([255, 0, 0, 0, 0, 255] + [0] * 762)
    im.putpixel((1, 1), 1)
    return encode(im, "PNG", transparency=0)  # index 0 (red) is transparent


@pytest.mark.parametrize(
    "data, pixel, expected",
    [
        (lambda: encode(Image.new("RGBA", (4, 4), (0, 0, 0, 0)), "PNG"), (0, 0), BACKGROUND_RGB),
        (lambda: encode(Image.new("RGBA", (4, 4), (255, 0, 0, 255)), "PNG"), (0, 0), (255, 0, 0)),
        (lambda: encode(Image.new("RGBA", (4, 4), (255, 0, 0, 128)), "PNG"), (0, 0), (255, 127, 127)),
        (lambda: encode(Image.new("LA", (4, 4), (0, 0)), "PNG"), (0, 0), BACKGROUND_RGB),
        (lambda: encode(Image.new("LA", (4, 4), (10, 255)), "PNG"), (0, 0), (10, 10, 10)),
        (_palette_with_transparency, (0, 0), BACKGROUND_RGB),
        (_palette_with_transparency, (1, 1), (0, 0, 255)),
        (lambda: encode(Image.new("CMYK", (4, 4), (0, 0, 0, 0)), "JPEG", quality=100), (0, 0), (255, 255, 255)),
        (lambda: encode(Image.new("I;16", (4, 4), 65535), "PNG"), (0, 0), (255, 255, 255)),
        (lambda: encode(Image.new("I;16", (4, 4), 32896), "PNG"), (0, 0), (128, 128, 128)),
        (lambda: encode(Image.new("1", (4, 4), 1), "PNG"), (0, 0), (255, 255, 255)),
        (lambda: encode(Image.new("1", (4, 4), 0), "BMP"), (0, 0), (0, 0, 0)),
        (lambda: _png16(4, 4, (65535, 32768, 0)), (0, 0), (255, 128, 0)),
    ],
    ids=["rgba-clear", "rgba-opaque", "rgba-half", "la-clear", "la-opaque", "p-transparent", "p-opaque",
         "cmyk-white", "i16-max", "i16-mid", "1bit-white", "1bit-black-bmp", "png-16bit-rgb"],
)
def test_i8_modes_to_rgb_golden_pixels(data, pixel, expected):
    im = load_image(data())
    assert im.mode == "RGB" and im.size == (4, 4)
    assert all(abs(a - b) <= 1 for a, b in zip(im.getpixel(pixel), expected)), im.getpixel(pixel)


def test_i8_cmyk_cyan():
    im = load_image(encode(Image.new("CMYK", (8, 8), (255, 0, 0, 0)), "JPEG", quality=100))
    r, g, b = im.getpixel((4, 4))
    assert r < 10 and g > 245 and b > 245


# --- I9: animations and MPO: frame 0 only -----------------------------------------------------------------


def _gif_with_frames(n: int) -> bytes:
    """n-frame GIF: Pillow's 2-frame file with its second frame block repeated (Pillow's own writer is slow)."""
    two = animated("GIF", 2)
    second = two.index(b"\x21\xf9", two.index(b"\x21\xf9") + 1)
    return two[:second] + two[second:-1] * (n - 1) + b"\x3b"


@pytest.mark.parametrize("fmt", ["GIF", "WEBP"])
def test_i9_many_frame_animation_reads_frame_0_only(fmt, monkeypatch):
    """Quickly = no frame after the first is reached: the plugin's frame walk (`_seek`, behind `seek`, `n_frames`
    on GIF, `ImageSequence`) is counted, not timed."""
    from PIL import GifImagePlugin, WebPImagePlugin

    plugin = GifImagePlugin.GifImageFile if fmt == "GIF" else WebPImagePlugin.WebPImageFile
    reached, original = [], plugin._seek
    monkeypatch.setattr(plugin, "_seek", lambda self, frame, *a: (reached.append(frame), original(self, frame, *a))[1])
    data = _gif_with_frames(5000) if fmt == "GIF" else animated("WEBP", 5000)
    im = load_image(data)
    assert reached and max(reached) == 0, sorted(set(reached))[-3:]
    walked = Image.open(io.BytesIO(data))
    walked.seek(2)
    walked.load()
    assert max(reached) == 2  # the counter sees a walk
    assert im.size == (8, 8)
    assert max(abs(a - b) for a, b in zip(im.getpixel((0, 0)), (0, 0, 7))) <= 2  # frame 0 (WebP is lossy)


def test_i9_mpo_huge_second_frame_never_sought(monkeypatch):
    from PIL import MpoImagePlugin

    sought = []
    original = MpoImagePlugin.MpoImageFile.seek
    monkeypatch.setattr(MpoImagePlugin.MpoImageFile, "seek",
                        lambda self, frame: (sought.append(frame), original(self, frame))[1])
    im = load_image(mpo_with_huge_second_frame(40000))
    assert im.size == (32, 24)
    assert max(sought, default=0) == 0


# --- I10, I11: request-level caps -----------------------------------------------------------------------


def test_i10_too_many_images_refused_before_decode():
    limits = MediaLimits(max_images=4)
    limits.check_count("image", 4)
    with pytest.raises(TooManyItemsError, match="at most 4 image"):
        limits.check_count("image", 5)


def test_i11_byte_cap_before_pillow(tmp_path, monkeypatch):
    limits = MediaLimits(max_image_bytes=1000)
    data = encode(noise_image(64, 64), "PNG")
    assert len(data) > 1000

    def pillow_must_not_run(*a, **k):
        raise AssertionError("Pillow saw an over-cap body")

    monkeypatch.setattr(Image, "open", pillow_must_not_run)
    with pytest.raises(MediaTooLargeError, match="cap"):
        load_image(data, limits)
    path = tmp_path / "big.png"
    path.write_bytes(data)
    with pytest.raises(MediaTooLargeError):
        load_image(str(path), limits)

    class CountingReader(io.BytesIO):
        read_sizes = []

        def read(self, n=-1):
            self.read_sizes.append(n)
            return super().read(n)

    stream = CountingReader(b"\x89PNG\r\n\x1a\n" + bytes(50 << 20))
    with pytest.raises(MediaTooLargeError):
        load_image(stream, limits)
    assert stream.read_sizes == [1001]  # never reads the whole 50 MB body


# --- I12: fuzz -------------------------------------------------------------------------------------------

_SEEDS = {fmt: encode(noise_image(24, 16, seed=3), fmt) for fmt in ["PNG", "JPEG", "GIF", "WEBP"]}


@st.composite
def _mutated(draw):
    data = bytearray(_SEEDS[draw(st.sampled_from(sorted(_SEEDS)))])
    return mutate_bytes(draw, data, st)


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")  # mutated headers; refused by our cap
@settings(max_examples=400, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutated())
def test_i12_fuzz_only_typed_errors_escape(data):
    try:
        im = load_image(data)
    except MediaError:
        return
    assert im.mode == "RGB" and im.width > 0 and im.height > 0


def test_i12_fuzz_cases_do_not_kill_the_isolated_worker():
    from vl.processing.sandbox import run_isolated
    from sandbox_targets import pid

    rng = np.random.default_rng(1)
    worker = run_isolated(pid, timeout=30)
    for k in range(24):
        data = bytearray(_SEEDS[sorted(_SEEDS)[k % 4]])
        for pos in rng.integers(0, len(data), 6):
            data[pos] = int(rng.integers(0, 256))
        try:
            load_image(bytes(data), isolate=True)
        except MediaError:
            pass
    assert run_isolated(pid, timeout=30) == worker


def test_isolated_preprocess_equals_in_process():
    data = encode(noise_image(700, 300), "JPEG")
    a = preprocess_image(data, norm_mean=CLIP_MEAN, norm_std=CLIP_STD)
    b = preprocess_image(data, norm_mean=CLIP_MEAN, norm_std=CLIP_STD, isolate=True)
    assert a.grid == b.grid and torch.equal(a.pixel_values, b.pixel_values)


def test_only_typed_errors_for_bad_sources():
    with pytest.raises(TypeError):
        load_image(12345)
    with pytest.raises(VLError):
        load_image("/nonexistent/file.png")


# --- colour keys (PNG tRNS outside palette images) --------------------------------------------------------------


def _keyed_png(array, mode, key) -> bytes:
    im = Image.fromarray(array)  # uint8 (H, W, 3) -> RGB, uint8 (H, W) -> L, uint16 (H, W) -> I;16
    assert im.mode == mode
    return encode(im, "PNG", transparency=key)


@pytest.mark.parametrize("case", ["rgb", "grey", "grey16", "bilevel"])
def test_8_colour_key_composited_over_white(case):
    """Pixels equal to the tRNS key are transparent (PNG §11.3.2.1) and come out white, as alpha does."""
    if case == "rgb":
        a = np.zeros((4, 6, 3), np.uint8)
        a[:2], a[2:] = (10, 20, 30), (200, 0, 0)
        data, keyed, kept = _keyed_png(a, "RGB", (10, 20, 30)), (slice(0, 2),), ((3, 0), (200, 0, 0))
    elif case == "grey":
        a = np.zeros((4, 6), np.uint8)
        a[2:] = 128
        data, keyed, kept = _keyed_png(a, "L", 0), (slice(0, 2),), ((3, 0), (128, 128, 128))
    elif case == "grey16":
        a = np.full((4, 6), 1000, np.uint16)
        a[2:] = 65535
        data, keyed, kept = _keyed_png(a, "I;16", 1000), (slice(0, 2),), ((3, 0), (255, 255, 255))
    else:
        a = np.zeros((4, 6), bool)
        a[:, 3:] = True
        data = encode(Image.fromarray(a), "PNG", transparency=0)
        keyed, kept = (slice(None), slice(0, 3)), ((0, 4), (255, 255, 255))
    png = Image.open(io.BytesIO(data))
    assert "transparency" in png.info and png.mode != "P"  # the fixture really is a colour-keyed image
    out = np.asarray(decode_image_bytes(data))
    assert (out[keyed] == 255).all(), out[..., 0]  # white where the key matched, not the key colour / black
    (y, x), colour = kept
    assert tuple(out[y, x]) == colour
    if case in ("rgb", "grey"):  # same as Pillow's own RGBA conversion composited over white
        rgba = png.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        assert np.array_equal(out, np.asarray(Image.alpha_composite(white, rgba).convert("RGB")))


def _png_from_rows(width, height, depth, colour_type, rows: bytes, trns: bytes) -> bytes:
    """A hand-written PNG (filter 0 on every row), for bit depths Pillow cannot write."""
    ihdr = struct.pack(">IIBBBBB", width, height, depth, colour_type, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"tRNS", trns)
            + png_chunk(b"IDAT", zlib.compress(rows)) + png_chunk(b"IEND", b""))


def test_8_colour_key_at_the_file_bit_depth():
    """The key is stored at the file's bit depth: 4-bit grey key 1 is the pixel Pillow scales to 17; a 16-bit
    RGB key (never above 255 after Pillow keeps the high byte) is matched on its high byte, and no longer
    overflows."""
    grey4 = _png_from_rows(4, 1, 4, 0, b"\x00" + bytes([0x01, 0x23]), struct.pack(">H", 1))  # pixels 0 1 2 3
    out = np.asarray(decode_image_bytes(grey4))[0]
    assert out[:, 0].tolist() == [0, 255, 34, 51]  # only the pixel equal to the key turns white
    px = np.array([[(1000, 2000, 3000), (60000, 2000, 3000)]], ">u2")
    rgb16 = _png_from_rows(2, 1, 16, 2, b"\x00" + px.tobytes(), struct.pack(">HHH", 1000, 2000, 3000))
    out = np.asarray(decode_image_bytes(rgb16))[0]
    assert out[0].tolist() == [255, 255, 255] and out[1].tolist() == [60000 >> 8, 2000 >> 8, 3000 >> 8]


# --- BMP RLE: decoded by the spec (Pillow 12.3 scrambles odd absolute runs of RLE4) ---------------------------

_PALETTE = [(0, 0, 0), (255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0), (0, 255, 255), (255, 0, 255),
            (128, 128, 128)] + [(16 * i, 100, 50) for i in range(8)]
_RLE4_STREAM = bytes([  # 7 x 3 pixels, bottom row first
    0, 3, 0x12, 0x30,  # absolute run of 3 pixels: 1 2 3 (2 bytes, already 16-bit aligned)
    4, 0x45,  # encoded run of 4: 4 5 4 5
    0, 0,  # end of line
    0, 5, 0x67, 0x12, 0x30, 0x00,  # absolute run of 5: 6 7 1 2 3 (3 bytes + 1 pad byte)
    2, 0x66,  # 6 6
    0, 0,
    7, 0x12,  # 1 2 1 2 1 2 1
    0, 1,  # end of bitmap
])
_RLE4_INDICES = [[1, 2, 1, 2, 1, 2, 1],  # top row
                 [6, 7, 1, 2, 3, 6, 6],
                 [1, 2, 3, 4, 5, 4, 5]]
_RLE8_STREAM = bytes([  # 7 x 3 pixels, bottom row first
    0, 3, 1, 2, 3, 0,  # absolute run of 3 (+ pad)
    4, 9,  # 9 9 9 9
    0, 0,
    2, 5, 0, 2, 2, 0, 3, 14,  # 5 5, delta 2 right, 14 14 14
    0, 0,
    0, 2, 3, 0, 2, 8,  # delta 3 right, 8 8
    0, 1,  # end of bitmap before the row ends: the rest is index 0
])
_RLE8_INDICES = [[0, 0, 0, 8, 8, 0, 0],
                 [5, 5, 0, 0, 14, 14, 14],
                 [1, 2, 3, 9, 9, 9, 9]]


@pytest.mark.parametrize("bits, stream, indices", [(4, _RLE4_STREAM, _RLE4_INDICES), (8, _RLE8_STREAM, _RLE8_INDICES)],
                         ids=["rle4", "rle8"])
def test_bmp_rle_golden_pixels(bits, stream, indices):
    """Odd-length absolute runs with their pad byte, encoded runs, end of line, delta and an early end of bitmap."""
    palette = _PALETTE + [(1, 2, 3)] * (256 - len(_PALETTE)) if bits == 8 else _PALETTE
    expected = np.array(palette, np.uint8)[np.array(indices)]  # (3, 7, 3)
    for top_down in (False, True):  # a top-down file lists the rows the other way round
        data = bmp_rle(7, 3, palette, stream, bits=bits, top_down=top_down)
        out = np.asarray(load_image(data))
        assert np.array_equal(out, expected if not top_down else expected[::-1]), out[..., 0]
    assert np.array_equal(np.asarray(load_image(data, isolate=True)), expected[::-1])
    assert sniff_image(data) == "BMP"


def test_bmp_rle_truncated_and_garbage_are_typed():
    data = bmp_rle(7, 3, _PALETTE, _RLE4_STREAM)
    for cut in range(len(data) - len(_RLE4_STREAM), len(data) - 2):  # every cut inside the stream, before EOF
        with pytest.raises(CorruptMediaError, match="truncated"):
            load_image(data[:cut])
    rng = np.random.default_rng(0)
    for _ in range(200):  # random streams: an image or a typed error, never anything else
        stream = rng.integers(0, 256, int(rng.integers(0, 80)), dtype=np.uint8).tobytes()
        try:
            assert load_image(bmp_rle(9, 5, _PALETTE, stream, bits=int(rng.choice([4, 8])))).size == (9, 5)
        except MediaError:
            pass


# --- TIFF, HEIC, AVIF: accepted by content, same limits ------------------------------------------------------

_TIFF_CODECS = ["raw", "packbits", "tiff_lzw", "tiff_adobe_deflate", "jpeg", "group3", "group4"]


@pytest.mark.parametrize("compression", _TIFF_CODECS)
def test_tiff_compressions_scanners_write_decode(compression):
    im = corner_marked(40, 20)
    if compression.startswith("group"):  # fax codecs are bilevel: black corner on white
        im = Image.new("1", (40, 20), 1)
        im.paste(0, (0, 0, 4, 4))
    out = load_image(encode(im, "TIFF", compression=compression))
    assert out.size == (40, 20)
    corner, rest = out.getpixel((1, 1)), out.getpixel((30, 15))
    if compression.startswith("group"):
        assert corner == (0, 0, 0) and rest == (255, 255, 255)
    else:
        assert corner[0] > 200 and corner[1] < 60 and abs(rest[0] - 128) < 8


@pytest.mark.parametrize("compression", ["lzma", "zstd"])
def test_tiff_rare_compressions_refused_by_name(compression):
    data = encode(noise_image(16, 12), "TIFF", compression=compression)
    for call in (load_image, sniff_image):
        with pytest.raises(UnsupportedFormatError, match=compression):
            call(data)


def test_tiff_modes_orientation_and_pages():
    grey16 = Image.new("I;16", (8, 4), 32896)
    assert load_image(encode(grey16, "TIFF")).getpixel((0, 0)) == (128, 128, 128)
    cmyk = Image.new("CMYK", (8, 4), (255, 0, 0, 0))
    assert load_image(encode(cmyk, "TIFF")).getpixel((0, 0)) == (0, 255, 255)
    rgba = Image.new("RGBA", (8, 4), (255, 0, 0, 0))
    assert load_image(encode(rgba, "TIFF", compression="tiff_lzw")).getpixel((0, 0)) == BACKGROUND_RGB
    rotated = load_image(encode(corner_marked(40, 20), "TIFF", tiffinfo={0x0112: 6}))  # orientation 6, as in I7
    assert rotated.size == (20, 40) and rotated.getpixel((18, 1))[0] > 200 and rotated.getpixel((1, 1))[0] < 200
    pages = encode(Image.new("RGB", (16, 12), (200, 0, 0)), "TIFF", save_all=True,
                   append_images=[Image.new("RGB", (40000, 1), (0, 200, 0))])
    first = load_image(pages, MediaLimits(max_image_pixels=16 * 12))  # page 1 only, like frame 0 of a GIF: page 2,
    # above this cap, is never read
    assert first.size == (16, 12) and first.getpixel((3, 3)) == (200, 0, 0)


def _tiff_header_only(width: int, height: int, big_endian: bool = False) -> bytes:
    """A TIFF whose first IFD claims `width` x `height` 8-bit RGB in one tiny strip."""
    e = ">" if big_endian else "<"
    entries = [(256, 4, 1, width), (257, 4, 1, height), (258, 3, 1, 8), (259, 3, 1, 1), (262, 3, 1, 2),
               (273, 4, 1, 8 + 2 + 12 * 10 + 4), (277, 3, 1, 3), (278, 4, 1, height), (279, 4, 1, 16),
               (284, 3, 1, 1)]
    ifd = struct.pack(e + "H", len(entries))
    for tag, kind, count, value in entries:
        ifd += struct.pack(e + "HHI", tag, kind, count) + (struct.pack(e + "HH", value, 0) if kind == 3
                                                            else struct.pack(e + "I", value))
    return (b"MM\x00*" if big_endian else b"II*\x00") + struct.pack(e + "I", 8) + ifd + b"\x00" * 4 + bytes(16)


def test_tiff_header_bomb_refused_before_decode(monkeypatch):
    from PIL import ImageFile as PilImageFile

    def no_decode(self, *a, **k):
        raise AssertionError("pixels were decoded before the size check")

    monkeypatch.setattr(PilImageFile.ImageFile, "load", no_decode)
    for big_endian in (False, True):
        with pytest.raises(MediaTooLargeError, match="64,000,000 pixels"):
            load_image(_tiff_header_only(8000, 8000, big_endian))
        with pytest.raises(MediaTooLargeError):
            sniff_image(_tiff_header_only(40000, 40000, big_endian))
    monkeypatch.undo()
    assert load_image(_tiff_header_only(4, 1)).size == (4, 1)  # the builder makes a valid file


def _set_ispe(data: bytes, width: int, height: int) -> bytes:
    """Rewrite the `ispe` (image spatial extents) property of a HEIF/AVIF file: the size a decoder reads first."""
    at = data.index(b"ispe") + 8  # box type, then version+flags (4 bytes), then width and height (u32 each)
    return data[:at] + struct.pack(">II", width, height) + data[at + 8:]


@pytest.mark.parametrize("fmt", ["HEIF", "AVIF"])
def test_heic_avif_decode_with_orientation_and_size_cap(fmt):
    exif = Image.Exif()
    exif[0x0112] = 6  # HEIC: written as the irot transform; AVIF: kept as the EXIF tag by Pillow
    im = corner_marked(64, 32)
    data = encode_heif(im, quality=95) if fmt == "HEIF" else encode(im, "AVIF", quality=95)
    rotated = encode_heif(im, quality=95, exif=exif.tobytes()) if fmt == "HEIF" else \
        encode(im, "AVIF", quality=95, exif=exif.tobytes())
    assert sniff_image(data) == fmt
    out = load_image(data)
    assert out.size == (64, 32) and out.getpixel((1, 1))[0] > 200 and out.getpixel((1, 1))[1] < 60
    assert abs(out.getpixel((40, 20))[0] - 128) < 10
    turned = load_image(rotated)  # displayed orientation: the stored top-left lands top-right, once
    assert turned.size == (32, 64) and turned.getpixel((30, 1))[0] > 200 and turned.getpixel((1, 1))[0] < 200
    assert np.array_equal(np.asarray(load_image(data, isolate=True)), np.asarray(out))
    limits = MediaLimits(max_image_pixels=64 * 32 - 1)
    with pytest.raises(MediaTooLargeError):
        load_image(data, limits)
    with pytest.raises((MediaTooLargeError, CorruptMediaError)):  # libheif/libavif may refuse the lie first
        load_image(_set_ispe(data, 40000, 40000))


def test_iso_media_brands():
    heic_mif1 = b"\x00\x00\x00\x18ftypmif1\x00\x00\x00\x00mif1heic"
    avif_mif1 = b"\x00\x00\x00\x1cftypmif1\x00\x00\x00\x00mif1avifmiaf"
    from vl.processing.image_formats import sniff_format

    assert sniff_format(heic_mif1 + bytes(40)) == "HEIF" and sniff_format(avif_mif1 + bytes(40)) == "AVIF"
    for video in (b"\x00\x00\x00\x18ftypisom\x00\x00\x02\x00isomiso2", b"\x00\x00\x00\x14ftypqt  \x00\x00\x00\x00qt  ",
                  b"\x00\x00\x00\x18ftypcrx \x00\x00\x00\x01crx isom"):
        with pytest.raises(UnsupportedFormatError, match="MP4/MOV video"):
            sniff_format(video + bytes(40))


# --- sniff_image: every check that needs no pixel decoded ---------------------------------------------------


def test_sniff_image_refuses_what_decoding_refuses_without_decoding(tmp_path, monkeypatch):
    jpeg = encode(noise_image(64, 48), "JPEG", comment=b"\xff\xd9 an EOI lookalike in a header segment")
    cases = {
        "truncated jpeg": (jpeg[:-2], CorruptMediaError),  # the end-of-image marker is gone
        "jpeg cut in its headers": (jpeg[:40], CorruptMediaError),
        "png bad crc": (_flip(encode(noise_image(8, 8), "PNG"), 29), CorruptMediaError),
        "header bomb": (png_header_only(40000, 40000), MediaTooLargeError),
        "eps": (_EPS, UnsupportedFormatError),
        "tiff zstd": (encode(noise_image(8, 8), "TIFF", compression="zstd"), UnsupportedFormatError),
    }
    for name, (data, error) in cases.items():
        with pytest.raises(error):
            decode_image_bytes(data)  # what the model's processor says, for reference
        path = tmp_path / f"{name}.jpg"
        path.write_bytes(data)
        monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self: pytest.fail("sniff_image decoded pixels"))
        with pytest.raises(error):
            sniff_image(str(path))
        monkeypatch.undo()
    with pytest.raises(CorruptMediaError, match="cannot read"):
        sniff_image(str(tmp_path / "missing.png"))
    trailing = jpeg + b"phone maker's trailer after EOI"
    assert sniff_image(trailing) == "JPEG" and load_image(trailing).size == (64, 48)


@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "isolated"])
def test_phone_and_scanner_files_through_the_processor_next_to_png(tmp_path, isolate):
    """One message with a HEIC photo, a TIFF scan (as files named .jpg), an AVIF, an RLE BMP and a PNG: each gives
    the same tiles as the same picture sent as PNG (lossless codecs) or as its own decode (lossy ones), twice."""
    import vl
    from tiny_models import make_tiny_vl_dir

    proc = vl.load_processor(make_tiny_vl_dir(tmp_path / "model"))
    proc.isolate, proc.limits = isolate, MediaLimits(max_images=5)
    picture = corner_marked(96, 48)
    files = {"scan.jpg": encode(picture, "TIFF", compression="tiff_lzw"), "photo.jpg": encode_heif(picture),
             "a.avif": encode(picture, "AVIF"), "b.bmp": bmp_rle(7, 3, _PALETTE, _RLE4_STREAM),
             "c.png": encode(picture, "PNG")}
    parts = []
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        parts.append({"type": "image", "image": str(tmp_path / name)})
    cfg = proc.config
    for _ in range(2):
        out = proc([{"role": "user", "content": parts + [{"type": "text", "text": "what differs?"}]}])
        assert [i.kind for i in out.media] == ["image"] * 5
        expected = [preprocess_image(decode_image_bytes(d), norm_mean=cfg.norm_mean, norm_std=cfg.norm_std,
                                     tile_size=cfg.force_image_size, max_num_tiles=cfg.max_num_tiles,
                                     use_thumbnail=cfg.use_thumbnail).pixel_values for d in files.values()]
        assert torch.equal(out.pixel_values, torch.cat(expected))
    png = preprocess_image(files["c.png"], norm_mean=cfg.norm_mean, norm_std=cfg.norm_std,
                           tile_size=cfg.force_image_size, max_num_tiles=cfg.max_num_tiles,
                           use_thumbnail=cfg.use_thumbnail).pixel_values
    assert torch.equal(expected[0], png)  # LZW TIFF is lossless: the scan gives the PNG's tiles exactly
