"""Messages -> Nemotron 3 Nano Omni inputs: `input_ids`, image patches with their grids, video tubelets, audio clips.

Order of work follows transformers' `nemotron_h_omni` processor (docs/format.md, "Omni processing"): render the chat
(vl/processing/chat.py, the one prompt format) with one placeholder per media item (`<image>`, `<video>`,
`<so_embedding>`); decode every item behind the media limits; expand each placeholder to its run: an image to
`<img>` + `<image>` x (patches / merge**2) + `</img>`, a video to one timestamped `<img>...</img>` per tubelet (the
image token serves both), an audio clip to `<so_start>` + `<so_embedding>` x (encoder outputs) + `<so_end>`;
tokenize without BOS. Video placeholder runs are full length: Efficient Video Sampling drops positions inside the
model, after the encoder. The images of one call share one patch budget, so all of them are decoded before any is
resized.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from vl.config.parakeet import ParakeetConfig
from vl.config.omni import OmniConfig
from vl.config_policy import Check, KeyReader
from vl.errors import ConfigError, ContextLengthError, InputError, MediaTooLargeError, NoAudioError, item_names, naming
from vl.modeling.parakeet import subsampled_length
from vl.processing import audio, chat
from vl.processing.audio_features import MelConfig, log_mel_features, mel_config_from_preprocessor
from vl.processing.limits import DEFAULT_LIMITS, MediaLimits
from vl.processing.omni_images import OmniImageConfig, load_omni_images
from vl.processing.omni_video import OmniVideo, OmniVideoConfig, load_omni_video
from vl.processing.processor import (
    check_prompt_size,
    checked_source,
    count_media_parts,
    max_chars_per_token,
    special_token_id,
    tokenizer_stop_ids,
)
from vl.processing.progress import Work

BICUBIC = 3  # PIL's (and transformers' PILImageResampling) number for bicubic resampling


@dataclass(frozen=True)
class OmniProcessingConfig:
    """Everything between media and placeholders that the checkpoint's processor files set."""
    image: OmniImageConfig
    video: OmniVideoConfig
    mel: MelConfig = field(default_factory=MelConfig)  # the audio features (vl/processing/audio_features.py)
    audio_encoder: ParakeetConfig = field(default_factory=ParakeetConfig)  # only its subsampling is read here
    tokens: chat.MediaTokens = chat.OMNI_TOKENS

    def __post_init__(self):
        if not self.tokens.has_audio:
            raise ConfigError("Omni processing needs media tokens with the audio tokens (chat.OMNI_TOKENS)")
        if self.mel.sampling_rate != audio.SAMPLE_RATE:
            raise ConfigError(f"the audio features expect {self.mel.sampling_rate} Hz but audio is decoded at "
                              f"{audio.SAMPLE_RATE} Hz (vl/processing/audio.py)")

    def audio_tokens(self, num_samples: int) -> int:
        """`<so_embedding>` placeholders for a clip of `num_samples` samples: the encoder's outputs for the clip's
        mel frames (a centred STFT: 1 + n // hop), at least 1 (transformers' processor). The model keeps as many
        (vl/modeling/parakeet.py `omni_embedding_lengths`: the subsampled length of the valid frames plus one)."""
        return max(1, int(subsampled_length(self.mel.stft_frames(num_samples), self.audio_encoder)))


