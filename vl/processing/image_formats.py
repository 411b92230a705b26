"""What may reach Pillow on the image path: formats by their bytes, the structure checked before decoding, TIFF
codecs, the HEIF plugin, and the BMP RLE decoder Pillow gets wrong.

- Format from magic bytes, never the file name (docs/reliability_policy.md §1.1): PNG, JPEG (incl. MPO), GIF, WEBP,
  BMP, TIFF, and ISO-BMFF still images by their `ftyp` brands (ISO/IEC 23008-12 Annex B for HEIF, the AV1 Image
  File Format §8 for AVIF; `video_formats.py` refuses the same brands on the video path). AVIF goes to Pillow's own
  plugin (libavif), HEIC/HEIF to pillow-heif's (libheif + libde265), registered with Pillow the first time a HEIF
  file is opened. EPS (would run Ghostscript), PDF (goes to documents.py), JPEG 2000, PSD, ICO, SVG, MP4 are refused.
- Structure before any pixel: every PNG chunk with its CRC up to IEND (Pillow checks header chunks only); JPEG
  marker segments up to the first scan and an end-of-image marker after it (what strict decoding requires).
- TIFF: the first IFD only (no seek: a multi-page file gives page 1, like frame 0 of a GIF); the compressions that
  scanners and cameras write. Old-style JPEG (6), the LogLuv/ThunderScan/RLE-word codecs, LZMA, ZSTD and WebP-in-
  TIFF are refused: rare in real files, and the less-used libtiff codecs are where its crash history is.
- BMP BI_RLE4/BI_RLE8 (Microsoft, "Bitmap Compression"): Pillow 12.3 reads an odd-length absolute run of 4-bit
  RLE as one pixel short, which shifts the rest of the row (a scrambled picture returned as OK), and refuses a
  file that ends its bitmap early with the end-of-bitmap escape. `decode_bmp_rle` decodes both variants by the
  spec; pixels the stream skips (delta, early end of line or bitmap) are palette index 0, as Pillow fills them.
"""

import struct
import zlib

from PIL import AvifImagePlugin, Image

from vl.errors import CorruptMediaError, UnsupportedFormatError

try:  # ~8 ms, and registers nothing with Pillow until prepare_plugin asks it to
    import pillow_heif
except ImportError:  # a dependency; without it HEIC is refused with a message, everything else works
    pillow_heif = None

ALLOWED_FORMATS = ("PNG", "JPEG", "GIF", "WEBP", "BMP", "TIFF", "HEIF", "AVIF")

# TiffImagePlugin.COMPRESSION_INFO names of the codecs decoded (Pillow names codes 8 and 32946 both deflate)
TIFF_COMPRESSIONS = frozenset({
    "raw", "packbits", "tiff_lzw", "tiff_adobe_deflate", "tiff_deflate", "jpeg", "group3", "group4", "tiff_ccitt",
})

