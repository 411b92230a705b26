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
    return pdf_from_objects(objects, version="1.4",
                            trailer=f" /ID [<{file_id.hex()}> <{file_id.hex()}>]{trailer_extra}")


def _pad(password: str) -> bytes:
    return (password.encode("latin-1") + _PAD)[:32]


def red_square_page(w: float = 200, h: float = 100) -> tuple[float, float, bytes]:
    """A page with a red rectangle in its lower-left quarter (PDF y points up)."""
    return (w, h, f"1 0 0 rg 0 0 {w / 2} {h / 2} re f".encode())


def pdf_from_objects(objects: list[bytes], version: str = "1.7", trailer: str = "") -> bytes:
    """A PDF of the given object bodies, object n being objects[n-1]; object 1 is the catalog; `trailer`: more
    trailer entries (an /ID, an /Encrypt reference)."""
    out = bytearray(f"%PDF-{version}\n".encode() + b"%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for n, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{n} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{o:010d} 00000 n \n".encode() for o in offsets)
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R{trailer} >>\nstartxref\n{xref}\n%%EOF\n".encode()
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


# --- video files that differ from a clean clip (issue 52: the sandbox, encryption, rates, hidden frames) --------


def make_av_clip(path, *, seconds: int = 13, size=(320, 180), fps: int = 30) -> str:
    """Two video streams and two audio streams in one MP4, as in issue 52 item 3 (13 s, 320x180). Frame i of
    video stream k: red = 8*i mod 256, green = 60*k, blue = 7 below a noise band (the top quarter), so a tile
    tells the stream and the frame and the file is not trivially small."""
    import av

    w, h = size
    rng = np.random.default_rng(0)
    with av.open(str(path), "w") as container:
        videos = [container.add_stream("libx264", rate=fps, options={"preset": "ultrafast"}) for _ in range(2)]
        for stream in videos:
            stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        audios = [container.add_stream("aac", rate=44100) for _ in range(2)]
        for i in range(seconds * fps):
            for k, stream in enumerate(videos):
                a = np.empty((h, w, 3), np.uint8)
                a[...] = ((8 * i) % 256, 60 * k, 7)
                a[: h // 4] = rng.integers(0, 256, (h // 4, w, 3), dtype=np.uint8)
                for packet in stream.encode(av.VideoFrame.from_ndarray(a, format="rgb24")):
                    container.mux(packet)
        tone = (np.sin(np.arange(1024) / 10.0) * 0.1).astype(np.float32)[None].repeat(2, 0)
        for stream in audios:
            for start in range(0, seconds * 44100, 1024):
                frame = av.AudioFrame.from_ndarray(tone, format="fltp", layout="stereo")
                frame.sample_rate, frame.pts = 44100, start
                for packet in stream.encode(frame):
                    container.mux(packet)
        for stream in videos + audios:
            for packet in stream.encode():
                container.mux(packet)
    return str(path)


def make_cenc_mp4(path, **kwargs) -> str:
    """A real Common Encryption MP4 (ISO/IEC 23001-7, scheme 'cenc', AES-CTR): FFmpeg's MP4 muxer encrypts the
    samples and writes `encv` + `sinf/frma/schm/schi/tenc` and per-sample `senc` IVs. `kwargs` go to make_video."""
    options = {"encryption_scheme": "cenc-aes-ctr", "encryption_key": "00112233445566778899aabbccddeeff",
               "encryption_kid": "a1a2a3a4a5a6a7a8a9aaabacadaeafb0"}
    return make_video(path, options=options, **kwargs)


def _ebml(eid: bytes, body: bytes, wide: bool = False) -> bytes:
    """One EBML element; `wide`: an 8-byte size field (valid if not minimal), else one byte (bodies < 127)."""
    if wide:
        return eid + (0x01 << 56 | len(body)).to_bytes(8, "big") + body
    assert len(body) < 127
    return eid + bytes([0x80 | len(body)]) + body


def _ebml_vint(data, pos: int) -> tuple[int, int]:
    n = 1
    while not data[pos] & (0x80 >> (n - 1)):
        n += 1
    value = data[pos] & ((0x80 >> (n - 1)) - 1)
    for k in range(1, n):
        value = value << 8 | data[pos + k]
    return value, n


def _ebml_elements(data, start: int, end: int):
    """(id, element start, body start, body end) of each EBML element in data[start:end]."""
    pos = start
    while pos < end:
        id_len = _ebml_vint(data, pos)[1]
        size, size_len = _ebml_vint(data, pos + id_len)
        body = pos + id_len + size_len
        yield bytes(data[pos : pos + id_len]), pos, body, body + size
        pos = body + size


def encrypt_matroska_header(path, key_id: bytes = bytes(range(16))) -> str:
    """Mark a PyAV-made Matroska file's video track as encrypted (Matroska spec: ContentEncodings >
    ContentEncoding > ContentEncryption, AES-CTR, a key id), as WebM DRM files are. The frames stay clear, so
    only the declaration can tell. The Void element FFmpeg leaves before Tracks shrinks by what Tracks grows,
    so no later byte moves (clusters, cues and the seek head stay valid)."""
    data = bytearray(open(path, "rb").read())
    ((_, _, segment, _),) = [e for e in _ebml_elements(data, 0, len(data)) if e[0] == b"\x18\x53\x80\x67"]
    top = []
    for element in _ebml_elements(data, segment, len(data)):
        top.append(element)
        if element[0] == b"\x1f\x43\xb6\x75":  # the first Cluster: the header is behind us
            break
    void = next(e for e in top if e[0] == b"\xec")
    tracks = next(e for e in top if e[0] == b"\x16\x54\xae\x6b")
    assert void[1] < tracks[1], "expected FFmpeg's Void element before Tracks"
    aes = _ebml(b"\x47\xe1", b"\x05") + _ebml(b"\x47\xe2", key_id) + _ebml(b"\x47\xe7", _ebml(b"\x47\xe8", b"\x01"))
    encoding = (_ebml(b"\x50\x31", b"\x00") + _ebml(b"\x50\x32", b"\x01") + _ebml(b"\x50\x33", b"\x01")
                + _ebml(b"\x50\x35", aes))
    encodings = _ebml(b"\x6d\x80", _ebml(b"\x62\x40", encoding))
    new_tracks = _ebml(tracks[0], b"".join(
        _ebml(eid, bytes(data[body:end]) + encodings, wide=True) if eid == b"\xae" else bytes(data[start:end])
        for eid, start, body, end in _ebml_elements(data, tracks[2], tracks[3])), wide=True)
    room = void[3] - void[1] - (len(new_tracks) - (tracks[3] - tracks[1]))
    assert room >= 9, "the Void element before Tracks is too small"
    out = data[: void[1]] + _ebml(b"\xec", bytes(room - 9), wide=True) + data[void[3] : tracks[1]] + new_tracks
    out += data[tracks[3] :]
    assert len(out) == len(data)
    with open(path, "wb") as f:
        f.write(out)
    return str(path)


def vp9_superframe(frames: list[bytes]) -> bytes:
    """Frames packed into one VP9 superframe (VP9 bitstream spec, Annex B; 4-byte sizes)."""
    marker = 0xC0 | (3 << 3) | (len(frames) - 1)
    index = bytes([marker]) + b"".join(len(f).to_bytes(4, "little") for f in frames) + bytes([marker])
    return b"".join(frames) + index


def make_vp9_with_hidden_frames(path, *, frames: int = 72, gop: int = 9, separate: bool = True) -> str:
    """A VP9 WebM (libvpx, alt-ref enabled) with one hidden frame per keyframe: a copy of the keyframe with its
    show_frame bit cleared, decoded after it (a keyframe resets every reference, so the shown pictures do not
    change). `separate`: the hidden frames in packets of their own 1 ms after their keyframe, as some muxers
    store alt-ref frames (FFmpeg's own muxers pack them into superframes; automatic bitstream filters are turned
    off for that); else packed with their keyframe into a superframe. 72 frames, gop 9: 80 packets, 72 shown."""
    import av

    source = make_video(str(path) + ".src.webm", frames=frames, fps=24, size=(64, 48), codec="libvpx-vp9",
                        container_format="webm",
                        codec_options={"auto-alt-ref": "1", "lag-in-frames": "25", "g": str(gop)})
    with av.open(source) as src, av.open(str(path), "w", format="webm", options={"fflags": "-autobsf"}) as out:
        stream = src.streams.video[0]
        target = out.add_stream_from_template(stream)
        for packet in src.demux(stream):
            if not packet.size:
                continue
            data = bytes(packet)
            items = [(packet.pts, data)]
            if packet.is_keyframe:
                assert data[0] >> 6 == 2 and data[0] & 0x02, "expected a shown profile-0 VP9 keyframe"
                hidden = bytes([data[0] & ~0x02]) + data[1:]  # show_frame is bit 1 of the first header byte
                items = [(packet.pts, data), (packet.pts + 1, hidden)] if separate else [
                    (packet.pts, vp9_superframe([data, hidden]))]
            for pts, payload in items:
                copy = av.Packet(payload)
                copy.pts = copy.dts = pts
                copy.time_base, copy.stream = stream.time_base, target
                out.mux(copy)
    import os

    os.remove(source)
    return str(path)


# --- sound -------------------------------------------------------------------------------------------


def tone(rate: int, seconds: float, freq: float, amplitude: float = 0.5, start: int = 0) -> np.ndarray:
    t = (np.arange(int(rate * seconds)) + start) / rate
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def write_video(path, *, audio_offset_s: float = 0.0, corrupt_audio: bool = False, fmt=None, seconds: float = 2.0,
                audio_streams=((300.0, False),)) -> str:
    """A 10 fps H.264 video with AAC sound tracks (each a tone; (freq, default disposition)) starting at
    `audio_offset_s`; `corrupt_audio` replaces every audio packet's bytes (the track cannot be decoded)."""
    import av

    with av.open(str(path), "w", format=fmt) as c:
        v = c.add_stream("libx264", rate=10, options={"preset": "ultrafast"})
        v.width, v.height, v.pix_fmt = 64, 48, "yuv420p"
        tracks = []
        for freq, default in audio_streams:
            a = c.add_stream("aac", rate=16000, layout="mono")
            if len(audio_streams) > 1:
                a.disposition = av.stream.Disposition.default if default else av.stream.Disposition(0)
            tracks.append((a, freq))
        for i in range(int(10 * seconds)):
            for packet in v.encode(av.VideoFrame.from_ndarray(np.full((48, 64, 3), 8 * i, np.uint8), format="rgb24")):
                c.mux(packet)
        for a, freq in tracks:
            x = tone(16000, seconds, freq, 0.3)[None]
            step = a.codec_context.frame_size
            for i in range(0, x.shape[1], step):
                frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(x[:, i : i + step]), format="fltp",
                                                   layout="mono")
                frame.sample_rate, frame.pts = 16000, i + int(audio_offset_s * 16000)
                for packet in a.encode(frame):
                    if corrupt_audio:
                        bad = av.Packet(b"\x17" * packet.size)
                        bad.pts, bad.dts, bad.time_base, bad.stream = packet.pts, packet.dts, packet.time_base, a
                        packet = bad
                    c.mux(packet)
        for packet in v.encode():
            c.mux(packet)
        for a, _ in tracks:
            for packet in a.encode():
                c.mux(packet)
    return str(path)