# --- the checkpoint's processor files -> OmniProcessingConfig ------------------------------------------------
_IMAGE_KEYS = ("patch_size", "downsample_ratio", "min_num_patches", "max_num_patches", "max_model_len")
_VIDEO_KEYS = ("patch_size", "downsample_ratio", "video_target_num_patches", "video_maintain_aspect_ratio")
_PROCESSOR_KEYS = ("audio_sampling_rate", "audio_subsampling_factor", "audio_hop_length", "video_temporal_patch_dim")
_NOT_READ = "not read by transformers' nemotron_h_omni processors (they always resize to their own grid)"
_SAMPLING = "frame sampling is the request's fps / max_frames (vl/processing/video.py)"
IMAGE_IGNORED = {
    "image_processor_type": "class name", "processor_class": "class name", "do_resize": _NOT_READ, "size": _NOT_READ,
    "crop_size": _NOT_READ, "do_center_crop": _NOT_READ, "do_pad": _NOT_READ, "default_to_square": _NOT_READ,
    "data_format": _NOT_READ, "input_data_format": _NOT_READ, "device": "runs on the CPU",
    "return_tensors": "always tensors", "disable_grouping": "batching only",
    "auto_map": "remote code is never executed",
    **dict.fromkeys(("max_num_tiles", "use_thumbnail", "image_size", "dynamic_image_size"),
                    "Nano V2 VL's 512-px tiling, which a processor written for both families may carry; Omni images "
                    "take one native-resolution patch grid (min_num_patches .. max_num_patches)"),
}
VIDEO_IGNORED = {
    **IMAGE_IGNORED, "video_processor_type": "class name", "image_mean": "the video processor reads norm_mean",
    "image_std": "the video processor reads norm_std", "do_sample_frames": _SAMPLING, "fps": _SAMPLING,
    "num_frames": _SAMPLING, "return_metadata": "metadata is always kept", "video_metadata": "per call",
    "rescale_factor": "the video processor divides by 255", "do_rescale": "the video processor always rescales",
    "do_normalize": "the video processor always normalises", "resample": "the video processor always uses bicubic",
    "do_convert_rgb": "frames are always decoded to RGB",
    "temporal_patch_size": "the processor's video_temporal_patch_dim packs the frames (transformers' processor "
                           "passes it over this one)",
}
IMAGE_CHECKS = {
    "do_rescale": Check((True, None), "leave pixels in 0..255"),
    "rescale_factor": Check((1 / 255, 0.00392156862745098, None), "scale pixels by another factor"),
    "do_normalize": Check((True, None), "skip the per-channel normalisation"),
    "do_convert_rgb": Check((True, None), "feed non-RGB pixels"),
    "resample": Check((BICUBIC, None), "resize with another filter than bicubic"),
}
PROCESSOR_IGNORED = {"processor_class": "class name", "chat_template": "the tokenizer's chat_template is used"}


