"""Untrusted image bytes -> RGB picture -> normalized 512 px tiles (+ thumbnail), as Nemotron Nano V2 VL wants.

Follows docs/format.md §4.2 (InternVL `dynamic_preprocess`: grid search over 1..max_num_tiles with the
area tie-break, whole-image resize ignoring aspect ratio, row-major tiles, thumbnail last and only when there is
more than one tile) and §4.1 (normalization `(x/255 - mean)/std` with the checkpoint's `norm_mean/norm_std`,
always passed in, never defaulted here). Safe opening follows docs/reliability_policy.md §1.1:

- byte cap before Pillow sees the data; format by magic bytes, then `Image.open(formats=[that one])`;
  allowlist PNG, JPEG (incl. its MPO variant, frame 0 only), GIF, WEBP, BMP, TIFF (page 1), HEIC/HEIF and AVIF;
  EPS (would run Ghostscript), PDF (goes to documents.py), JPEG 2000, ICO, PSD are refused. What each format may
  be, and the structure checked before decoding, is in image_formats.py; `sniff_image` runs every check that
  needs no pixel decoded (a cheap early refusal, e.g. before a model loads);
- pixel cap from the header (`Image.open` is lazy) before `.load()`: min(limits.max_image_pixels,
  `Image.MAX_IMAGE_PIXELS`), so anything Pillow would only warn about (DecompressionBombWarning) is refused
  too; zero-sized images (which Pillow's own bomb check skips) are refused as corrupt;
- strict truncation: `ImageFile.LOAD_TRUNCATED_IMAGES` must be False (a global another library may flip);
- first frame only (never `seek()`; that was the MPO/DCX bomb-check bypass);
- EXIF orientation applied by hand (values 1..8); unreadable EXIF or other values keep the image un-rotated and
  log a warning, because `ImageOps.exif_transpose` raises a different exception type per EXIF defect;
- modes to RGB: alpha (RGBA, LA, La, PA, P with transparency) and colour keys (PNG tRNS in RGB/greyscale
  images) composited over WHITE (vLLM's default `rgba_background_color`); CMYK by Pillow's naive conversion
  (no ICC); 16-/32-bit greyscale (`I;16*`, `I`) scaled to 8 bit by 1/257 (plain `convert` would clip them to
  white); `1` -> black/white; `F` clipped to 0..255.

Resampling: one choice, PIL bicubic on uint8 (HF-remote revision 1 of `image_processing.py` uses PIL
`resize` bicubic; PIL's bicubic widens its kernel when downscaling, i.e. it is antialiased like vLLM's
`F.interpolate(bicubic, antialias=True)`). tests/processing/test_images.py measures the difference to the
torchvision path of transformers' GotOcr2 processor.
"""

import io
import logging
import os
import struct
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageFile, UnidentifiedImageError

from vl.errors import (
    ConfigError,
    CorruptMediaError,
    MediaTooLargeError,
    RemoteMediaError,
    UnsupportedFormatError,
    VLError,
)
from vl.processing.image_formats import (
    ALLOWED_FORMATS,  # noqa: F401 - re-exported: the allowlist as callers of this module read it
    bmp_rle_image,
    check_structure,
    check_tiff,
    prepare_plugin,
    sniff_format,
)
from vl.processing.limits import DEFAULT_LIMITS, MediaLimits
from vl.processing.sandbox import run_isolated

logger = logging.getLogger(__name__)

BACKGROUND_RGB = (255, 255, 255)  # alpha is composited over white
RESAMPLE = Image.Resampling.BICUBIC

# Pillow's fuzzers accept exactly these as outcomes of garbage input (docs/reliability_policy.md §1.1), plus the
# bomb error (a plain Exception subclass), UnidentifiedImageError (an OSError) and pillow-heif's RuntimeError.
_PILLOW_ERRORS = (
    OSError,
    SyntaxError,
    ValueError,
    NotImplementedError,
    OverflowError,
    IndexError,
    TypeError,
    KeyError,
    ZeroDivisionError,
    struct.error,
    EOFError,
    Image.DecompressionBombError,
    Image.DecompressionBombWarning,
    RuntimeError,  # pillow-heif's form of libheif errors (allocation, libheif's own security limits)
)

