"""`vl bench --geometry G --media`: one real request end to end at the released widths, each stage timed.

A page or a video (Nemotron Nano 12B v2 VL) or a long video with its sound track (Nemotron 3 Nano Omni) goes
through `vl.Engine.chat` as a user's request does: media decode -> tiles / tubelets (+ mel features) -> vision
tower -> projector -> token reduction -> audio encoder -> placeholder merge -> LLM prefill -> first token. The LLM
is the geometry's random checkpoint, written and loaded as `vl bench --geometry` does (vl/bench/geometry.py:
streamed FP8 / NVFP4, loaded weight-only; the Omni MoE with its routed experts kept packed); the towers are built
in memory at their released widths with random BF16 weights (vl/modeling/random_init.py), and get the CPU matmul
passes `vl.load_pretrained` gives every loaded model. The tokenizer is the demo model's (its ids sit inside the
LLM's vocabulary; the Omni audio tokens are added).

After one small untimed warm-up request (`warm_up`), per request (`max_new_tokens` 1, so the request ends at its first token; the engine's encoder cache is off, so
every request runs its towers): time to first token and `Stats.stages_s` (media, vision, audio, prefill) with what
they leave out of the TTFT; the resident memory sampled every 2 ms (vl/bench/timing.py `PeakRSS`), its peak per
stage: the stage boundaries are marked where the engine calls the model's encoders and merge (`stage_marks`); the
prompt's vision tokens before / after reduction and its audio tokens.

Items: `page` (a synthetic document image that tiles into 12 tiles + the thumbnail), `page-pruned` (the same
page with document token pruning `token_pruning_rate` 0.5), `video` (64 frames, EVS 0.75) for nano-12b-v2-vl;
`video-speech` (a 10-minute H.264 + AAC video in one request, frames and sound track: `use_audio_in_video` at its
default, on) and `video-speech-16k` (5 minutes of the same, 80 frames: a prompt of about 15k tokens, within a 16k
context) for nano-omni-30b-a3b.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont
from transformers import AutoTokenizer

from vl.bench import geometry as bench_geometry
from vl.bench import omni_geometry
from vl.bench.timing import PeakRSS
from vl.checkpoint.files import CheckpointFiles, save_tensors
from vl.checkpoint.load import MAPPED_MIN_BYTES
from vl.config import LMConfig, VisionConfig, VLConfig
from vl.config.omni import OmniConfig, OmniTokenConfig, omni_30b_a3b
from vl.config.parakeet import ParakeetConfig
from vl.directory import default_model
from vl.errors import ConfigError
from vl.modeling.omni import NemotronOmni
from vl.modeling.random_init import randomize_
from vl.modeling.vlm import NemotronVL
from vl.processing import chat
from vl.processing.audio_features import MelConfig
from vl.processing.omni_images import OmniImageConfig
from vl.processing.omni_processor import OmniProcessingConfig, OmniProcessor
from vl.processing.omni_video import OmniVideoConfig
from vl.processing.processor import Processor
from vl.quant.linear import resident_weight_bytes
from vl.runtime.cpu import encoder_pages
from vl.runtime.cpu.heap import trim_heap
from vl.runtime.cpu.matmul import gemv_decode_linears, onednn_fp32_matmuls, upcast_16bit_matmuls
from vl.runtime.engine import Engine

ITEMS = {"nano-12b-v2-vl": ("page", "page-pruned", "video"), omni_geometry.NAME: ("video-speech", "video-speech-16k")}
PAGE_SIZE = (2048, 1536)  # 4:3 -> a 4 x 3 grid of 512-px tiles + the thumbnail = 13 tiles
VIDEO_FRAMES, VIDEO_EVS = 64, 0.75
PAGE_PRUNING = 0.5
SPEECH_SECONDS = 600.0
SPEECH_16K = (300.0, 80)  # seconds, frames: 40 tubelets (10,080 tokens) + 3,750 audio tokens + text ~ 15k tokens
STAGES = ("media", "vision", "audio", "prefill")
QUESTION = "What does it say? Answer in one sentence."


# --- the models ---------------------------------------------------------------------------------------------
def nano_12b_vl(lm: LMConfig) -> VLConfig:
    """Nano V2 VL at its released widths around `lm`: RADIO ViT-H/16 (1280 wide, 32 blocks, 16 heads, MLP 5120,
    8 prefix rows), 512-px tiles, pixel shuffle 2 x 2, projector 5120 -> 20480 -> LLM width (docs/format.md §2)."""
    return VLConfig(lm=lm, vision=VisionConfig(model="vit_huge_patch16_224", num_prefix_tokens=8),
                    force_image_size=512, projector_hidden_size=20480, vit_hidden_size=1280)


def omni_released(lm: LMConfig) -> OmniConfig:
    """Nemotron 3 Nano Omni at its released widths around `lm` (`omni_30b_a3b`: RADIO ViT-H/16 with the tubelet
    embedder, projector 20480, Parakeet 1024 wide x 24 layers, 8 heads, FF 4096, conv kernel 9, x8 subsampling with
    256 channels, 128 mel bins, audio projector 4096), with the vision final LayerNorm of an LLM with MTP layers."""
    return omni_30b_a3b(lm=lm, lm_mtp_layers=1)


def _random_part(module: torch.nn.Module, dtype: torch.dtype, seed: int) -> None:
    """A part built on the meta device -> random weights in `dtype` on the CPU (batch-norm statistics at 0 / 1), with
    the CPU matmul passes of `vl.load_pretrained` (vl/runtime/pretrained.py `runtime_passes`)."""
    module.to(dtype).to_empty(device="cpu")
    randomize_(module, seed)
    with torch.no_grad():
        for name, b in module.named_buffers():
            b.fill_(1 if name.endswith("running_var") else 0)
    _cpu_passes(module)


def _cpu_passes(module: torch.nn.Module) -> None:
    """Inference mode and the CPU matmul passes of `vl.load_pretrained` (vl/runtime/pretrained.py `runtime_passes`)."""
    module.eval().requires_grad_(False)
    upcast_16bit_matmuls(module)
    onednn_fp32_matmuls(module)
    gemv_decode_linears(module)


def _model_on_meta(cfg: VLConfig | OmniConfig):
    with torch.device("meta"):
        return NemotronOmni(cfg) if isinstance(cfg, OmniConfig) else NemotronVL(cfg)


def _parts(model):
    """(index, name, part) of the parts outside the LLM, numbered as `named_children` does (the parts' seeds)."""
    return [(i, name, part) for i, (name, part) in enumerate(model.named_children())
            if name != "language_model" and any(True for _ in part.parameters())]


def write_towers(cfg: VLConfig | OmniConfig, path: Path, dtype=torch.bfloat16, seed: int = 0) -> int:
    """The parts of `cfg` outside the LLM, random at their widths (`assemble`'s weights, seed for seed), saved as one
    safetensors file in `path` under their native names: a checkpoint's towers, for `assemble(..., towers=path)`.
    Built one part at a time, each freed once written. -> bytes written."""
    model, total = _model_on_meta(cfg), 0
    for i, name, part in _parts(model):
        _random_part(part, dtype, seed + i)
        tensors = {f"{name}.{k}": v for k, v in part.state_dict().items()}
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        save_tensors(tensors, path / name)
        del tensors
        part.to("meta")
        trim_heap()
    return total


def _tower_part(part: torch.nn.Module, path: Path, mapped: bool) -> int:
    """Assign `part`'s tensors from the file `write_towers` wrote: read into memory, or with `mapped` the large ones
    as views of its map, as the loader maps a checkpoint's encoder weights in `release` mode (vl/checkpoint/load.py
    `encoder_names`); then the CPU matmul passes of `_random_part`. -> mapped bytes."""
    files = CheckpointFiles(path)
    whole = {n for n, info in files.infos.items() if info.nbytes >= MAPPED_MIN_BYTES} if mapped else set()
    prefix = len(path.name) + 1
    part.load_state_dict({n[prefix:]: t for n, t in files.load_all(whole=whole).items()}, strict=True, assign=True)
    _cpu_passes(part)
    return sum(files.infos[n].nbytes for n in whole)


def assemble(cfg: VLConfig | OmniConfig, lm: torch.nn.Module, dtype=torch.bfloat16, seed: int = 0,
             towers: Path | None = None):
    """The composed model of `cfg` around a loaded LLM `lm`: the other parts random at `cfg`'s widths. Built on the
    meta device first, so the LLM is never materialised twice. `towers`: where `write_towers` saved those parts;
    they are loaded from there, mapped when `vl.load_pretrained` would choose `release` for a checkpoint of the
    LLM's and the towers' bytes on this machine (vl/runtime/cpu/encoder_pages.py)."""
    model = _model_on_meta(cfg)
    model.language_model = lm
    release = towers is not None and encoder_pages.choose(
        resident_weight_bytes(lm) + sum(f.stat().st_size for f in towers.rglob("*.safetensors"))) == "release"
    mapped = 0
    for i, name, part in _parts(model):
        if towers is None:
            _random_part(part, dtype, seed + i)
        else:
            mapped += _tower_part(part, towers / name, release)
    model.encoder_pages = "release" if mapped else "keep"
    model.mapped_encoder_bytes = mapped
    encoder_pages.install(model)
    return model.eval()


def tokenizer(omni: bool):
    """The demo model's tokenizer (chat format and media tokens), with the Omni audio tokens when `omni`."""
    tok = AutoTokenizer.from_pretrained(default_model())
    if omni:
        t = chat.OMNI_TOKENS
        tok.add_special_tokens({"additional_special_tokens": [t.audio_start, t.audio_context, t.audio_end]})
    return tok


def processor_for(cfg: VLConfig | OmniConfig):
    """(the processor of `cfg` over the demo tokenizer, `cfg` with the tokenizer's media token ids)."""
    omni = isinstance(cfg, OmniConfig)
    tok = tokenizer(omni)
    image_id = tok.convert_tokens_to_ids("<image>")
    if omni:
        audio_id = tok.convert_tokens_to_ids(chat.OMNI_TOKENS.audio_context)
        cfg = cfg.replace(tokens=OmniTokenConfig(image_token_id=image_id, video_token_id=image_id,
                                                 audio_token_id=audio_id))
        v = cfg.vision
        processing = OmniProcessingConfig(
            image=OmniImageConfig(norm_mean=v.norm_mean, norm_std=v.norm_std, patch_size=v.patch_size,
                                  downsample_ratio=cfg.downsample_ratio),
            video=OmniVideoConfig(norm_mean=v.norm_mean, norm_std=v.norm_std, patch_size=v.patch_size,
                                  downsample_ratio=cfg.downsample_ratio,
                                  temporal_patch_size=cfg.video_temporal_patch_size),
            mel=MelConfig(feature_size=cfg.audio.num_mel_bins) if cfg.audio else MelConfig(),
            audio_encoder=cfg.audio or ParakeetConfig())
        processor = OmniProcessor(tok, processing, image_token_id=image_id, audio_token_id=audio_id,
                                  has_audio=cfg.audio is not None)
    else:
        cfg = cfg.replace(tokens=dataclasses.replace(cfg.tokens, img_context_id=image_id,
                                                     video_context_id=tok.convert_tokens_to_ids("<video>")))
        processor = Processor(tok, cfg)
    if len(tok) > cfg.lm.vocab_size:
        raise ConfigError(f"the demo tokenizer's {len(tok)} ids do not fit the LLM's vocabulary of {cfg.lm.vocab_size}")
    return processor, cfg


def engine_for(cfg: VLConfig | OmniConfig, lm: torch.nn.Module, dtype=torch.bfloat16,
               towers: Path | None = None) -> Engine:
    """An `Engine` over `assemble(cfg, lm)` with the processor of `cfg` and no encoder cache (each request runs the
    towers). Media token ids are taken from the tokenizer."""
    processor, cfg = processor_for(cfg)
    return Engine(assemble(cfg, lm, dtype, towers=towers), processor, vision_cache_size=0)


# --- the media ----------------------------------------------------------------------------------------------
def write_page(path, size=PAGE_SIZE, seed: int = 0) -> str:
    """A synthetic document page: a title, paragraphs of random words, a table with rules, white margins."""
    rng = np.random.default_rng(seed)
    w, h = size
    img = Image.new("RGB", size, "white")
    d = ImageDraw.Draw(img)
    font = ImageFont.load_default(size=max(8, h // 60))
    big = ImageFont.load_default(size=max(10, h // 25))
    words = ["total", "invoice", "amount", "date", "name", "page", "report", "quarter", "revenue", "the", "of",
             "and", "number", "account", "balance", "summary", "item", "price", "tax", "due"]
    d.text((w // 12, h // 20), "Quarterly report", fill="black", font=big)
    y, step = h // 7, max(10, h // 40)
    while y < h * 0.55:
        d.text((w // 12, y), " ".join(rng.choice(words, 12)), fill="black", font=font)
        y += step
    top, rows, cols = int(h * 0.6), 8, 4
    for r in range(rows + 1):
        d.line((w // 12, top + r * step * 1.5, w * 11 // 12, top + r * step * 1.5), fill="black", width=2)
    for r in range(rows):
        for c in range(cols):
            d.text((w // 12 + c * (w * 10 // 12) // cols + 8, top + r * step * 1.5 + 4),
                   f"{rng.integers(0, 10000)}" if c else str(rng.choice(words)), fill="black", font=font)
    img.save(path)
    return str(path)


def write_video(path, seconds: float, fps: int = 4, size=(640, 360), sound: bool = False) -> str:
    """An H.264 video (a bright bar moving over a dark field) with, when `sound`, a 16 kHz mono AAC track that
    changes pitch every 0.4 s like syllables (a synthetic stand-in for speech). Written frame by frame: a
    10-minute file takes a few seconds of memory, not minutes of frames."""
    import av

    w, h = size
    frames, rate, step = int(round(seconds * fps)), 16000, 1024  # AAC frame size
    with av.open(str(path), "w") as c:
        v = c.add_stream("libx264", rate=fps, options={"preset": "ultrafast", "crf": "30"})
        v.width, v.height, v.pix_fmt = w, h, "yuv420p"
        a = c.add_stream("aac", rate=rate, layout="mono") if sound else None
        frame = np.zeros((h, w, 3), np.uint8)
        phase, done = 0.0, 0
        for i in range(frames):
            frame[:] = 20
            x = (i * 7) % max(1, w - 20)
            frame[:, x:x + 20] = 220
            for p in v.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                c.mux(p)
            while a is not None and done < (i + 1) * rate // fps:
                t = (done + np.arange(step)) / rate
                freq = 200 + 150 * ((np.floor(t / 0.4) * 7919) % 5)
                ph = phase + 2 * np.pi * np.cumsum(freq) / rate
                phase = float(ph[-1])
                fr = av.AudioFrame.from_ndarray((0.3 * np.sin(ph)).astype(np.float32)[None], format="fltp",
                                                layout="mono")
                fr.sample_rate, fr.pts = rate, done
                for p in a.encode(fr):
                    c.mux(p)
                done += step
        for stream in (v, a):
            for p in stream.encode() if stream is not None else ():
                c.mux(p)
    return str(path)


def requests(geometry: str, items, media_dir: Path, *, page_size=PAGE_SIZE, video_frames: int = VIDEO_FRAMES,
             speech_seconds: float = SPEECH_SECONDS, video_size=(640, 360)) -> dict[str, tuple[list, dict]]:
    """{item: (messages, options)}, writing the media files the items need into `media_dir`."""
    out, files = {}, {}

    def user(part):
        return [{"role": "user", "content": [part, {"type": "text", "text": QUESTION}]}]

    for item in items:
        if item in ("page", "page-pruned"):
            files.setdefault("page", write_page(media_dir / "page.png", page_size))
            out[item] = (user({"type": "image", "image": files["page"]}),
                         {"token_pruning_rate": PAGE_PRUNING if item == "page-pruned" else 0.0})
        elif item == "video":  # fps 2 over a clip of exactly `video_frames` / 2 seconds: that many frames
            files.setdefault("video", write_video(media_dir / "clip.mp4", video_frames / 2, fps=4, size=video_size))
            out[item] = (user({"type": "video", "video": files["video"]}),
                         {"video_pruning_rate": VIDEO_EVS, "fps": 2.0, "max_frames": video_frames})
        elif item == "video-speech":
            files.setdefault("speech", write_video(media_dir / "talk.mp4", speech_seconds, fps=2, size=video_size,
                                                   sound=True))
            out[item] = (user({"type": "video", "video": files["speech"]}), {})
        elif item == "video-speech-16k":
            seconds, frames = SPEECH_16K
            files.setdefault("speech16k", write_video(media_dir / "talk5.mp4", min(seconds, speech_seconds), fps=2,
                                                      size=video_size, sound=True))
            out[item] = (user({"type": "video", "video": files["speech16k"]}), {"max_frames": frames})
        else:
            raise ConfigError(f"--media: unknown item {item!r} for {geometry}; expected some of "
                              f"{', '.join(ITEMS[geometry])}")
    return out


# --- one timed request --------------------------------------------------------------------------------------
@contextlib.contextmanager
def stage_marks(model, peak: PeakRSS):
    """Mark the peak-RSS phases where the engine enters the model: the first encoder call (or the merge, with no
    media) closes "media"; an audio encoder call closes "vision" when a vision encoder ran before it, and its return
    closes "audio"; the merge's return (EVS and token pruning run in it) closes "vision+merge"; what follows, to the
    first token, is "prefill". The wrappers are instance attributes that shadow the methods for the request only."""
    state = {"started": False, "vision": False}

    def wrap(name, kind):
        fn = getattr(model, name)

        def wrapped(*args, **kwargs):
            if not state["started"]:
                peak.mark("media")
                state["started"] = True
            if kind == "audio" and state["vision"]:
                peak.mark("vision")
            state["vision"] = kind == "vision"
            out = fn(*args, **kwargs)
            if kind in ("audio", "merge"):
                peak.mark("audio" if kind == "audio" else "vision+merge")
            return out
        setattr(model, name, wrapped)
        return name

    names = [wrap(n, "vision") for n in ("encode_tiles", "encode_images", "encode_videos") if hasattr(model, n)]
    if hasattr(model, "encode_audio"):
        names.append(wrap("encode_audio", "audio"))
    names.append(wrap("merge" if isinstance(model, NemotronOmni) else "prepare_inputs", "merge"))
    try:
        yield
    finally:
        for n in names:
            delattr(model, n)


def time_request(engine: Engine, messages, options: dict, decode_tokens: int = 0) -> dict:
    """One request through `Engine.chat` -> its TTFT, stages, memory and token counts; with `decode_tokens`, that
    many more tokens are decoded after the first (stop ids ignored) and their rate is reported (the "prefill" peak
    then covers them too: a decode step adds a row of cache per layer)."""
    model = engine.model
    load_before = os.getloadavg()[0]
    more = {"ignore_eos": True} if decode_tokens else {}
    with PeakRSS("cpu") as peak, stage_marks(model, peak):
        t0 = time.perf_counter()
        result = engine.chat(messages, max_new_tokens=1 + decode_tokens, **more, **options)
        wall = time.perf_counter() - t0
        peak.mark("prefill")
    s = result.stats
    stages = {k: s.stages_s[k] for k in STAGES if k in s.stages_s}
    phases = dict(peak.phases)
    if "vision+merge" in phases:  # the merge runs after the audio encoder on Omni: it counts with the vision stage
        phases["vision"] = max(phases.get("vision", 0), phases.pop("vision+merge"))
    accounted = sum(stages.values())
    ttft = s.time_to_first_token_s
    return dict(options=options, ttft_s=ttft, wall_s=wall, stages_s=stages, stages_sum_s=accounted,
                unaccounted_s=ttft - accounted, unaccounted_frac=(ttft - accounted) / ttft if ttft else math.nan,
                peak_rss_by_stage={k: phases[k] for k in STAGES if k in phases},
                peak_rss_bytes=peak.base + peak.peak, rss_before_bytes=peak.base,
                ru_maxrss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                prompt_tokens=s.prompt_tokens, vision_tokens_before=s.vision_tokens_before,
                vision_tokens_after=s.vision_tokens_after, audio_tokens=s.audio_tokens, notes=list(s.notes),
                new_tokens=s.new_tokens, decode_tokens_per_s=s.decode_tokens_per_s if decode_tokens else None,
                load_average=(load_before, os.getloadavg()[0]))


def warm_up(engine: Engine, media_dir: Path) -> float:
    """One small untimed request through the same paths (a one-tile image, or a 2-second clip with sound on a model
    that hears): what a process pays once (weights packed for the fused tower blocks, oneDNN primitives, the
    kernels' libraries, the heap's first pages) stays out of the timed requests. -> its seconds."""
    if getattr(engine.processor, "has_audio", False):
        part = {"type": "video", "video": write_video(media_dir / "warm.mp4", 2.0, fps=2, size=(320, 240), sound=True)}
    else:
        part = {"type": "image", "image": write_page(media_dir / "warm.png", (512, 512))}
    t0 = time.perf_counter()
    engine.chat([{"role": "user", "content": [part, {"type": "text", "text": QUESTION}]}], max_new_tokens=1)
    return time.perf_counter() - t0


# --- the run ------------------------------------------------------------------------------------------------
def released_config(geometry: str, lm_cfg: LMConfig):
    return omni_released(lm_cfg) if geometry == omni_geometry.NAME else nano_12b_vl(lm_cfg)


def checkpoint(geometry: str, fmt: str, lm_cfg: LMConfig, work: Path, layers: int | None, log) -> tuple[Path, bool]:
    """The geometry's random LLM checkpoint under `work` (vl/bench/geometry.py's streaming writer); one already there
    from an earlier `--keep` run of the same geometry, format and layers is reused. -> (path, reused)."""
    path = work / f"{geometry}-{fmt}" / ("all-layers" if layers is None else f"first-{layers}-layers")
    if (path / "model.safetensors").is_file() and (path / "config.json").is_file():
        log(f"[vl bench] reusing the checkpoint in {path}")
        return path, True
    t0 = time.perf_counter()
    bench_geometry.write_random_checkpoint(lm_cfg, fmt, path)
    log(f"[vl bench] wrote {path} in {time.perf_counter() - t0:.0f} s")
    return path, False


def run(geometry: str, fmt: str = "nvfp4", items=None, *, work_dir=None, layers: int | None = None,
        keep: bool = False, model_config=None, page_size=PAGE_SIZE, video_frames: int = VIDEO_FRAMES,
        speech_seconds: float = SPEECH_SECONDS, video_size=(640, 360), decode_tokens: int = 0, log=print) -> dict:
    """Write (or, with `keep`, reuse) and load the geometry's LLM, assemble the model around it, and time each
    item's request. `keep`: the checkpoint stays in `work_dir` for the next run. `model_config`: a `VLConfig` /
    `OmniConfig` instead of the released one (tests: tiny widths); its `lm` is what is written. `decode_tokens`:
    tokens decoded after each item's first, at its prompt's context (0: the first token only)."""
    if geometry not in ITEMS:
        raise ConfigError(f"--media: expected --geometry {' or '.join(ITEMS)}, found {geometry!r}")
    items = tuple(items or ITEMS[geometry])
    bad = [i for i in items if i not in ITEMS[geometry]]
    if bad:
        raise ConfigError(f"--media: {', '.join(bad)} not items of {geometry}; expected some of "
                          f"{', '.join(ITEMS[geometry])}")
    cfg = model_config or released_config(geometry, bench_geometry.geometry_config(geometry, layers))
    scratch = Path(tempfile.mkdtemp(prefix="vl-media-", dir=work_dir))
    work = Path(work_dir) if keep and work_dir else scratch
    released_layers = bench_geometry.GEOMETRIES[geometry]().num_hidden_layers
    result = dict(geometry=geometry, format=fmt, threads=torch.get_num_threads(), items={},
                  llm_layers=f"{len(cfg.lm.pattern)} of {released_layers}", llm_pattern=cfg.lm.pattern)
    try:
        path, result["checkpoint_reused"] = checkpoint(geometry, fmt, cfg.lm, work, layers, log)
        towers = scratch / "towers"
        t0 = time.perf_counter()
        result["towers_written_bytes"] = write_towers(cfg, towers)
        log(f"[vl bench] wrote the towers ({result['towers_written_bytes'] / 2**30:.2f} GiB) in "
            f"{time.perf_counter() - t0:.0f} s")
        t0 = time.perf_counter()
        lm = bench_geometry.load(path, cfg.lm)
        engine = engine_for(cfg, lm, towers=towers)
        result["encoder_pages"] = engine.model.encoder_pages
        result["load_s"] = time.perf_counter() - t0
        result["parts_bytes"] = {name: sum(p.numel() * p.element_size() for p in part.parameters())
                                 for name, part in engine.model.named_children()
                                 if name != "language_model" and any(True for _ in part.parameters())}
        result["llm_resident_bytes"] = resident_weight_bytes(lm)
        t0 = time.perf_counter()
        reqs = requests(geometry, items, scratch, page_size=page_size, video_frames=video_frames,
                        speech_seconds=speech_seconds, video_size=video_size)
        result["warm_up_s"] = warm_up(engine, scratch)
        log(f"[vl bench] media written in {time.perf_counter() - t0 - result['warm_up_s']:.0f} s, an untimed warm-up "
            f"request in {result['warm_up_s']:.0f} s; timing {', '.join(items)}")
        for item, (messages, options) in reqs.items():
            r = time_request(engine, messages, options, decode_tokens)
            result["items"][item] = r
            log(f"[vl bench] {item}: TTFT {r['ttft_s']:.1f} s; stages " + ", ".join(
                f"{k} {v:.1f} s" for k, v in r["stages_s"].items()) + "; peak RSS GiB " + ", ".join(
                f"{k} {v / 2**30:.2f}" for k, v in r["peak_rss_by_stage"].items()) + f"; prompt {r['prompt_tokens']}, "
                f"vision {r['vision_tokens_before']} -> {r['vision_tokens_after']}, audio {r['audio_tokens']}"
                + (f"; then {r['decode_tokens_per_s']:.2f} tok/s" if r["decode_tokens_per_s"] else ""))
        return result
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def format_result(r: dict) -> str:
    gib = 2**30
    parts = ", ".join(f"{k} {v / gib:.2f}" for k, v in r["parts_bytes"].items())
    lines = [f"{r['geometry']} {r['format']} end to end through vl.Engine.chat (random weights; LLM layers "
             f"{r['llm_layers']}, resident {r['llm_resident_bytes'] / gib:.2f} GiB; BF16 parts at their released "
             f"widths: {parts} GiB; encoder pages: {r.get('encoder_pages', 'keep')}), {r['threads']} CPU threads, "
             f"load {r['load_s']:.0f} s, untimed warm-up request {r['warm_up_s']:.0f} s",
             f"  {'item':<13} {'TTFT s':>8} " + " ".join(f"{k + ' s':>9}" for k in STAGES)
             + f" {'unacc.':>7}  peak RSS GiB: media / vision / audio / prefill (whole request); tokens"]
    for item, x in r["items"].items():
        st = " ".join(f"{x['stages_s'][k]:9.2f}" if k in x["stages_s"] else f"{'-':>9}" for k in STAGES)
        mem = " / ".join(f"{x['peak_rss_by_stage'][k] / gib:.2f}" if k in x["peak_rss_by_stage"] else "-"
                         for k in STAGES)
        lines.append(f"  {item:<13} {x['ttft_s']:8.2f} {st} {x['unaccounted_frac']:7.1%}  {mem} "
                     f"({x['peak_rss_bytes'] / gib:.2f}); prompt {x['prompt_tokens']}, vision "
                     f"{x['vision_tokens_before']} -> {x['vision_tokens_after']}, audio {x['audio_tokens']}; load "
                     f"average {x['load_average'][0]:.1f} -> {x['load_average'][1]:.1f}")
        if x.get("decode_tokens_per_s"):
            lines.append(f"    decode after the prompt: {x['new_tokens'] - 1} tokens at {x['decode_tokens_per_s']:.2f} "
                         f"tok/s")
        lines += [f"    note: {n}" for n in x["notes"]]
    if "page" in r["items"] and "page-pruned" in r["items"]:
        a, b = r["items"]["page"]["ttft_s"], r["items"]["page-pruned"]["ttft_s"]
        change = f"{1 - b / a:.0%} less" if b <= a else f"{b / a - 1:.0%} more (a noisy run: pruning does less work)"
        lines.append(f"  token pruning at {PAGE_PRUNING}: page TTFT {a:.1f} -> {b:.1f} s = {change}")
    return "\n".join(lines)