def omni_processing_from_hf(preprocessor: Mapping | None, video: Mapping | None = None,
                            processor: Mapping | None = None, feature_extractor: Mapping | None = None, *,
                            model: OmniConfig | None = None, where: str = "preprocessor_config.json",
                            notes: list | None = None) -> OmniProcessingConfig:
    """The image processor's keys (`preprocessor_config.json`, or `processor_config.json`'s "image_processor"), the
    video processor's (`video_preprocessor_config.json` or "video_processor"), the feature extractor's
    ("feature_extractor", vl/processing/audio_features.py) and the processor's own, under the policy of
    vl/config_policy.py. As in transformers, the processor's `video_temporal_patch_dim` packs the frames; the video
    processor takes `norm_mean` / `norm_std` and the image processor `image_mean` / `image_std` (or the released
    `norm_mean` / `norm_std`). `model` is checked against: the same patch size, merge factor and frames per tubelet
    as the network; its audio encoder sizes the audio runs."""
    notes = [] if notes is None else notes
    image_reader = KeyReader(where, "image processor", notes)
    raw = dict(preprocessor or {})
    norm = {"mean": raw.pop("image_mean", None), "std": raw.pop("image_std", None)}
    legacy = {"mean": raw.pop("norm_mean", None), "std": raw.pop("norm_std", None)}
    taken = {k: v for k, v in image_reader.sort(raw, mapped=_IMAGE_KEYS, specific=IMAGE_IGNORED,
                                                  checks=IMAGE_CHECKS).items() if v is not None}
    image_reader.finish("Omni image processor")
    mean, std = norm["mean"] or legacy["mean"], norm["std"] or legacy["std"]
    if model is not None:
        mean = mean or model.vision.norm_mean
        std = std or model.vision.norm_std
        taken.setdefault("patch_size", model.vision.patch_size)
        taken.setdefault("downsample_ratio", model.downsample_ratio)
    if mean is None or std is None:
        raise ConfigError(f"{where}: no normalisation statistics (image_mean / image_std or norm_mean / norm_std)")
    image = OmniImageConfig(norm_mean=tuple(mean), norm_std=tuple(std), **taken)

    video_reader = KeyReader(where if video is None else "video_preprocessor_config.json", "video processor", notes)
    raw = dict(video or {})
    vmean, vstd = raw.pop("norm_mean", None), raw.pop("norm_std", None)
    vtaken = {k: v for k, v in video_reader.sort(raw, mapped=_VIDEO_KEYS, specific=VIDEO_IGNORED).items()
              if v is not None}
    video_reader.finish("Omni video processor")
    vtaken.setdefault("patch_size", image.patch_size)
    vtaken.setdefault("downsample_ratio", image.downsample_ratio)

    proc_reader = KeyReader("processor_config.json", "processor", notes)
    ptaken = {k: v for k, v in proc_reader.sort(dict(processor or {}), mapped=_PROCESSOR_KEYS,
                                                specific=PROCESSOR_IGNORED).items() if v is not None}
    proc_reader.finish("Omni processor")
    vtaken["temporal_patch_size"] = ptaken.pop("video_temporal_patch_dim", 2)  # the processor's value packs
    video_config = OmniVideoConfig(norm_mean=tuple(vmean or image.norm_mean), norm_std=tuple(vstd or image.norm_std),
                                   **vtaken)
    mel = MelConfig() if feature_extractor is None else mel_config_from_preprocessor(
        dict(feature_extractor), where="processor_config.json (feature_extractor)", notes=notes)
    for key, value in (("audio_sampling_rate", mel.sampling_rate), ("audio_hop_length", mel.hop_length)):
        if key in ptaken:
            _same(ptaken.pop(key), value, f"the processor's {key}", "the feature extractor's")
    encoder = ParakeetConfig()
    if model is not None:
        _same(model.vision.patch_size, image.patch_size, "the vision tower's patch_size", "the image patch_size")
        _same(model.vision.patch_size, video_config.patch_size, "the vision tower's patch_size",
              "the video patch_size")
        _same(model.merge_size, image.merge, "the model's pixel-shuffle factor", "the image processor's")
        _same(model.merge_size, video_config.merge, "the model's pixel-shuffle factor", "the video processor's")
        _same(model.video_temporal_patch_size, video_config.temporal_patch_size, "the model's "
              "video_temporal_patch_size", "the processor's video_temporal_patch_dim")
        encoder = model.audio or encoder
        if model.audio is not None and feature_extractor is None:
            # a released directory has no feature-extractor file: its remote code (and vLLM) build the extractor from
            # the audio config, whose num_mel_bins sets the bins (the extractor's other defaults are the released ones)
            mel = dataclasses.replace(mel, feature_size=model.audio.num_mel_bins)
        elif model.audio is not None:
            _same(model.audio.num_mel_bins, mel.feature_size, "the audio encoder's num_mel_bins",
                  "the feature extractor's feature_size")
    if "audio_subsampling_factor" in ptaken:
        _same(encoder.subsampling_factor, ptaken.pop("audio_subsampling_factor"),
              "the audio encoder's subsampling_factor", "the processor's audio_subsampling_factor")
    return OmniProcessingConfig(image=image, video=video_config, mel=mel, audio_encoder=encoder)


def _same(a, b, what_a: str, what_b: str) -> None:
    if a != b:
        raise ConfigError(f"{what_a} is {a!r} but {what_b} is {b!r}; the processor and the model must agree")


def _read_json(path: Path) -> dict | None:
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def read_processing_files(directory) -> tuple[dict | None, dict | None, dict | None, dict | None]:
    """(image processor, video processor, processor, feature extractor) dicts of a checkpoint directory: the
    transformers 4 files (`preprocessor_config.json`, `video_preprocessor_config.json`) or the sections of
    transformers 5's `processor_config.json`."""
    directory = Path(directory)
    processor = _read_json(directory / "processor_config.json") or {}
    image = _read_json(directory / "preprocessor_config.json") or processor.get("image_processor")
    video = _read_json(directory / "video_preprocessor_config.json") or processor.get("video_processor")
    own = {k: v for k, v in processor.items() if k not in ("image_processor", "video_processor", "feature_extractor")}
    return image, video, own or None, processor.get("feature_extractor")


