"""Test media built in-process (nothing downloaded): hand-written PNG headers, EXIF blocks, MPO files, RLE BMPs,
HEIC, minimal PDFs (optionally RC4-encrypted by hand, PDF 1.4 Standard Security Handler R2; with a form field; with a
font that is not embedded), and PyAV-encoded videos."""

import hashlib
import io
import struct
import zlib

import numpy as np
from PIL import Image


# --- images ------------------------------------------------------------------------------------------


def encode(im: Image.Image, fmt: str, **kwargs) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kwargs)
    return buf.getvalue()


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims `width` x `height` (8-bit RGB) with a tiny IDAT: a decompression-bomb probe."""
    ihdr = struct.pack(">II", width, height) + b"\x08\x02\x00\x00\x00"
    idat = zlib.compress(b"\x00" * 16)
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", idat) + png_chunk(b"IEND", b"")


def noise_image(width: int, height: int, seed: int = 0, mode: str = "RGB") -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), "RGB").convert(mode)


def mutate_bytes(draw, data: bytearray, st) -> bytes:
    """The byte-level mutations of the I12 fuzzers (a Hypothesis `draw` and its `strategies` module): 1-8 bit
    flips, overwrites, deletions or insertions, then maybe a truncation."""
    for _ in range(draw(st.integers(1, 8))):
        pos = draw(st.integers(0, len(data) - 1))
        op = draw(st.sampled_from(["flip", "set", "delete", "insert"]))
        if op == "flip":
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "set":
            data[pos] = draw(st.integers(0, 255))
        elif op == "delete":
            del data[pos]
        else:
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
    if draw(st.booleans()):
        data = data[: draw(st.integers(0, len(data)))]
    return bytes(data)


def exif_block(orientation_entry: bytes, extra: bytes = b"", prefix: bytes = b"Exif\x00\x00") -> bytes:
    """EXIF APP1 payload (little-endian TIFF) with one IFD entry for tag 0x0112 given as raw 12 bytes."""
    tiff = b"II*\x00" + struct.pack("<I", 8) + struct.pack("<H", 1) + orientation_entry + struct.pack("<I", 0)
    return prefix + tiff + extra


def orientation_short(value: int) -> bytes:
    return struct.pack("<HHIHH", 0x0112, 3, 1, value, 0)


def orientation_srational(num: int, den: int) -> tuple[bytes, bytes]:
    """Orientation stored as SRATIONAL num/den (type 10); the 8 value bytes follow the IFD at offset 26."""
    return struct.pack("<HHII", 0x0112, 10, 1, 26), struct.pack("<ii", num, den)


def corner_marked(width: int, height: int) -> Image.Image:
    """Grey image with a red block at the stored top-left corner (golden pixel for orientation tests)."""
    im = Image.new("RGB", (width, height), (128, 128, 128))
    im.paste((255, 0, 0), (0, 0, 4, 4))
    return im


def mpo_with_huge_second_frame(declared: int = 40000) -> bytes:
    """A 2-frame MPO (a JPEG variant) whose second frame's SOF claims `declared` x `declared` pixels."""
    a, b = Image.new("RGB", (32, 24), (200, 10, 10)), Image.new("RGB", (32, 24), (10, 200, 10))
    data = bytearray(encode(a, "MPO", save_all=True, append_images=[b]))
    sofs = [i for i in range(len(data) - 1) if data[i] == 0xFF and data[i + 1] == 0xC0]
    assert len(sofs) == 2, "expected one SOF0 per frame"
    struct.pack_into(">HH", data, sofs[1] + 5, declared, declared)  # FFC0 len(2) precision(1) height width
    return bytes(data)


