"""What may reach FFmpeg on the video path: real video containers and codecs, one file, nothing it points to.

FFmpeg probes a file's format from its bytes and name, and some of its demuxers open other files: an HLS
playlist (`.m3u8`) or a concat list reads the files it names, `image2` decodes TIFF/TGA/DDS/PSD/JPEG 2000
still images, and MP4 data references (`dref`) can name external files. So the video path (docs/video.md,
"What the video path accepts"):

1. sniffs the container from its magic bytes (never the file name) against `CONTAINERS`, refusing still-image
   brands of ISO media (AVIF, HEIF, CR3) and everything else with `UnsupportedFormatError`;
2. opens the file with that demuxer forced (`format=`), so FFmpeg's own probe cannot pick a playlist, list or
   image demuxer; with `protocol_whitelist=file`, MP4 `enable_drefs=0`, and an `io_open` hook that lets
   libavformat open the top-level file and nothing else (every nested open is refused and reported);
3. decodes only the best video stream as libavformat picks it (`av_find_best_stream`, PyAV's
   `streams.best("video")`), and only if its codec is in `CODECS` and this FFmpeg has a decoder for it;
4. refuses encrypted files (`EncryptedMediaError`): MP4 Common Encryption (`encv`/`enca` sample entries, `pssh`
   boxes, packets with encryption side data) and Matroska/WebM ContentEncryption (the demuxer's `enc_key_id`).
   Without the key FFmpeg decodes them to garbage that differs from run to run, or fails part-way.

It also says which packets hold a displayed frame (`displayed`): VP8/VP9 hidden (alt-ref) frames are decoded for
reference and never shown, and some muxers store them in packets of their own.

decord opens files itself (no hooks), so it only ever sees files that passed 1-3 in PyAV first, and only
containers whose magic bytes no other FFmpeg demuxer outranks (video.py, `DECORD_CONTAINERS`).
"""

import math
import struct

from PIL import Image

from vl.errors import EncryptedMediaError, UnsupportedFormatError

# sniffed name -> FFmpeg demuxer forced at open
CONTAINERS = {
    "mp4": "mov",  # MP4 / QuickTime / 3GP
    "matroska": "matroska",  # MKV / WebM
    "avi": "avi",
    "mpegts": "mpegts",  # MPEG-TS / M2TS
    "mpeg-ps": "mpeg",  # MPEG program stream (.mpg, .vob)
    "ogg": "ogg",
    "flv": "flv",
}
# decoders of real video codecs (FFmpeg codec names); still-image decoders (png, tiff, jpeg2000, dds, ...) are
# deliberately absent even when a container carries them
CODECS = frozenset({
    "h264", "hevc", "av1", "vp8", "vp9", "mpeg1video", "mpeg2video", "mpeg4", "msmpeg4v2", "msmpeg4v3",
    "h263", "flv1", "theora", "vc1", "wmv3", "mjpeg", "prores", "dnxhd",
})
_IMAGE_BRANDS = {b"avif", b"avis", b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx", b"mif1", b"msf1",
                 b"mif2", b"crx ", b"jp2 ", b"jpx "}
_QUICKTIME_FIRST_ATOMS = {b"ftyp", b"moov", b"mdat", b"free", b"wide", b"skip", b"pnot"}


def sniff_container(head: bytes) -> str:
    """Container name (a key of CONTAINERS) from the first bytes of a file, or UnsupportedFormatError."""
    if len(head) >= 12 and head[4:8] in _QUICKTIME_FIRST_ATOMS:
        if head[4:8] == b"ftyp" and head[8:12] in _IMAGE_BRANDS:
            raise UnsupportedFormatError(
                f"expected a video, found a still image in ISO media (brand {head[8:12].decode('latin-1')!r}, "
                "e.g. AVIF/HEIF); send it as an image in PNG or JPEG."
            )
        return "mp4"
    if head.startswith(b"\x1a\x45\xdf\xa3"):
        return "matroska"
    if head.startswith(b"RIFF") and head[8:12] == b"AVI ":
        return "avi"
    if _ts_sync(head, 0, 188) or _ts_sync(head, 4, 192):
        return "mpegts"
    if head.startswith(b"\x00\x00\x01\xba"):
        return "mpeg-ps"
    if head.startswith(b"OggS"):
        return "ogg"
    if head.startswith(b"FLV\x01"):
        return "flv"
    what = _describe_head(head)
    raise UnsupportedFormatError(
        f"expected a video container (MP4/MOV, MKV/WebM, AVI, MPEG-TS, MPEG-PS, Ogg, FLV, by content), found "
        f"{what}; re-encode the video to MP4 (H.264)."
    )