_AVIF_BRANDS = {b"avif", b"avis"}
_HEIF_BRANDS = {b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx"}
_GENERIC_IMAGE_BRANDS = {b"mif1", b"msf1", b"mif2", b"miaf"}  # structural brands: the coding brand follows

# (prefix test, name) for formats we recognize in order to refuse them with a precise message
_REFUSED_SIGNATURES = (
    (lambda b: b.startswith(b"%PDF"), "PDF (send it as a document, not an image)"),
    (lambda b: b.startswith((b"%!PS", b"\xc5\xd0\xd3\xc6")), "PostScript/EPS"),
    (lambda b: b.startswith((b"\x00\x00\x00\x0cjP  ", b"\xff\x4f\xff\x51")), "JPEG 2000"),
    (lambda b: b[4:8] == b"ftyp", "ISO media that is no HEIC/AVIF still image (an MP4/MOV video? send it as a video)"),
    (lambda b: b.startswith(b"8BPS"), "Photoshop PSD"),
    (lambda b: b.startswith(b"\x00\x00\x01\x00"), "ICO"),
    (lambda b: b.lstrip()[:5].lower() in (b"<?xml", b"<svg "), "SVG/XML"),
)


def sniff_format(data: bytes) -> str:
    """Return the Pillow format name for `data`'s magic bytes, or raise UnsupportedFormatError."""
    head = bytes(data[:64])
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if head.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "GIF"
    if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        return "WEBP"
    if head.startswith(b"BM"):
        return "BMP"
    if head.startswith((b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")):  # classic and BigTIFF
        return "TIFF"
    if head[4:8] == b"ftyp" and (iso := _iso_image_format(head)):
        return iso
    if not head:
        raise UnsupportedFormatError(f"expected image bytes, found an empty file; send one of {', '.join(ALLOWED_FORMATS)}.")
    what = next((name for test, name in _REFUSED_SIGNATURES if test(head)), "unrecognized bytes")
    raise UnsupportedFormatError(
        f"expected one of {', '.join(ALLOWED_FORMATS)} (by content, not file name), found {what}; "
        "convert the image to PNG or JPEG."
    )


def _iso_image_format(head: bytes) -> str | None:
    """"AVIF" or "HEIF" from an `ftyp` box (major brand, then compatible brands after a structural major brand)."""
    major = head[8:12]
    end = min(int.from_bytes(head[:4], "big"), len(head))
    compatible = {head[k:k + 4] for k in range(16, end - 3, 4)}
    if major in _AVIF_BRANDS or (major in _GENERIC_IMAGE_BRANDS and compatible & _AVIF_BRANDS):
        return "AVIF"
    if major in _HEIF_BRANDS or major in _GENERIC_IMAGE_BRANDS:  # generic only: libheif tells the coding itself
        return "HEIF"
    return None


def check_structure(fmt: str, data: bytes) -> None:
    if fmt == "PNG":
        check_png_chunks(data)
    elif fmt == "JPEG":
        check_jpeg_markers(data)


def check_png_chunks(data: bytes) -> None:
    """Strict PNG structure: every chunk complete with a matching CRC, up to IEND.

    Pillow checks the CRC of header chunks only and never reads IEND for frame 0, so a PNG with a flipped
    IDAT CRC or a missing last byte would otherwise decode silently (docs/reliability_policy.md row I4).
    """
    pos, end = 8, len(data)
    while True:
        if pos + 12 > end:
            raise CorruptMediaError("the PNG file is truncated (it ends before its IEND chunk); re-save the file.")
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        if length > end - pos - 12:
            raise CorruptMediaError(
                f"the PNG file is truncated inside its {kind[:4]!r} chunk ({length} bytes declared); re-save it."
            )
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        if zlib.crc32(data[pos + 4 : pos + 8 + length]) != crc:
            raise CorruptMediaError(f"the PNG {kind[:4]!r} chunk has a bad CRC (corrupt file); re-save the file.")
        if kind == b"IEND":
            return
        pos += 12 + length


_JPEG_STANDALONE = {0x01} | set(range(0xD0, 0xD8))  # TEM, RST0-7: markers without a length


def check_jpeg_markers(data: bytes) -> None:
    """JPEG (ITU-T T.81 §B.1): length-prefixed marker segments from SOI to the first SOS, then an EOI somewhere after
    it. Inside entropy-coded data every 0xFF byte is stuffed (FF 00) or a restart marker, so the first FF D9 after
    the scan header is a real EOI; data after it (MPO frames, phone trailers) is allowed, as decoders allow it."""
    pos, end = 2, len(data)
    while True:
        if pos + 4 > end:
            raise CorruptMediaError("the JPEG file is truncated (it ends inside its headers); re-save the file.")
        if data[pos] != 0xFF:
            raise CorruptMediaError(f"the JPEG file is corrupt (no marker at byte {pos} of its headers); re-save it.")
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in _JPEG_STANDALONE:
            pos += 2
            continue
        if marker == 0xD9:
            raise CorruptMediaError("the JPEG file ends before its image data (EOI before any scan); re-save it.")
        (length,) = struct.unpack(">H", data[pos + 2 : pos + 4])
        if length < 2 or pos + 2 + length > end:
            raise CorruptMediaError("the JPEG file is truncated inside a header segment; re-save the file.")
        pos += 2 + length
        if marker == 0xDA:  # SOS: entropy-coded data follows
            break
    if data.find(b"\xff\xd9", pos) < 0:
        raise CorruptMediaError("the JPEG file is truncated (no end-of-image marker after its data); re-save it.")


def check_tiff(im: Image.Image) -> None:
    compression = im.info.get("compression", "raw")
    if compression not in TIFF_COMPRESSIONS:
        raise UnsupportedFormatError(
            f"expected a TIFF compressed with one of {', '.join(sorted(TIFF_COMPRESSIONS))}, found {compression!r}; "
            "re-save it as an LZW or Deflate TIFF, or as PNG."
        )


def prepare_plugin(fmt: str) -> None:
    """Make sure Pillow can open `fmt`: pillow-heif's plugin registered (once) for HEIF, libavif present for AVIF."""
    if fmt == "HEIF" and "HEIF" not in Image.OPEN:
        if pillow_heif is None:
            raise UnsupportedFormatError(
                "HEIC/HEIF images need the pillow-heif package, which is not installed here; "
                "`pip install pillow-heif`, or convert the image to JPEG."
            )
        pillow_heif.register_heif_opener(thumbnails=False, depth_images=False, aux_images=False)
    elif fmt == "AVIF":
        if not AvifImagePlugin.SUPPORTED:
            raise UnsupportedFormatError(
                "AVIF images need a Pillow built with libavif (Pillow >= 11.2 wheels have it); convert it to JPEG."
            )


# --- BMP RLE ---------------------------------------------------------------------------------------------------

_HIGH = bytes(b >> 4 for b in range(256))
_LOW = bytes(b & 15 for b in range(256))


def _nibbles(packed: bytes) -> bytearray:
    out = bytearray(2 * len(packed))
    out[0::2] = packed.translate(_HIGH)
    out[1::2] = packed.translate(_LOW)
    return out


def decode_bmp_rle(data: bytes, offset: int, size: tuple[int, int], rle4: bool, bottom_up: bool) -> bytearray:
    """The BI_RLE4 / BI_RLE8 stream at `data[offset:]` -> width * height palette indices, top row first.

    Byte pairs (count, value): count > 0 repeats `value` count times (RLE4: its two nibbles alternate, high first);
    count 0 escapes: 0 end of line, 1 end of bitmap, 2 delta (next two bytes: right, up), n >= 3 an absolute run of
    n pixels (RLE4: n nibbles, high first) padded to 16 bits. Runs past the row end are clipped. Work is bounded by
    the stream: every step reads at least two bytes and writes at most 255 pixels.
    """
    width, height = size
    out = bytearray(width * height)
    pos, end, x, y = offset, len(data), 0, 0  # y counts rows in stream order

    def put(pixels) -> None:
        if y < height and x < width:
            n = min(len(pixels), width - x)
            start = (height - 1 - y if bottom_up else y) * width + x
            out[start:start + n] = pixels[:n]

    while y < height:
        if pos + 2 > end:
            if y == height - 1 and x >= width:  # the last row is complete; only the end marker is missing
                break
            raise CorruptMediaError("the RLE-compressed BMP is truncated (it ends before its end-of-bitmap marker); "
                                    "re-save the file.")
        count, value = data[pos], data[pos + 1]
        pos += 2
        if count:
            put((bytes((value >> 4, value & 15)) * ((count + 1) // 2))[:count] if rle4 else bytes((value,)) * count)
            x += count
        elif value == 0:
            x, y = 0, y + 1
        elif value == 1:
            break
        elif value == 2:
            if pos + 2 > end:
                raise CorruptMediaError("the RLE-compressed BMP is truncated inside a delta; re-save the file.")
            x, y, pos = x + data[pos], y + data[pos + 1], pos + 2
        else:
            nbytes = (value + 1) // 2 if rle4 else value
            if pos + nbytes > end:
                raise CorruptMediaError("the RLE-compressed BMP is truncated inside a run; re-save the file.")
            packed = data[pos:pos + nbytes]
            put(_nibbles(packed)[:value] if rle4 else packed)
            x += value
            pos += nbytes + (nbytes & 1)
    return out


def bmp_rle_image(im: Image.Image, data: bytes) -> Image.Image | None:
    """The picture of a lazily opened RLE BMP, decoded by `decode_bmp_rle`; None for any other BMP."""
    tile = im.tile[0] if len(im.tile) == 1 else None
    if tile is None or tile.codec_name != "bmp_rle":
        return None
    _, rle4, direction = tile.args  # BmpImagePlugin: (rawmode, is RLE4, -1 for bottom-up rows)
    indices = decode_bmp_rle(data, tile.offset, im.size, rle4, bottom_up=direction == -1)
    if im.mode == "P":
        out = Image.frombytes("P", im.size, bytes(indices))
        out.putpalette(im.palette.palette, im.palette.rawmode)
        return out
    if im.mode == "1":  # a black/white palette: index 1 is white
        return Image.frombytes("L", im.size, bytes(indices).translate(bytes([0] + [255] * 255)))
    return Image.frombytes("L", im.size, bytes(indices))  # "L": a grey palette whose index i is grey level i