def animated(fmt: str, frames: int, size=(8, 8)) -> bytes:
    ims = [Image.new("RGB", size, (i % 256, (i // 256) % 256, 7)) for i in range(frames)]
    return encode(ims[0], fmt, save_all=True, append_images=ims[1:], duration=10, loop=0)


def encode_heif(im: Image.Image, **kwargs) -> bytes:
    """HEIC bytes (HEVC, pillow-heif's x265 encoder) without registering pillow-heif's plugin in this process;
    an EXIF orientation in `exif=` is written as the HEIF `irot`/`imir` transform, as phones do."""
    import pillow_heif

    buf = io.BytesIO()
    pillow_heif.from_pillow(im).save(buf, format="HEIF", **kwargs)
    return buf.getvalue()


def bmp_rle(width: int, height: int, palette, stream: bytes, bits: int = 4, top_down: bool = False) -> bytes:
    """A BMP (BITMAPINFOHEADER) whose pixels are the hand-written BI_RLE4 (bits=4) or BI_RLE8 (bits=8) `stream`;
    `palette` is a list of (r, g, b)."""
    pal = b"".join(bytes((b, g, r, 0)) for r, g, b in palette)
    offset = 14 + 40 + len(pal)
    info = struct.pack("<IiiHHIIiiII", 40, width, -height if top_down else height, 1, bits, 2 if bits == 4 else 1,
                       len(stream), 2835, 2835, len(palette), 0)
    return b"BM" + struct.pack("<IHHI", offset + len(stream), 0, 0, offset) + info + pal + stream


# --- PDF -----------------------------------------------------------------------------------------------

_PAD = bytes.fromhex("28BF4E5E4E758A4164004E56FFFA01082E2E00B6D0683E802F0CA9FE6453697A")


def _rc4(key: bytes, data: bytes) -> bytes:
    s, j = list(range(256)), 0
    for i in range(256):
        j = (j + s[i] + key[i % len(key)]) % 256
        s[i], s[j] = s[j], s[i]
    out, i, j = bytearray(), 0, 0
    for byte in data:
        i = (i + 1) % 256
        j = (j + s[i]) % 256
        s[i], s[j] = s[j], s[i]
        out.append(byte ^ s[(s[i] + s[j]) % 256])
    return bytes(out)


def make_pdf(pages, user_password: str | None = None, owner_password: str = "owner") -> bytes:
    """Minimal PDF. `pages`: list of (width_pt, height_pt, content_stream_bytes).

    With `user_password`, the file is encrypted with the Standard Security Handler, revision 2 (40-bit RC4),
    following PDF 1.7 §7.6.3 algorithms 2 (file key), 3 (O entry) and 4 (U entry); streams are encrypted with
    the per-object key of algorithm 1.
    """
    file_id = hashlib.md5(b"vl-test-pdf").digest()
    key = None
    if user_password is not None:
        owner_key = hashlib.md5(_pad(owner_password)).digest()[:5]
        o_entry = _rc4(owner_key, _pad(user_password))
        permissions = -4  # all permissions
        key = hashlib.md5(_pad(user_password) + o_entry + struct.pack("<i", permissions) + file_id).digest()[:5]
        u_entry = _rc4(key, _PAD)
    objects: list[bytes] = []  # object n is objects[n-1]
    n_pages = len(pages)
    kids = " ".join(f"{3 + 2 * k} 0 R" for k in range(n_pages))
    objects.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    objects.append(f"<< /Type /Pages /Kids [{kids}] /Count {n_pages} >>".encode())
    for k, (w, h, content) in enumerate(pages):
        page_num, content_num = 3 + 2 * k, 4 + 2 * k
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 {w} {h}] /Contents {content_num} 0 R >>".encode()
        )
        if key is not None:
            obj_key = hashlib.md5(key + struct.pack("<I", content_num)[:3] + b"\x00\x00").digest()[:10]
            content = _rc4(obj_key, content)
        objects.append(f"<< /Length {len(content)} >>\nstream\n".encode() + content + b"\nendstream")
    trailer_extra = ""
    if key is not None:
        objects.append(
            f"<< /Filter /Standard /V 1 /R 2 /O <{o_entry.hex()}> /U <{u_entry.hex()}> /P {permissions} >>".encode()
        )
        trailer_extra = f" /Encrypt {len(objects)} 0 R"
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for n, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{n} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{o:010d} 00000 n \n".encode() for o in offsets)
    out += (
        f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R /ID [<{file_id.hex()}> <{file_id.hex()}>]"
        f"{trailer_extra} >>\nstartxref\n{xref}\n%%EOF\n"
    ).encode()
    return bytes(out)


def _pad(password: str) -> bytes:
    return (password.encode("latin-1") + _PAD)[:32]


def red_square_page(w: float = 200, h: float = 100) -> tuple[float, float, bytes]:
    """A page with a red rectangle in its lower-left quarter (PDF y points up)."""
    return (w, h, f"1 0 0 rg 0 0 {w / 2} {h / 2} re f".encode())


def pdf_from_objects(objects: list[bytes]) -> bytes:
    """A PDF of the given object bodies, object n being objects[n-1]; object 1 is the catalog."""
    out = bytearray(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for n, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{n} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{o:010d} 00000 n \n".encode() for o in offsets)
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


def pdf_stream(data: bytes, extra: str = "") -> bytes:
    return f"<< /Length {len(data)}{extra} >>\nstream\n".encode() + data + b"\nendstream"


FORM_FIELD_BOX = (50, 40, 250, 70)  # the text field's /Rect in points (x0, y0, x1, y1) on a 300 x 100 pt page


def form_pdf(value: str | None, appearance: bool = True, need_appearances: bool = False) -> bytes:
    """One page with an AcroForm text field (Helvetica 18) at FORM_FIELD_BOX holding `value` (/V; None: no /V).
    `appearance`: the widget carries an appearance stream drawing the value, as a filling viewer writes it;
    `need_appearances`: the form asks viewers to build appearances themselves (/NeedAppearances true)."""
    helv = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>"
    objects = [b"", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>", b"", pdf_stream(b""), helv]
    ap = ""
    if appearance:
        text = (value or "").encode("latin-1")
        body = b"/Tx BMC q BT /Helv 18 Tf 0 g 2 8 Td (" + text + b") Tj ET Q EMC"
        objects.append(pdf_stream(body, " /Type /XObject /Subtype /Form /BBox [0 0 200 30] "
                                        "/Resources << /Font << /Helv 5 0 R >> >>"))
        ap = f" /AP << /N {len(objects)} 0 R >>"
    v = "" if value is None else f" /V ({value})"
    x0, y0, x1, y1 = FORM_FIELD_BOX
    objects.append(f"<< /Type /Annot /Subtype /Widget /FT /Tx /T (name){v} /DA (/Helv 18 Tf 0 g) "
                   f"/Rect [{x0} {y0} {x1} {y1}] /F 4 /P 3 0 R{ap} >>".encode())
    widget = len(objects)
    need = " /NeedAppearances true" if need_appearances else ""
    objects[0] = (f"<< /Type /Catalog /Pages 2 0 R /AcroForm << /Fields [{widget} 0 R] "
                  f"/DR << /Font << /Helv 5 0 R >> >> /DA (/Helv 0 Tf 0 g){need} >> >>").encode()
    objects[2] = (f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 300 100] /Contents 4 0 R "
                  f"/Annots [{widget} 0 R] >>").encode()
    return pdf_from_objects(objects)


def text_pdf_without_font(font_name: str = "MyCustomFont", widths: int | None = None,
                          text: bytes = b"Hello World 123") -> bytes:
    """One 300 x 100 pt page of 24 pt text in a TrueType font that is not embedded (PDFium substitutes one);
    `widths`: every glyph's advance in /Widths (PDFium then stretches its substitute to fit)."""
    desc = (f"<< /Type /FontDescriptor /FontName /{font_name} /Flags 32 /FontBBox [0 0 1000 1000] /ItalicAngle 0 "
            "/Ascent 900 /Descent -200 /CapHeight 700 /StemV 80 >>")
    w = "" if widths is None else f" /FirstChar 32 /LastChar 126 /Widths [{' '.join([str(widths)] * 95)}]"
    font = (f"<< /Type /Font /Subtype /TrueType /BaseFont /{font_name} /Encoding /WinAnsiEncoding{w} "
            f"/FontDescriptor {desc} >>").encode()
    content = b"BT /F1 24 Tf 10 40 Td (" + text + b") Tj ET"
    return pdf_from_objects([
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 300 100] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        pdf_stream(content),
        font,
    ])


# --- video ---------------------------------------------------------------------------------------------


def make_video(
    path,
    *,
    frames: int = 30,
    fps=10,
    size=(64, 48),
    codec: str = "libx264",
    noise: bool = False,
    options: dict | None = None,
    pts_list=None,
    time_base=None,
    container_format: str | None = None,
    rotation: int | None = None,
    hflip: bool = False,
    codec_options: dict | None = None,
    marker: bool = False,
) -> str:
    """Encode `frames` frames whose grey level encodes the frame index (value 8*i mod 256).

    `pts_list` (with `time_base`) writes explicit presentation times, e.g. for a variable-frame-rate file, or
    negative ones, which an MP4 muxer turns into an edit list whose demuxer flags those packets discard.
    `container_format` forces the muxer ("mpeg" for MPEG-PS, "mpegts", "matroska", ...); `rotation`/`hflip`
    write a display matrix (PyAV's counter-clockwise degrees); `marker` paints a red 8x8 block at the stored
    top-left corner (to see where a rotation moved it).
    """
    import av

    w, h = size
    rng = np.random.default_rng(0)
    with av.open(str(path), "w", format=container_format, options=options or {}) as container:
        default_options = {"preset": "ultrafast"} if codec == "libx264" else {}
        stream = container.add_stream(codec, rate=fps, options=codec_options or default_options)
        stream.width, stream.height = w, h
        stream.pix_fmt = "yuvj420p" if codec == "mjpeg" else "yuv420p"
        if rotation is not None or hflip:
            stream.set_display_rotation(rotation or 0, hflip=hflip)
        if time_base is not None:
            stream.codec_context.time_base = time_base
            stream.time_base = time_base
        for i in range(frames):
            a = np.full((h, w, 3), (8 * i) % 256, np.uint8)
            if noise:
                a[: h // 2] = rng.integers(0, 256, (h // 2, w, 3), dtype=np.uint8)
            if marker:
                a[:8, :8] = (255, 0, 0)
            frame = av.VideoFrame.from_ndarray(a, format="rgb24")
            if pts_list is not None:
                frame.pts = pts_list[i]
                frame.time_base = time_base
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return str(path)


def make_audio_only(path, seconds: float = 1.0) -> str:
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("aac", rate=16000)
        n = int(16000 * seconds)
        samples = (np.sin(np.arange(n) / 10.0) * 0.1).astype(np.float32)[None]
        for start in range(0, n, 1024):
            frame = av.AudioFrame.from_ndarray(samples[:, start : start + 1024], format="fltp", layout="mono")
            frame.sample_rate = 16000
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return str(path)


def make_multistream_video(path, streams, default: int = 0) -> str:
    """One MP4 with several video streams. `streams`: (width, height, fps, frames) each. Frame i of stream k has
    red = 8*i mod 256, green = 60*k, blue = 7, so a tile tells both the stream and the frame. Stream `default`
    carries the default disposition (which libavformat's best-stream choice prefers)."""
    import av

    with av.open(str(path), "w") as container:
        out = []
        for k, (w, h, fps, n) in enumerate(streams):
            stream = container.add_stream("libx264", rate=fps, options={"preset": "ultrafast"})
            stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
            stream.disposition = av.stream.Disposition.default if k == default else av.stream.Disposition(0)
            out.append((stream, n))
        for k, (stream, n) in enumerate(out):
            for i in range(n):
                a = np.empty((stream.height, stream.width, 3), np.uint8)
                a[...] = ((8 * i) % 256, 60 * k, 7)
                for packet in stream.encode(av.VideoFrame.from_ndarray(a, format="rgb24")):
                    container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)
    return str(path)


def container_pts(path, stream_index: int | None = None) -> list[float]:
    """Presentation times (s) of the displayed frames of a stream, as the container states them: packets
    flagged discard skipped, sorted, relative to the first displayed frame. The oracle for timestamp tests."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0] if stream_index is None else container.streams[stream_index]
        pts = sorted(p.pts for p in container.demux(stream) if p.size and not p.is_discard and p.pts is not None)
        return [float((p - pts[0]) * stream.time_base) for p in pts]


def hls_playlist(directory, segment) -> str:
    """An HLS playlist in `directory` whose only segment is the file `segment` (anywhere on disk)."""
    import os

    path = os.path.join(str(directory), "list.m3u8")
    with open(path, "w") as f:
        f.write("#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:10\n#EXT-X-MEDIA-SEQUENCE:0\n"
                f"#EXTINF:3.0,\n{os.path.relpath(str(segment), str(directory))}\n#EXT-X-ENDLIST\n")
    return path
