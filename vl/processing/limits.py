"""Caps on untrusted media, checked before anything is decoded.

One frozen dataclass shared by images.py, video.py and documents.py, so that a server sets its budget in one
place. The order of checks follows docs/reliability_policy.md §0 rule 1: compressed size -> header dimensions ->
frame count / duration / page count -> decode. Every default below is a project *proposal* (the matrix marks
them so), chosen to admit what the model can use and refuse what only costs memory or CPU:

- images: the model sees at most 12 tiles of 512 px (about 3.1 MP), so a 50 MP cap admits every phone camera
  (48 MP sensors) and stays below Pillow's own bomb limit (`Image.MAX_IMAGE_PIXELS` = 89,478,485);
- video: 2 fps x 128 frames is the reference sampling (docs/format.md §9.1); an hour of video still
  gives 128 frames, and 4096 x 4096 admits DCI 4K while refusing the 8192 x 8192 bomb of docs/reliability_policy.md row V4;
- PDF: 200 rendered pages (a long report), 4096 x 4096 rendered pixels per page (A0 at 144 dpi is larger
  and is refused; lower the render scale for such pages) and 400 M rendered pixels per request (200 Letter
  pages at 144 dpi);
- audio: 1 h (the video cap, so the sound of any admitted video is admitted; 45,000 audio embeddings at the
  encoder's 12.5 per second), 192 kHz and 8 channels (7.1) cover every studio and film format; 1 GiB (the video
  cap) admits an hour of 48 kHz 24-bit stereo WAV (989 MiB);
- decoding: wall-clock timeouts after which a sandbox worker is killed (the video one is also the deadline of an
  in-process decode, checked between packets and frames, so a video has one deadline everywhere), and a decode
  worker's 2 GiB memory cap
  (docs/reliability_policy.md §6 "Bounded"): its data (RLIMIT_DATA: heap, anonymous maps, thread stacks) and its
  resident set, never its address space, so that mapping a decoder's libraries cannot fail under the cap.
"""

from dataclasses import dataclass, fields

from vl.errors import ConfigError, TooManyItemsError

MiB = 1 << 20


@dataclass(frozen=True)
class MediaLimits:
    # --- images -------------------------------------------------------------------------------------
    max_image_bytes: int = 32 * MiB
    # effective cap is min(this, PIL.Image.MAX_IMAGE_PIXELS): an image that would only make Pillow *warn*
    # (DecompressionBombWarning) is refused as too large, without touching the process-global warnings filter
    max_image_pixels: int = 50_000_000
    max_images: int = 4  # per request; model card: "Input Images Supported: 4"
    # --- video --------------------------------------------------------------------------------------
    max_video_bytes: int = 1024 * MiB
    max_video_duration_s: float = 3600.0
    max_video_frame_pixels: int = 4096 * 4096
    max_video_frames: int = 216_000  # frames walked while indexing (1 h at 60 fps); header counts are distrusted
    max_videos: int = 1
    # --- PDF ----------------------------------------------------------------------------------------
    max_pdf_bytes: int = 256 * MiB
    max_pdf_pages: int = 200  # pages rendered (after the page-range selection)
    max_pdf_page_pixels: int = 4096 * 4096  # rendered bitmap of one page, from page size x render scale
    # sum over the rendered pages of a request: 200 Letter pages at 144 dpi (388 M) fit, 200 pages at the
    # per-page cap (3.4 G pixels, the 25 KB "page bomb" of 2048-pt blank pages) do not
    max_pdf_total_pixels: int = 400_000_000
    max_documents: int = 1
    # --- audio (vl/processing/audio.py; a video's sound track is capped by the video's bytes) -------------
    max_audio_bytes: int = 1024 * MiB
    max_audio_duration_s: float = 3600.0  # header duration, then the decoded samples (headers may lie)
    max_audio_sample_rate: int = 192_000  # the source's rate, before resampling to 16 kHz
    max_audio_channels: int = 8  # 7.1; channels are averaged to mono
    max_audios: int = 4  # per request
    # --- decoding deadlines and the decode worker's memory (sandbox.py) ------------------------------
    image_timeout_s: float = 10.0
    video_timeout_s: float = 60.0  # one deadline for a video's probe, index and decode, in-process or isolated
    pdf_timeout_s: float = 60.0
    audio_timeout_s: float = 120.0  # one deadline for an audio file's (or a video's sound track's) probe and decode
    worker_memory_mb: int = 2048  # a sandbox worker's data (RLIMIT_DATA) and resident set, each; not address space

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(
                    f"MediaLimits.{f.name} must be a positive number, found {value!r}; "
                    "limits cannot be switched off, raise them instead."
                )

    def check_count(self, kind: str, count: int) -> None:
        """Refuse a request carrying more items of `kind` ("image", "video", "document") than allowed.

        Called by the processor before any item is decoded (docs/reliability_policy.md row I10).
        """
        limit = {"image": self.max_images, "video": self.max_videos, "document": self.max_documents,
                 "audio": self.max_audios}.get(kind)
        if limit is None:
            raise ValueError(f"kind must be 'image', 'video', 'document' or 'audio', found {kind!r}")
        if count > limit:
            raise TooManyItemsError(
                f"at most {limit} {kind}(s) per request are accepted, found {count}; "
                f"split the request or raise MediaLimits.max_{kind}s."
            )


DEFAULT_LIMITS = MediaLimits()