# --- the call ------------------------------------------------------------------------------------------------
@dataclass
class OmniMediaInfo:
    """Per-item metadata for token reduction, stats and the UI."""
    kind: str  # "image" | "video" | "audio"
    num_tokens: int  # placeholders the item fills (full length for video: EVS prunes after the encoder)
    grid: tuple[int, int] | None = None  # images: (rows, cols) in patches; videos: the tile's
    image_size: tuple[int, int] | None = None  # images: (width, height)
    num_frames: int = 0  # videos: real frames (tubelets = ceil(num_frames / temporal_patch_size))
    frame_indices: list[int] = field(default_factory=list)
    timestamps: list[float] = field(default_factory=list)
    fps: float | None = None
    num_samples: int = 0  # audio: samples at the processor's rate
    from_video: bool = False  # audio: the sound track of the video before it (`use_audio_in_video`)


@dataclass
class OmniInputs:
    input_ids: torch.Tensor  # (1, t)
    pixel_values: torch.Tensor | None  # (total_patches, 3 * p * p): every image's patches, in prompt order
    image_grid_hw: torch.Tensor | None  # (num_images, 2) long: (rows, cols) per image
    pixel_values_videos: torch.Tensor | None  # (num_videos, num_tubelets, t * 3, H, W)
    video_num_frames: list[int]
    audio: list[np.ndarray]  # float32 mono waveforms at 16 kHz, in prompt order
    input_features: torch.Tensor | None  # (num_clips, T, n_mels) normalised log-mel frames, clips padded
    input_features_mask: torch.Tensor | None  # (num_clips, T) bool: each clip's real frames
    audio_num_tokens: list[int]
    items: list[OmniMediaInfo]
    prompt: chat.RenderedPrompt
    text: str  # the expanded prompt
    notes: list[str] = field(default_factory=list)

    @property
    def opened_think(self) -> bool:
        return self.prompt.prompt_opened_think

    @property
    def media_order(self) -> list[str]:
        """"image" / "video" for each visual item in prompt order: both fill `<image>` placeholders, so a prompt
        holding both tells the model (vl/modeling/omni.py) which run is which."""
        return [i.kind for i in self.items if i.kind != "audio"]

    def model_inputs(self) -> dict:
        """The keyword arguments of the Omni model's forward."""
        return {"input_ids": self.input_ids, "pixel_values": self.pixel_values, "image_grid_hw": self.image_grid_hw,
                "pixel_values_videos": self.pixel_values_videos, "input_features": self.input_features,
                "input_features_mask": self.input_features_mask, "media_order": self.media_order}


# Nano V2 VL's tiling and PDF options with their defaults (vl/processing/processor.py `Processor.__call__`); PDF
# parts are refused here, so the PDF options never act
TILE_OPTIONS = {"max_num_tiles": None, "skip_blank_tiles": False, "pages": None, "max_pages": None,
                "pdf_scale": None, "reserved_tokens": None}


def _no_pdf(source):
    raise chat.PromptFormatError("PDF parts are not supported by the Omni processor yet; send the pages as images")