def _ts_sync(head: bytes, offset: int, packet: int) -> bool:
    """MPEG-TS: the sync byte 0x47 at the start of three consecutive packets."""
    return len(head) >= offset + 2 * packet + 1 and all(head[offset + k * packet] == 0x47 for k in range(3))


def _describe_head(head: bytes) -> str:
    if not head:
        return "an empty file"
    if head.lstrip()[:7] == b"#EXTM3U":
        return "an HLS playlist (playlists are never followed)"
    if head.startswith(b"ffconcat") or head.lstrip()[:5] == b"file ":
        return "an FFmpeg concat list (lists are never followed)"
    try:
        from vl.processing.images import sniff_format

        return f"a {sniff_format(head)} image"
    except UnsupportedFormatError as e:
        found = str(e).split("found ", 1)[-1].split(";", 1)[0]
        return found if found != "unrecognized bytes" else "unrecognized bytes"


def open_options(container: str) -> dict:
    """Demuxer options: only the file protocol; MP4 data references never followed."""
    options = {"protocol_whitelist": "file"}
    if container == "mp4":
        options["enable_drefs"] = "0"
    return options


class NestedOpenGuard:
    """`io_open` hook for av.open: libavformat may open `path` (the top-level file) and nothing else."""

    def __init__(self, path: str):
        self.path = path
        self.refused: list[str] = []

    def __call__(self, url: str, flags: int, options: dict):
        if url == self.path and not flags & 2:  # AVIO_FLAG_WRITE = 2
            return open(self.path, "rb")
        self.refused.append(str(url)[:200])
        raise PermissionError(f"nested open refused: {str(url)[:80]!r}")


def open_video(path: str):
    """av.open with the forced demuxer, protocol policy and nested-open guard; returns (container, name)."""
    import av

    with open(path, "rb") as f:
        head = f.read(4096)
    name = sniff_container(head)
    container = av.open(path, format=CONTAINERS[name], options=open_options(name), metadata_errors="ignore",
                        io_open=NestedOpenGuard(path))
    return container, name


def best_video_stream(container):
    """The stream FFmpeg itself would play (av_find_best_stream), or None."""
    if not container.streams.video:
        return None
    try:
        return container.streams.best("video")
    except Exception:  # noqa: BLE001 - defensive: a PyAV without best() behaves like "first video stream"
        return container.streams.video[0]


def check_codec(stream) -> str:
    ctx = stream.codec_context  # None when this FFmpeg has no decoder for the stream (e.g. an unknown codec id)
    codec = getattr(ctx, "codec", None)
    if codec is None:
        raise UnsupportedFormatError(
            f"expected a video codec this decoder supports ({', '.join(sorted(CODECS))}), found a video stream "
            "whose codec has no decoder here; re-encode the video to H.264."
        )
    name = codec.canonical_name
    if name not in CODECS:
        raise UnsupportedFormatError(
            f"expected a video codec ({', '.join(sorted(CODECS))}), found {name!r}; re-encode the video to H.264."
        )
    return name


# --- encryption ----------------------------------------------------------------------------------------

ENCRYPTED_MESSAGE = ("expected an unencrypted video, found an encrypted (DRM) one ({what}); without its key it "
                     "cannot be decoded; send the video without encryption.")