def read_bytes(source, max_bytes: int, what: str = "image") -> bytes:
    """Bytes of `source` (bytes-like, local path or binary file object), refusing more than `max_bytes`
    before reading them all. URL-like strings are refused: fetching is the caller's decision (docs/reliability_policy.md §1.2)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
    elif isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        if isinstance(text, str) and text.split(":", 1)[0].lower() in ("http", "https", "ftp", "data", "file"):
            raise RemoteMediaError(
                f"expected {what} bytes or a local file, found a URL ({text[:40]!r}...); download it yourself "
                "and pass the bytes."
            )
        try:
            size = os.stat(text).st_size
            if size > max_bytes:
                raise MediaTooLargeError(_too_many_bytes(what, size, max_bytes))
            with open(text, "rb") as f:
                data = f.read(max_bytes + 1)
        except OSError as e:  # missing, a directory, no permission, name too long, ...
            raise CorruptMediaError(f"cannot read the {what} file: {e.strerror}; check the path.") from None
    elif hasattr(source, "read"):
        data = source.read(max_bytes + 1)
    else:
        raise TypeError(f"expected bytes, a path or a binary file object for the {what}, found {type(source)}")
    if len(data) > max_bytes:
        raise MediaTooLargeError(_too_many_bytes(what, len(data), max_bytes))
    return data


def _too_many_bytes(what, size, cap):
    shown = f"{size} bytes" if size <= cap + 1 else f"{size / 2**20:.1f} MiB"
    return f"the {what} is larger than the {cap / 2**20:.1f} MiB cap (found {shown}); send a smaller file."


def pixel_cap(limits: MediaLimits) -> int:
    bomb = Image.MAX_IMAGE_PIXELS
    return limits.max_image_pixels if bomb is None else min(limits.max_image_pixels, int(bomb))


def check_size(width: int, height: int, limits: MediaLimits) -> None:
    if width <= 0 or height <= 0:
        raise CorruptMediaError(f"expected an image with positive width and height, found {width}x{height}.")
    cap = pixel_cap(limits)
    if width * height > cap:
        raise MediaTooLargeError(
            f"image too large: {width}x{height} = {width * height:,} pixels, the cap is {cap:,}; "
            "downscale it before sending."
        )


def load_image(source, limits: MediaLimits = DEFAULT_LIMITS, *, isolate: bool = False) -> Image.Image:
    """Decode an untrusted image (bytes, local path, file object, or a PIL image) to an RGB PIL image,
    EXIF orientation applied. `isolate=True` decodes in a sandbox worker (sandbox.py)."""
    if isinstance(source, Image.Image):
        check_size(*source.size, limits)
        return to_rgb(_apply_orientation(source))
    data = read_bytes(source, limits.max_image_bytes)
    if isolate:
        return run_isolated(
            decode_image_bytes, data, limits, timeout=limits.image_timeout_s, memory_mb=limits.worker_memory_mb
        )
    return decode_image_bytes(data, limits)


def decode_image_bytes(data: bytes, limits: MediaLimits = DEFAULT_LIMITS) -> Image.Image:
    with _opened(data, limits) as (fmt, im):
        if fmt == "PNG" and "transparency" in im.info and im.mode != "P":
            im.info["transparency"] = _png_key_in_decoded_scale(data, im.info["transparency"])
        if fmt == "BMP" and (rle := bmp_rle_image(im, data)) is not None:
            return to_rgb(rle)
        im.load()  # frame 0
        return to_rgb(_apply_orientation(im))


def sniff_image(source, limits: MediaLimits = DEFAULT_LIMITS) -> str:
    """The format of an untrusted image (a name in ALLOWED_FORMATS) after every check `decode_image_bytes` makes
    before it decodes a pixel: byte cap, format by content, PNG/JPEG structure, header size against the pixel cap,
    TIFF codec, HEIF/AVIF support. Raises the same typed errors. Meant for refusing a file early and cheaply (the
    CLI, before it loads a model); damage inside compressed pixel data is still found only by decoding."""
    data = read_bytes(source, limits.max_image_bytes)
    with _opened(data, limits) as (fmt, _):
        return fmt


@contextmanager
def _opened(data: bytes, limits: MediaLimits):
    """(format, lazily opened image) once every check before decoding has passed; Pillow's exceptions raised in
    the block (decoding included) come out as our typed errors."""
    if len(data) > limits.max_image_bytes:
        raise MediaTooLargeError(_too_many_bytes("image", len(data), limits.max_image_bytes))
    fmt = sniff_format(data)
    check_structure(fmt, data)
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        raise ConfigError(
            "PIL.ImageFile.LOAD_TRUNCATED_IMAGES is True (process-global, set by some library); untrusted "
            "truncated images would decode as partly grey pictures. Set it back to False."
        )
    prepare_plugin(fmt)
    try:
        with Image.open(io.BytesIO(data), formats=[fmt]) as im:
            check_size(*im.size, limits)  # header only: nothing is decoded yet
            if fmt == "TIFF":
                check_tiff(im)
            yield fmt, im
    except VLError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise MediaTooLargeError(f"image too large: {e}; downscale it before sending.") from None
    except UnidentifiedImageError:
        raise CorruptMediaError(f"the bytes start like a {fmt} file but Pillow cannot read its header.") from None
    except MemoryError:
        raise MediaTooLargeError("decoding the image ran out of memory; send a smaller image.") from None
    except _PILLOW_ERRORS as e:
        raise CorruptMediaError(
            f"the {fmt} image is truncated or corrupt ({type(e).__name__}: {str(e)[:200]}); re-save the file."
        ) from None


_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


def _apply_orientation(im: Image.Image) -> Image.Image:
    """Rotate/flip by EXIF Orientation (tag 0x0112). Malformed EXIF keeps the image as stored, with a warning."""
    try:
        orientation = im.getexif().get(0x0112, 1)
    except _PILLOW_ERRORS as e:
        logger.warning("unreadable EXIF (%s: %.100s); image kept un-rotated", type(e).__name__, e)
        return im
    if orientation == 1:
        return im
    if not isinstance(orientation, int) or orientation not in _TRANSPOSE:
        logger.warning("EXIF orientation %.40r is not one of 1..8; image kept un-rotated", orientation)
        return im
    return im.transpose(_TRANSPOSE[orientation])


_ALPHA_MODES = ("RGBA", "LA", "La", "RGBa", "PA")


def to_rgb(im: Image.Image) -> Image.Image:
    """Any Pillow mode -> RGB by the policy in the module docstring.

    A colour key (PNG `tRNS` in a truecolour or greyscale image, PNG spec §11.3.2.1: pixels equal to that one
    colour/grey level are fully transparent; Pillow keeps it in `info["transparency"]`) is composited over white
    like an alpha channel; palette transparency goes through Pillow's own P -> RGBA conversion below.
    """
    if im.mode != "P" and im.mode not in _ALPHA_MODES and "transparency" in im.info:
        mask = _colour_key_mask(im, im.info["transparency"])
        if mask is not None:
            plain = im.copy()
            plain.info.pop("transparency", None)
            rgb = np.array(_to_rgb_opaque(plain))  # (H, W, 3)
            rgb[mask] = BACKGROUND_RGB
            return Image.fromarray(rgb, "RGB")
    return _to_rgb_opaque(im)


def _png_key_in_decoded_scale(data: bytes, key):
    """A PNG tRNS key is stored at the file's bit depth (PNG spec §11.3.2.1); Pillow scales the pixels of 2- and
    4-bit greyscale up to 0..255 and keeps only the high byte of 16-bit RGB, but leaves the key as stored.
    Bring the key to the decoded pixels' scale (for 16-bit RGB this compares high bytes: as close as 8-bit
    pixels allow). IHDR is the first chunk: bit depth at byte 24, colour type at byte 25."""
    depth, colour_type = data[24], data[25]
    if colour_type == 0 and depth in (2, 4) and isinstance(key, int):
        return key * (255 // (2**depth - 1))
    if colour_type == 2 and depth == 16 and isinstance(key, tuple):
        return tuple(v >> 8 if isinstance(v, int) else v for v in key)
    return key


def _colour_key_mask(im: Image.Image, key):
    """(H, W) bool mask of the pixels equal to the colour key, or None when the key does not fit the mode."""
    a = np.asarray(im)
    limit = 255 if im.mode in ("1", "L", "RGB") else 65535 if im.mode.startswith("I;16") else 2**31 - 1

    def fits(v) -> bool:
        return isinstance(v, int) and 0 <= v <= limit

    if im.mode == "RGB" and isinstance(key, tuple) and len(key) == 3 and all(fits(v) for v in key):
        mask = (a == np.asarray(key, dtype=a.dtype)).all(axis=-1)
    elif im.mode == "1" and fits(key):
        mask = a == bool(key)
    elif (im.mode in ("L", "I") or im.mode.startswith("I;16")) and fits(key):
        mask = a == key
    else:
        logger.warning("transparency key %.40r does not fit mode %s; image kept opaque", key, im.mode)
        return None
    return mask if mask.shape == (im.height, im.width) else None


def _to_rgb_opaque(im: Image.Image) -> Image.Image:
    mode = im.mode
    if mode == "RGB":  # copy a file-backed image: closing the file would invalidate it
        return im.copy() if isinstance(im, ImageFile.ImageFile) else im
    if mode == "P":
        im = im.convert("RGBA" if "transparency" in im.info else "RGB")
        mode = im.mode
        if mode == "RGB":
            return im
    if mode in ("RGBA", "LA", "La", "RGBa", "PA"):
        rgba = im.convert("RGBA") if mode != "La" else im.convert("LA").convert("RGBA")
        background = Image.new("RGBA", rgba.size, BACKGROUND_RGB + (255,))
        return Image.alpha_composite(background, rgba).convert("RGB")
    if mode.startswith("I;16") or mode == "I":
        a = np.asarray(im).astype(np.float64)
        a = np.clip(np.rint(a / 257.0), 0, 255).astype(np.uint8)  # 65535 -> 255
        return Image.fromarray(a, "L").convert("RGB")
    if mode == "F":
        a = np.clip(np.rint(np.asarray(im, dtype=np.float64)), 0, 255).astype(np.uint8)
        return Image.fromarray(a, "L").convert("RGB")
    if mode in ("1", "L", "CMYK", "YCbCr", "LAB", "HSV"):
        return im.convert("RGB")
    raise UnsupportedFormatError(f"expected an RGB-convertible image mode, found {mode!r}; re-save as RGB PNG.")


# --- tiling ----------------------------------------------------------------------------------------


def find_grid(width: int, height: int, max_num_tiles: int = 12, tile_size: int = 512) -> tuple[int, int]:
    """(cols, rows) of the tile grid for a `width` x `height` image (docs/format.md §4.2).

    Candidates: every (i, j) with 1 <= i*j <= max_num_tiles, by increasing tile count. The closest aspect ratio
    wins; on an exact tie the later (larger) grid wins only if the image area exceeds half the grid's pixel area.
    Within one tile count the candidate order never changes the result (checked against the set-ordered
    reference in the tests), so it is fixed here as (count, cols).
    """
    if max_num_tiles < 1:
        raise ValueError(f"max_num_tiles must be >= 1, found {max_num_tiles}")
    candidates = sorted(
        ((i, j) for i in range(1, max_num_tiles + 1) for j in range(1, max_num_tiles // i + 1)),
        key=lambda g: (g[0] * g[1], g[0]),
    )
    aspect = width / height
    best, best_diff = (1, 1), float("inf")
    for i, j in candidates:
        diff = abs(aspect - i / j)
        if diff < best_diff:
            best, best_diff = (i, j), diff
        elif diff == best_diff and width * height > 0.5 * tile_size * tile_size * i * j:
            best = (i, j)
    return best


def tile_uint8(
    image: Image.Image, tile_size: int = 512, max_num_tiles: int = 12, use_thumbnail: bool = True
) -> tuple[np.ndarray, tuple[int, int]]:
    """RGB PIL image -> (uint8 tiles (N, S, S, 3), (cols, rows)); thumbnail last when cols*rows > 1."""
    cols, rows = find_grid(image.width, image.height, max_num_tiles, tile_size)
    size = (cols * tile_size, rows * tile_size)
    resized = image if image.size == size else image.resize(size, RESAMPLE)
    a = np.asarray(resized)  # (rows*S, cols*S, 3)
    tiles = a.reshape(rows, tile_size, cols, tile_size, 3).transpose(0, 2, 1, 3, 4)
    tiles = tiles.reshape(rows * cols, tile_size, tile_size, 3)  # row-major
    if use_thumbnail and rows * cols > 1:
        thumb = np.asarray(image.resize((tile_size, tile_size), RESAMPLE))
        tiles = np.concatenate([tiles, thumb[None]], axis=0)
    return np.ascontiguousarray(tiles), (cols, rows)


def normalize(tiles_uint8: np.ndarray, norm_mean, norm_std):
    """uint8 (N, H, W, 3) -> float32 tensor (N, 3, H, W) = (x/255 - mean)/std, per channel.

    Inputs are uint8, so the formula is evaluated once per (channel, value) in float32 torch ops and the pixels
    are looked up: bit-identical to evaluating it per pixel, about 2x faster, and no float temporaries.
    """
    import torch

    mean = torch.as_tensor(norm_mean, dtype=torch.float32).flatten()
    std = torch.as_tensor(norm_std, dtype=torch.float32).flatten()
    if mean.numel() != 3 or std.numel() != 3 or bool((std <= 0).any()):
        raise ConfigError(f"norm_mean/norm_std must be 3 values each, std > 0; found {norm_mean}, {norm_std}")
    if tiles_uint8.dtype != np.uint8 or tiles_uint8.ndim != 4 or tiles_uint8.shape[-1] != 3:
        raise ValueError(f"expected uint8 (N, H, W, 3) pixels, found {tiles_uint8.dtype} {tiles_uint8.shape}")
    values = torch.arange(256, dtype=torch.float32).view(1, 256)
    table = ((values / 255.0 - mean.view(3, 1)) / std.view(3, 1)).numpy()  # (3, 256)
    n, h, w, _ = tiles_uint8.shape
    out = np.empty((n, 3, h, w), dtype=np.float32)  # contiguous NCHW
    for c in range(3):
        np.take(table[c], tiles_uint8[..., c], out=out[:, c])
    return torch.from_numpy(out)


@dataclass
class ImageTiles:
    pixel_values: "object"  # torch.FloatTensor (num_tiles, 3, S, S), thumbnail last if present
    grid: tuple[int, int]  # (cols, rows) of the tile grid, before the thumbnail
    has_thumbnail: bool
    image_size: tuple[int, int]  # (width, height) after EXIF orientation

    @property
    def num_tiles(self) -> int:
        return int(self.pixel_values.shape[0])


def decode_and_tile(data: bytes, limits: MediaLimits, tile_size: int, max_num_tiles: int, use_thumbnail: bool):
    """Decode + resize + crop, the CPU-heavy untrusted part; picklable result for the sandbox."""
    image = decode_image_bytes(data, limits)
    tiles, grid = tile_uint8(image, tile_size, max_num_tiles, use_thumbnail)
    return tiles, grid, image.size


def preprocess_image(
    source,
    *,
    norm_mean,
    norm_std,
    tile_size: int = 512,
    max_num_tiles: int = 12,
    use_thumbnail: bool = True,
    limits: MediaLimits = DEFAULT_LIMITS,
    isolate: bool = False,
) -> ImageTiles:
    """Untrusted image -> `ImageTiles` ready for the vision tower (one call per `<image>`).

    `norm_mean`/`norm_std` come from the checkpoint (config / preprocessor_config), never from here.
    `isolate=True` runs decode, resize and crop in a sandbox worker; normalization stays in this process.
    """
    if isinstance(source, Image.Image):
        image = load_image(source, limits)
        tiles, grid = tile_uint8(image, tile_size, max_num_tiles, use_thumbnail)
        size = image.size
    else:
        data = read_bytes(source, limits.max_image_bytes)
        if isolate:
            tiles, grid, size = run_isolated(
                decode_and_tile, data, limits, tile_size, max_num_tiles, use_thumbnail,
                timeout=limits.image_timeout_s, memory_mb=limits.worker_memory_mb,
            )
        else:
            tiles, grid, size = decode_and_tile(data, limits, tile_size, max_num_tiles, use_thumbnail)
    pixel_values = normalize(tiles, norm_mean, norm_std)  # (N, 3, S, S)
    return ImageTiles(pixel_values, grid, tiles.shape[0] > grid[0] * grid[1], tuple(size))