class OmniProcessor:
    """The Omni twin of `Processor` (vl/processing/processor.py): same messages, same chat format, same source
    rules (local paths or bytes; URLs never fetched; `allowed_roots`), same limits."""
    has_vision = True

    def __init__(self, tokenizer, config: OmniProcessingConfig, *, limits: MediaLimits = DEFAULT_LIMITS,
                 allowed_roots=None, isolate: bool = False, video_backend: str = "decord",
                 timestamp_convention: str = "exact", image_token_id: int | None = None,
                 audio_token_id: int | None = None, has_audio: bool = True):
        """`has_audio`: the model has an audio encoder (a checkpoint without `audio_config` has none: audio parts
        are refused and a video's sound is not used)."""
        self.tokenizer, self.config, self.limits = tokenizer, config, limits
        self.has_audio = has_audio
        self.allowed_roots = None if allowed_roots is None else [Path(r).resolve() for r in allowed_roots]
        self.isolate, self.video_backend, self.timestamp_convention = isolate, video_backend, timestamp_convention
        self.tokens = config.tokens
        self.image_token_id = self._token_id(self.tokens.img_context, image_token_id)
        self.audio_token_id = self._token_id(self.tokens.audio_context, audio_token_id)
        self.chars_per_token = max_chars_per_token(tokenizer)

    @classmethod
    def from_pretrained(cls, directory, tokenizer=None, *, model: OmniConfig | None = None, **kwargs):
        """From a checkpoint directory's small files (tokenizer and processor configs); no weights are opened."""
        from transformers import AutoTokenizer, PreTrainedConfig

        config = omni_processing_from_hf(*read_processing_files(directory), model=model)
        # never the directory's remote code, and a blank model config: a released directory's model_type is its
        # remote class's name, unknown to transformers, while its tokenizer_config.json names the tokenizer's class
        tokenizer = tokenizer or AutoTokenizer.from_pretrained(str(directory), trust_remote_code=False,
                                                               config=PreTrainedConfig())
        ids = {} if model is None else {"image_token_id": model.tokens.image_token_id,
                                        "audio_token_id": model.tokens.audio_token_id,
                                        "has_audio": model.audio is not None}
        return cls(tokenizer, config, **ids, **kwargs)

    def _token_id(self, text: str, configured: int | None) -> int:
        return special_token_id(self.tokenizer, text, configured)

    def _check_source(self, source):
        return checked_source(source, self.allowed_roots)

    def __call__(self, messages, *, thinking: bool | None = None, add_generation_prompt: bool = True,
                 fps: float = 2.0, max_frames: int = 128, context_length: int | None = None,
                 use_audio_in_video: bool | None = None, template_kwargs: Mapping | None = None,
                 **tile_options) -> OmniInputs:
        """`use_audio_in_video`: a video's sound track follows its frames as an audio run (None: when the model
        hears). `tile_options`: Nano V2 VL's tiling and PDF options (`max_num_tiles`, `skip_blank_tiles`, `pages`,
        ...), accepted so that one request works with both families; images are seen at native resolution here, so
        they are not used, and a value other than the default is named in a note."""
        unknown = sorted(k for k in tile_options if k not in TILE_OPTIONS)
        if unknown:
            raise TypeError(f"OmniProcessor got unexpected keyword arguments {unknown}")
        unused = sorted(k for k in ("max_num_tiles", "skip_blank_tiles") if tile_options.get(k, TILE_OPTIONS[k])
                        not in (TILE_OPTIONS[k], None))
        counts = count_media_parts(messages)
        for kind, count in counts.items():  # before anything is decoded (matrix I10)
            self.limits.check_count(kind, count)
        if counts["audio"] and not self.has_audio:
            raise NoAudioError("this checkpoint has no audio encoder (its config.json has no audio_config); send "
                             "images, videos or text only")
        hear = self.has_audio if use_audio_in_video is None else bool(use_audio_in_video)
        prompt = chat.render_prompt(messages, self.tokenizer, thinking=thinking,
                                    add_generation_prompt=add_generation_prompt, pdf_pages=_no_pdf,
                                    tokens=self.tokens, template_kwargs=template_kwargs)
        check_prompt_size(prompt.text, self.tokenizer, self.chars_per_token, context_length)  # before decoding
        media, cfg, work = prompt.media, self.config, Work.current()
        notes = list(prompt.notes) + ([f"{', '.join(unused)}: Nano V2 VL's tiling options; Nemotron 3 Nano Omni "
                                       "sees images at native resolution, so they were not used"] if unused else [])
        if hear and not self.has_audio and any(m.kind == "video" for m in media):
            notes.append("this checkpoint has no audio encoder: the video's sound was not used")
            hear = False
        images = [m for m in media if m.kind == "image"]
        work.report("decoding images", 0, len(media))
        decoded = load_omni_images([self._check_source(m.source) for m in images], cfg.image, limits=self.limits,
                                   isolate=self.isolate)
        by_item = dict(zip(map(id, images), decoded))
        runs, infos, videos, clips = [], [], [], []
        names = item_names([m.kind for m in media])
        for k, item in enumerate(media):
            opts = item.options  # the part's own options, checked by their ranges (chat.PART_OPTIONS)
            if item.kind == "image":
                img = by_item[id(item)]
                runs.append(chat.image_placeholder(1, img.num_tokens, self.tokens))
                infos.append(OmniMediaInfo("image", img.num_tokens, img.grid, img.image_size))
            elif item.kind == "video":
                work.report(f"decoding the video (up to {opts.get('max_frames', max_frames)} frames)", k, len(media))
                with naming(names[k]):
                    vid = load_omni_video(self._check_source(item.source), cfg.video,
                                          target_fps=opts.get("fps", fps),
                                          max_frames=opts.get("max_frames", max_frames),
                                          backend=self.video_backend, timestamp_convention=self.timestamp_convention,
                                          limits=self.limits, isolate=self.isolate)
                videos.append(vid)
                runs.append(self._video_run(vid))
                infos.append(self._video_info(vid))
                if hear:
                    wave, note = self._video_sound(item.source)
                    if note:  # without its sound the video is seen only; audio sent beside it is still heard
                        heard_beside = " (the audio sent beside it was heard)" if counts["audio"] else ""
                        notes.append(f"the video's sound: {note}" if wave is not None
                                     else f"answered from the frames only: {note}{heard_beside}")
                    if wave is not None:
                        n = cfg.audio_tokens(len(wave))
                        clips.append(wave)
                        runs[-1] += chat.audio_placeholder(n, self.tokens)
                        infos.append(OmniMediaInfo("audio", n, num_samples=len(wave), from_video=True))
                frames = vid.frames
                if frames.partial:
                    notes.append("some video frames could not be decoded and were skipped")
                if frames.backend_note:
                    notes.append(f"video decoded with PyAV instead of {self.video_backend}: {frames.backend_note}")
            else:
                work.report("decoding audio", k, len(media))
                with naming(names[k]):
                    wave = self._load_audio(self._check_source(item.source))
                n = cfg.audio_tokens(len(wave))
                clips.append(wave)
                runs.append(chat.audio_placeholder(n, self.tokens))
                infos.append(OmniMediaInfo("audio", n, num_samples=len(wave)))
        if media:
            work.report("media ready", len(media), len(media))
        return self.assemble(prompt, runs, infos, decoded, videos, clips, notes, context_length)

    def _video_run(self, vid: OmniVideo) -> str:
        stamps = None if vid.frames is None else vid.frames.timestamps_s
        return chat.tubelet_video_placeholder(vid.num_frames, vid.tokens_per_tubelet,
                                              self.config.video.temporal_patch_size, stamps, self.tokens)

    def _video_info(self, vid: OmniVideo) -> OmniMediaInfo:
        p = self.config.video.patch_size
        grid = (int(vid.tubelets.shape[-2]) // p, int(vid.tubelets.shape[-1]) // p)
        frames = vid.frames
        return OmniMediaInfo("video", vid.num_tokens, grid, num_frames=vid.num_frames,
                             frame_indices=[] if frames is None else list(frames.frame_indices),
                             timestamps=[] if frames is None else list(frames.timestamps_s),
                             fps=None if frames is None else frames.fps)

    def _video_sound(self, source) -> tuple[np.ndarray | None, str]:
        """A video's sound track on the frames' time axis (sample k is heard at k / 16000 s, the axis of the frame
        timestamps: a track that starts late is led by silence, samples before the picture's start are dropped), or (None, why) when it cannot be heard: no track, or
        one that is refused, corrupt, over a cap or too short. The frames answer either way."""
        clip, note = audio.load_video_audio(self._check_source(source), limits=self.limits, isolate=self.isolate)
        if clip is None:
            return None, note
        wave = clip.waveform
        shift = int(round(clip.start_s * audio.SAMPLE_RATE))  # > 0: the sound starts late; < 0: early (priming)
        if shift > 0:
            wave = np.concatenate([np.zeros(shift, np.float32), wave])
        elif shift < 0:
            wave = wave[-shift:]
        if len(wave) < 2 * self.config.mel.hop_length:
            return None, "the video's audio track is too short to hear (under two feature frames)"
        return wave, note

    def _load_audio(self, source) -> np.ndarray:
        """A clip as float32 mono samples at 16 kHz: an array given as such, else decoded (with its caps, sandbox and
        typed errors) by vl/processing/audio.py."""
        if isinstance(source, (np.ndarray, torch.Tensor)):
            wave = np.asarray(source.detach().cpu().numpy() if isinstance(source, torch.Tensor) else source)
            if wave.ndim == 2 and 1 in wave.shape:
                wave = wave.reshape(-1)
            if wave.ndim != 1 or wave.size == 0 or not np.issubdtype(wave.dtype, np.floating):
                raise InputError(f"an audio array must be 1-D float samples at {audio.SAMPLE_RATE} Hz, "
                                 f"found {wave.dtype} {wave.shape}")
            if wave.size > self.limits.max_audio_duration_s * audio.SAMPLE_RATE:
                raise MediaTooLargeError(f"the audio array holds {wave.size / audio.SAMPLE_RATE:.0f} s, the cap is "
                                         f"{self.limits.max_audio_duration_s:.0f} s; cut it")
            return wave.astype(np.float32, copy=False)
        return audio.load_audio(source, limits=self.limits, isolate=self.isolate).waveform

    def assemble(self, prompt, runs, infos, images, videos, clips, notes, context_length=None) -> OmniInputs:
        """A rendered prompt and its decoded media (one run and one `OmniMediaInfo` per item, in order) -> `OmniInputs`:
        placeholders expanded, tokenized, counts checked, pixels, tubelets and mel features stacked. The app builds a
        conversation's inputs from media it decoded once (ui/chat_media_omni.py) through here."""
        text = chat.expand_placeholders(prompt.text, runs, self.tokens, video_prefix=chat.TUBELET_VIDEO_PREFIX)
        input_ids = torch.tensor([self.tokenizer(text, add_special_tokens=False)["input_ids"]], dtype=torch.long)
        fixed = int(input_ids.shape[1]) - sum(i.num_tokens for i in infos if i.kind == "video")
        if context_length is not None and fixed > context_length:  # before any encoder runs (EVS prunes only video)
            heard = sum(i.num_tokens for i in infos if i.kind == "audio")
            raise ContextLengthError(f"the prompt has {fixed} tokens besides its video frames ({heard} of them audio: "
                                     f"{heard * 0.08:.0f} s at 80 ms per token) but the model's context is "
                                     f"{context_length}; send shorter audio or fewer images")
        visual = sum(i.num_tokens for i in infos if i.kind != "audio")
        heard = sum(i.num_tokens for i in infos if i.kind == "audio")
        for token, token_id, expected in ((self.tokens.img_context, self.image_token_id, visual),
                                          (self.tokens.audio_context, self.audio_token_id, heard)):
            found = int((input_ids == token_id).sum())
            if found != expected:
                raise InputError(f"the prompt text itself contains {found - expected} extra {token!r} tokens; "
                                 "remove them from the messages")
        # one item: its own tensor (a view), not a copy; a long video's tubelets are hundreds of MB of float32
        pixel_values = (images[0].pixel_values if len(images) == 1 else torch.cat([i.pixel_values for i in images])
                        ) if images else None
        grids = torch.tensor([i.grid for i in images], dtype=torch.long) if images else None
        tubelets = None
        if videos:
            if len({tuple(v.tubelets.shape) for v in videos}) > 1:
                raise InputError("the videos of one request must have the same frame size and number of tubelets "
                                 f"(found {sorted({tuple(v.tubelets.shape) for v in videos})}); send them one per "
                                 "request")
            tubelets = videos[0].tubelets[None] if len(videos) == 1 else torch.stack([v.tubelets for v in videos])
        features = mask = None
        if clips:
            features, mask = log_mel_features(clips, self.config.mel)
        return OmniInputs(input_ids, pixel_values, grids, tubelets, [v.num_frames for v in videos], clips, features,
                          mask, [i.num_tokens for i in infos if i.kind == "audio"], infos, prompt, text, notes)

    # --- helpers -----------------------------------------------------------------------------------------
    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def stop_token_ids(self) -> set[int]:
        return tokenizer_stop_ids(self.tokenizer)