_MP4_CONTAINERS = {b"moov", b"trak", b"mdia", b"minf", b"stbl", b"moof", b"traf", b"sinf", b"schi"}
_MP4_ENCRYPTED = {b"encv": "an 'encv' sample entry", b"enca": "an 'enca' sample entry", b"pssh": "a 'pssh' box",
                  b"tenc": "a 'tenc' box", b"senc": "a 'senc' box"}
_MOOV_READ_CAP = 64 << 20  # the largest moov box read whole for the scan (a long file's tables; more is refused)


def check_not_encrypted(path: str, container: str, stream) -> None:
    """`EncryptedMediaError` for an encrypted file: the box structure of MP4 (`encryption_box`), the demuxer's
    `enc_key_id` for Matroska ContentEncryption. The index pass also refuses packets with encryption side data."""
    if "enc_key_id" in {k.lower() for k in (stream.metadata or {})}:
        raise EncryptedMediaError(ENCRYPTED_MESSAGE.format(what="Matroska ContentEncryption"))
    if container == "mp4":
        found = encryption_box(path)
        if found:
            raise EncryptedMediaError(ENCRYPTED_MESSAGE.format(what=f"MP4 Common Encryption: {found}"))


def encryption_box(path: str) -> str:
    """What in an MP4's `moov` (and the first `moof`) marks Common Encryption, "" when nothing does.

    ISO/IEC 23001-7: an encrypted track's sample entry is renamed `encv`/`enca` and carries `sinf/frma/schm/schi
    (tenc)`; `pssh` boxes carry the DRM systems' data; `senc` the per-sample IVs of fragments. Top-level boxes are
    walked by their headers, so the scan reads only `moov` and the first `moof`, not the media data."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        pos, seen_moof = 0, False
        while pos + 8 <= size:
            f.seek(pos)
            kind, body, length = _box_header(f, size - pos)
            if length <= 0:
                break
            if kind in (b"moov", b"moof") and not (kind == b"moof" and seen_moof):
                seen_moof = seen_moof or kind == b"moof"
                data = f.read(min(length - body, _MOOV_READ_CAP))
                found = _scan_boxes(data)
                if found:
                    return found
            pos += length
    return ""


def _box_header(f, left: int) -> tuple[bytes, int, int]:
    """(type, header length, box length) of the box at the file position; box length 0 when malformed."""
    head = f.read(8)
    if len(head) < 8:
        return b"", 8, 0
    length, kind = struct.unpack(">I4s", head)
    header = 8
    if length == 1:
        large = f.read(8)
        if len(large) < 8:
            return kind, 16, 0
        length, header = struct.unpack(">Q", large)[0], 16
    elif length == 0:
        length = left  # to the end of the file
    return kind, header, length if header <= length <= left else 0


def _scan_boxes(data: bytes, depth: int = 0) -> str:
    pos = 0
    while pos + 8 <= len(data) and depth < 12:
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        header = 8
        if length == 1 and pos + 16 <= len(data):
            length, header = struct.unpack(">Q", data[pos + 8 : pos + 16])[0], 16
        elif length == 0:
            length = len(data) - pos
        if length < header or pos + length > len(data):
            return ""
        if kind in _MP4_ENCRYPTED:
            return _MP4_ENCRYPTED[kind]
        body = data[pos + header : pos + length]
        if kind in _MP4_CONTAINERS:
            found = _scan_boxes(body, depth + 1)
        elif kind == b"stsd":  # full box (4 bytes) + entry count (4 bytes), then the sample entries
            found = _sample_entries(body[8:])
        else:
            found = ""
        if found:
            return found
        pos += length
    return ""


def _sample_entries(data: bytes) -> str:
    pos = 0
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        if kind in _MP4_ENCRYPTED:
            return _MP4_ENCRYPTED[kind]
        if length < 8:
            return ""
        pos += length
    return ""


# --- shown frames ---------------------------------------------------------------------------------------


def displayed(codec: str, packet) -> bool:
    """Whether decoding `packet` shows a frame. VP8/VP9 packets that hold only hidden (alt-ref) frames do not;
    every other codec's packets count as one frame each, as before."""
    if codec not in ("vp8", "vp9"):
        return True
    data = memoryview(packet)  # a PyAV packet or bytes; no copy
    if codec == "vp9":
        return any(_vp9_shown(frame) for frame in _vp9_superframe(data))
    return len(data) < 3 or bool(data[0] & 0x10)  # VP8 frame tag: show_frame is bit 4 (RFC 6386 §9.1)


def _vp9_superframe(data) -> list:
    """The frames of a VP9 superframe (VP9 bitstream spec, Annex B), or [data] when it is a single frame."""
    if not data:
        return [data]
    marker = data[-1]
    if marker & 0xE0 != 0xC0:
        return [data]
    count, size_bytes = (marker & 7) + 1, ((marker >> 3) & 3) + 1
    index = 2 + size_bytes * count
    if len(data) < index or data[-index] != marker:
        return [data]
    frames, pos = [], 0
    for k in range(count):
        at = len(data) - index + 1 + k * size_bytes
        size = int.from_bytes(data[at : at + size_bytes], "little")
        frames.append(data[pos : pos + size])
        pos += size
    return frames if pos <= len(data) - index else [data]


def _vp9_shown(frame) -> bool:
    """show_existing_frame or show_frame of a VP9 uncompressed header (spec §6.2); an unknown header counts."""
    if not frame or frame[0] >> 6 != 2:  # frame_marker
        return True
    b = frame[0]
    profile = ((b >> 5) & 1) | (((b >> 4) & 1) << 1)
    bit = 3 if profile < 3 else 2  # profile 3 has a reserved bit before show_existing_frame
    if b >> bit & 1:
        return True  # show_existing_frame: shows a decoded frame again
    return bool(b >> (bit - 2) & 1)  # frame_type, then show_frame


# --- display matrix -------------------------------------------------------------------------------------


def display_transpose(matrix: bytes | None):
    """The PIL transpose that shows a decoded frame as its display matrix asks, or None.

    The matrix is FFmpeg's AV_FRAME_DATA_DISPLAYMATRIX (3x3 int32, 16.16 fixed point). The mapping follows
    what the `ffmpeg` command line does when it auto-rotates (fftools/ffmpeg_filter.c): the clockwise angle
    `theta = -rotation` (rotation as av_display_rotation_get computes it) picks a transpose for 90/270 degrees
    (with a flip when the matrix mirrors), horizontal/vertical flips for 180 and a vertical flip for 0.
    Angles that are not multiples of 90 degrees are left as stored (ffmpeg would rotate with black fill).
    """
    if not matrix or len(matrix) < 36:
        return None
    m = struct.unpack("<9i", matrix[:36])
    a, b, c, d = m[0] / 65536, m[1] / 65536, m[3] / 65536, m[4] / 65536
    sx, sy = math.hypot(a, c), math.hypot(b, d)
    if sx == 0 or sy == 0:
        return None
    rotation = -math.degrees(math.atan2(b / sy, a / sx))  # counter-clockwise, as av_display_rotation_get
    theta = -round(rotation)
    theta -= 360 * math.floor(theta / 360 + 0.9 / 360)  # into [0, 360)
    T = Image.Transpose
    if abs(theta - 90) < 1:
        return T.TRANSPOSE if m[3] > 0 else T.ROTATE_270  # transpose=cclock_flip / clock
    if abs(theta - 270) < 1:
        return T.TRANSVERSE if m[3] < 0 else T.ROTATE_90  # transpose=clock_flip / cclock
    if abs(theta - 180) < 1:
        h, v = m[0] < 0, m[4] < 0
        return T.ROTATE_180 if h and v else T.FLIP_LEFT_RIGHT if h else T.FLIP_TOP_BOTTOM if v else None
    if abs(theta) < 1 or abs(theta - 360) < 1:
        return T.FLIP_TOP_BOTTOM if m[4] < 0 else None
    return None


def frame_display_matrix(frame) -> bytes | None:
    for side in frame.side_data:
        if getattr(side.type, "name", "") == "DISPLAYMATRIX":
            return bytes(side)
    return None
