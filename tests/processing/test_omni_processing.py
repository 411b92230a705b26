"""Omni processing against transformers' `nemotron_h_omni` processors on the same inputs: native-resolution patch
grids and pixels, tubelets, timestamps, placeholder runs and whole prompts (the same input_ids)."""

import math

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import ParakeetFeatureExtractor
from transformers.models.nemotron_h_omni.image_processing_nemotron_h_omni import (
    NemotronH_Omni_Reasoning_V3ImageProcessor as RefImageProcessor,
    get_patch_grid_size,
)
from transformers.models.nemotron_h_omni.processing_nemotron_h_omni import (
    NemotronH_Omni_Reasoning_V3Processor as RefProcessor,
)
from transformers.models.nemotron_h_omni.video_processing_nemotron_h_omni import (
    NemotronH_Omni_Reasoning_V3VideoProcessor as RefVideoProcessor,
)
from transformers.video_utils import VideoMetadata

from data_recipes.synthetic.export import write_mp4
from data_recipes.tokenizer import build_tokenizer
from vl.errors import ConfigError, MediaError, MediaTooLargeError, NoAudioError, RemoteMediaError, TooManyItemsError
from vl.processing import chat
from vl.processing.chat import OMNI_TOKENS, PromptFormatError
from vl.processing.limits import MediaLimits
from vl.processing.omni_images import (
    ImageAspectError,
    OmniImageConfig,
    load_omni_images,
    patch_budget,
    patch_grid,
    preprocess_omni_images,
)
from vl.modeling.parakeet import omni_embedding_lengths
from vl.processing.audio_features import log_mel_features
from vl.processing.omni_processor import OmniProcessingConfig, OmniProcessor, omni_processing_from_hf
from vl.processing.omni_video import OmniVideoConfig, frame_grid, load_omni_video, omni_video_from_frames

MEAN, STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
TOL = dict(rtol=1e-5, atol=1e-6)
SIDES = [1, 2, 15, 16, 17, 31, 32, 33, 48, 63, 64, 100, 255, 256, 257, 513, 1023, 1024, 1025, 3000, 4096, 8000,
         20000, 300000]


def rng_pixels(seed, *shape):
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


@pytest.fixture(scope="module")
def tokenizer():
    tok = build_tokenizer(["What is said while the dog runs? Describe the image and the sound."] * 8, 320)
    tok.add_special_tokens({"additional_special_tokens": [OMNI_TOKENS.audio_start, OMNI_TOKENS.audio_context,
                                                          OMNI_TOKENS.audio_end]})
    tok.chat_template = None  # our renderer; the string-template path is checked in its own test
    return tok


def ref_processor(tokenizer, image_kwargs=None, video_kwargs=None, mel_bins=80):
    return RefProcessor(image_processor=RefImageProcessor(image_mean=list(MEAN), image_std=list(STD),
                                                          **(image_kwargs or {})),
                        video_processor=RefVideoProcessor(norm_mean=list(MEAN), norm_std=list(STD),
                                                          **(video_kwargs or {})),
                        tokenizer=tokenizer, feature_extractor=ParakeetFeatureExtractor(feature_size=mel_bins))


# --- images ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("budget", [(1024, 13312, 2), (16, 256, 2), (4, 10**9, 2), (64, 64, 2), (100, 400, 3),
                                    (1, 5, 1)])
def test_patch_grid_equals_transformers_or_refuses_a_zero_side(budget):
    lo, hi, merge = budget
    compared = refused = 0
    for h in SIDES:
        for w in SIDES:
            try:
                ref = get_patch_grid_size(h, w, 16, merge, lo, hi)
            except ZeroDivisionError:  # transformers divides by a zero-patch side
                ref = None
            try:
                ours = patch_grid(h, w, patch_size=16, merge=merge, min_patches=lo, max_patches=hi)
            except ImageAspectError:
                ours = None
            if ref is not None and 0 in ref:  # transformers returns a grid with a zero side (no image to resize)
                ref = None
            assert ours == ref, (h, w)
            compared += ours is not None
            refused += ours is None
            if ours is not None:
                assert ours[0] % merge == 0 and ours[1] % merge == 0
    assert compared > 200 and (refused > 0 or hi == 10**9)  # only an unbounded budget never leaves a zero side


@pytest.mark.parametrize("kwargs", [dict(min_num_patches=16, max_num_patches=256, max_model_len=100),
                                    dict(min_num_patches=16, max_num_patches=0, max_model_len=40),
                                    dict()])  # the released defaults: 1024..13,312 patches, 16k context
@pytest.mark.parametrize("sizes", [[(37, 91)], [(16, 16), (300, 20), (64, 64)], [(5, 7)], [(480, 640)],
                                   [(2, 900), (900, 3)]])
def test_images_equal_transformers(kwargs, sizes):
    images = [rng_pixels(h * w, h, w, 3) for h, w in sizes]
    ref = RefImageProcessor(image_mean=list(MEAN), image_std=list(STD), **kwargs)(images=images, return_tensors="pt")
    ours = preprocess_omni_images(images, OmniImageConfig(norm_mean=MEAN, norm_std=STD, **kwargs))
    assert torch.equal(torch.tensor([o.grid for o in ours]), ref["image_grid_hw"])
    torch.testing.assert_close(torch.cat([o.pixel_values for o in ours]), ref["pixel_values"], **TOL)
    assert [o.num_tokens for o in ours] == [int(h * w) // 4 for h, w in ref["image_grid_hw"].tolist()]


def test_the_call_shares_one_budget_and_grows_with_the_context():
    small = OmniImageConfig(norm_mean=MEAN, norm_std=STD, min_num_patches=16, max_num_patches=0, max_model_len=20)
    assert patch_budget(1, small) == (20 - 4) * 4 == 64
    assert patch_budget(5, small) == 5 * 16  # never below min_num_patches per image
    released = OmniImageConfig(norm_mean=MEAN, norm_std=STD)
    assert patch_budget(1, released) == patch_budget(9, released) == 13312  # max_num_patches caps the context's


def test_untrusted_images_keep_their_caps_and_thin_ones_are_typed_errors(tmp_path):
    cfg = OmniImageConfig(norm_mean=MEAN, norm_std=STD, min_num_patches=16, max_num_patches=64)
    path = tmp_path / "x.png"
    Image.fromarray(rng_pixels(1, 40, 30, 3)).save(path)
    (img,) = load_omni_images([str(path)], cfg)
    assert img.image_size == (30, 40) and img.num_patches == img.grid[0] * img.grid[1] <= 64
    with pytest.raises(MediaTooLargeError):
        load_omni_images([str(path)], cfg, limits=MediaLimits(max_image_bytes=10))
    with pytest.raises(ImageAspectError, match="aspect ratio"):  # transformers: ZeroDivisionError
        preprocess_omni_images([Image.new("RGB", (20000, 1))], cfg)


# --- video -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("target", [1024, 64, 100, 7])
@pytest.mark.parametrize("keep", [True, False])
def test_frame_grid_equals_transformers(target, keep):
    ref = RefVideoProcessor(norm_mean=list(MEAN), norm_std=list(STD), video_target_num_patches=target,
                            video_maintain_aspect_ratio=keep)
    cfg = OmniVideoConfig(norm_mean=MEAN, norm_std=STD, video_target_num_patches=target,
                          video_maintain_aspect_ratio=keep)
    for h in (1, 9, 33, 360, 480, 720, 1080, 4096):
        for w in (1, 9, 33, 360, 480, 720, 1080, 4096):
            cols, rows = ref._compute_target_patches(h, w)
            assert frame_grid(h, w, cfg) == (rows, cols), (h, w)


@pytest.mark.parametrize("num_frames", [1, 4, 5])
@pytest.mark.parametrize("size", [(36, 64), (50, 50), (20, 90)])
def test_tubelets_equal_transformers(num_frames, size):
    frames = rng_pixels(num_frames, num_frames, *size, 3)
    ref = RefVideoProcessor(norm_mean=list(MEAN), norm_std=list(STD), video_target_num_patches=64)(
        videos=[frames], return_tensors="pt", do_sample_frames=False)
    ours = omni_video_from_frames(frames, OmniVideoConfig(norm_mean=MEAN, norm_std=STD, video_target_num_patches=64))
    assert ours.tubelets.shape == ref["pixel_values_videos"].shape[1:]
    assert ours.tubelets.shape[0] == math.ceil(num_frames / 2) and ours.num_frames == int(ref["num_frames"][0])
    torch.testing.assert_close(ours.tubelets, ref["pixel_values_videos"][0], **TOL)


@pytest.mark.parametrize("fps", [10.0, 29.97, None])
@pytest.mark.parametrize("num_frames", [1, 3, 4])
def test_tubelet_runs_equal_transformers(tokenizer, fps, num_frames):
    frames = rng_pixels(0, num_frames, 32, 48, 3)
    indices = [3 * i + 1 for i in range(num_frames)]
    ref = ref_processor(tokenizer, video_kwargs=dict(video_target_num_patches=16))
    meta = VideoMetadata(total_num_frames=60, fps=fps, frames_indices=indices)
    out = ref(videos=[frames], text="<video>", videos_kwargs={"video_metadata": [meta], "do_sample_frames": False})
    expected = tokenizer.decode(out["input_ids"][0])
    cfg = OmniVideoConfig(norm_mean=MEAN, norm_std=STD, video_target_num_patches=16)
    video = omni_video_from_frames(frames, cfg)
    stamps = None if fps is None else [i * int(1000 / fps) / 1000 for i in indices]  # the "reference" convention
    ours = chat.tubelet_video_placeholder(video.num_frames, video.tokens_per_tubelet, 2, stamps)
    assert ours == expected
    assert ours.startswith(chat.TUBELET_VIDEO_PREFIX) and ours.count("<img>") == math.ceil(num_frames / 2)


# --- audio and the whole prompt --------------------------------------------------------------------------------
def test_audio_placeholder_count_equals_transformers_and_what_the_model_keeps(tokenizer):
    ref = ref_processor(tokenizer)
    ours = OmniProcessingConfig(image=OmniImageConfig(norm_mean=MEAN, norm_std=STD),
                                video=OmniVideoConfig(norm_mean=MEAN, norm_std=STD))
    lengths = [320, 321, 1279, 1280, 1281, 16000, 16001, 80000, 160000 * 3 + 17]
    _, mask = log_mel_features([np.ones(n, np.float32) for n in lengths], ours.mel)
    kept = omni_embedding_lengths(mask, ours.audio_encoder).tolist()  # the encoder outputs the model scatters
    for n, k in zip(lengths, kept):
        assert ours.audio_tokens(n) == max(1, ref._estimate_audio_num_embeddings(n)) == k, n
    assert [ours.audio_tokens(n) for n in (0, 1, 159)] == [max(1, ref._estimate_audio_num_embeddings(n))
                                                          for n in (0, 1, 159)]
    assert chat.audio_placeholder(3) == "<so_start>" + "<so_embedding>" * 3 + "<so_end>"


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    """A 9-frame clip at 6 fps, its frames as PyAV decodes them (what our loader sees)."""
    import av

    colours = [Image.fromarray(rng_pixels(i, 40, 64, 3)) for i in range(9)]
    path = write_mp4(colours, 6.0, tmp_path_factory.mktemp("omni") / "clip.mp4")
    with av.open(str(path)) as container:
        decoded = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    return path, np.stack(decoded)


def omni_processor(tokenizer, **kwargs):
    config = OmniProcessingConfig(
        image=OmniImageConfig(norm_mean=MEAN, norm_std=STD, min_num_patches=16, max_num_patches=64, max_model_len=200),
        video=OmniVideoConfig(norm_mean=MEAN, norm_std=STD, video_target_num_patches=24))
    return OmniProcessor(tokenizer, config, video_backend="pyav", timestamp_convention="reference", **kwargs)


def write_wav(path, samples_int16, rate=16000):
    import wave

    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes(samples_int16.astype("<i2").tobytes())
    return path


def test_messages_with_image_video_and_audio_give_transformers_ids(tokenizer, clip, tmp_path):
    path, decoded = clip
    image_a, image_b = rng_pixels(7, 50, 70, 3), rng_pixels(8, 90, 20, 3)
    wave = np.random.default_rng(3).standard_normal(23_456).astype(np.float32)
    pcm = (np.random.default_rng(4).standard_normal(9_000) * 3000).astype(np.int16)
    wav_path = write_wav(tmp_path / "speech.wav", pcm)
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": [
                    {"type": "image", "image": Image.fromarray(image_a)},
                    {"type": "text", "text": "and"},
                    {"type": "video", "video": str(path)},
                    {"type": "audio", "audio": wave},
                    {"type": "image", "image": Image.fromarray(image_b)},
                    {"type": "text", "text": "What is said while the dog runs?"},
                    {"type": "audio", "audio": str(wav_path)}]}]
    proc = omni_processor(tokenizer)
    ours = proc(messages, fps=4.0)
    assert ours.prompt.text.count("<image>") == 2 and "<video>" in ours.prompt.text
    assert ours.prompt.text.count("<so_embedding>") == 2

    assert ours.media_order == ["image", "video", "image"] and ours.model_inputs()["media_order"] == ours.media_order
    info = next(i for i in ours.items if i.kind == "video")
    assert info.num_frames == len(info.frame_indices) > 2 and info.fps == pytest.approx(6.0)
    ref = ref_processor(tokenizer, image_kwargs=dict(min_num_patches=16, max_num_patches=64, max_model_len=200),
                        video_kwargs=dict(video_target_num_patches=24))
    meta = VideoMetadata(total_num_frames=len(decoded), fps=info.fps, frames_indices=info.frame_indices)
    waves = [wave, pcm.astype(np.float32) / 32768.0]  # the file's samples as a 16 kHz PCM decoder gives them
    as_bytes = proc([{"role": "user", "content": [{"type": "audio", "audio": wav_path.read_bytes()}]}])
    assert np.array_equal(as_bytes.audio[0], waves[1])
    out = ref(images=[image_a, image_b], videos=[decoded[info.frame_indices]], audio=waves, text=ours.prompt.text,
              videos_kwargs={"video_metadata": [meta], "do_sample_frames": False}, return_tensors="pt")
    assert ours.input_ids.tolist() == out["input_ids"].tolist()
    assert ours.text == tokenizer.decode(out["input_ids"][0])
    assert torch.equal(ours.image_grid_hw, out["image_grid_hw"])
    torch.testing.assert_close(ours.pixel_values, out["pixel_values"], **TOL)
    torch.testing.assert_close(ours.pixel_values_videos, out["pixel_values_videos"], **TOL)
    assert ours.video_num_frames == [info.num_frames] and ours.pixel_values_videos.shape[1] == math.ceil(
        info.num_frames / 2)
    assert sum(ours.audio_num_tokens) == int((out["input_ids"] == proc.audio_token_id).sum())
    assert ours.audio_num_tokens == [proc.config.audio_tokens(len(w)) for w in waves]
    assert np.array_equal(ours.audio[0], wave) and np.array_equal(ours.audio[1], waves[1])
    assert torch.equal(ours.input_features_mask, out["input_features_mask"])
    torch.testing.assert_close(ours.input_features, out["input_features"], **TOL)


def test_string_only_template_gives_the_same_ids(tokenizer, clip):
    """A chat template that takes strings gets each audio part as its `<so_embedding>` placeholder, in place."""
    plain = omni_processor(tokenizer)
    templated_tok = build_tokenizer(["What is said while the dog runs? Describe the image and the sound."] * 8, 320)
    templated_tok.add_special_tokens({"additional_special_tokens": ["<so_start>", "<so_embedding>", "<so_end>"]})
    templated_tok.chat_template = (  # a string-only ChatML template, as foreign templates often are
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    wave = np.zeros(8000, np.float32)
    messages = [{"role": "user", "content": [{"type": "audio", "audio": wave}, {"type": "text", "text": "said?"}]}]
    out = omni_processor(templated_tok)(messages)
    assert out.prompt.text.startswith("<|system|>")
    assert "<|user|><so_embedding>\nsaid?" in out.prompt.text
    run = chat.audio_placeholder(plain.config.audio_tokens(8000))
    assert run in out.text and out.audio_num_tokens == [plain.config.audio_tokens(8000)]


def test_audio_and_placeholders_are_refused_where_they_do_not_belong(tokenizer):
    proc = omni_processor(tokenizer)
    with pytest.raises(PromptFormatError, match="placeholder '<so_embedding>'"):
        proc([{"role": "user", "content": "sneaky <so_embedding> token"}])
    with pytest.raises(NoAudioError, match="does not hear"):  # Nano V2 VL tokens: no_audio, as the server says
        chat.render_messages([{"role": "user", "content": [{"type": "audio", "audio": "x.wav"}]}])
    many = [{"type": "audio", "audio": np.zeros(1600, np.float32)}] * 3
    with pytest.raises(TooManyItemsError, match="audio"):
        omni_processor(tokenizer, limits=MediaLimits(max_audios=2))([{"role": "user", "content": many}])
    with pytest.raises(ConfigError, match="audio tokens"):
        chat.MediaTokens(audio_start="<img>", audio_context="<so_embedding>", audio_end="<so_end>")
    for kind in ("image", "video", "audio"):  # never fetched, whatever the kind
        with pytest.raises(RemoteMediaError, match="never fetched"):
            proc([{"role": "user", "content": [{"type": kind, kind: "http://169.254.169.254/x"}]}])
    with pytest.raises(MediaTooLargeError, match="cap"):  # an audio array is held to the duration cap too
        omni_processor(tokenizer, limits=MediaLimits(max_audio_duration_s=0.5))(
            [{"role": "user", "content": [{"type": "audio", "audio": np.zeros(16000, np.float32)}]}])


def test_processor_files_are_read_under_the_key_policy():
    notes = []
    cfg = omni_processing_from_hf({"norm_mean": list(MEAN), "norm_std": list(STD), "max_num_patches": 4096,
                                   "image_processor_type": "X", "do_resize": True, "_downsample_factor": 2},
                                  {"norm_mean": list(MEAN), "norm_std": list(STD), "video_target_num_patches": 512,
                                   "fps": 1, "temporal_patch_size": 4},
                                  {"video_temporal_patch_dim": 2, "audio_hop_length": 160},
                                  {"feature_size": 128, "hop_length": 160}, notes=notes)
    assert cfg.image.max_num_patches == 4096 and cfg.image.norm_mean == MEAN
    assert cfg.video.video_target_num_patches == 512 and cfg.video.temporal_patch_size == 2
    assert cfg.mel.feature_size == 128
    assert any("do_resize" in n for n in notes) and any("temporal_patch_size" in n for n in notes)
    with pytest.raises(ConfigError, match="resample"):
        omni_processing_from_hf({"norm_mean": list(MEAN), "norm_std": list(STD), "resample": 2})
    with pytest.raises(ConfigError, match="normalisation"):
        omni_processing_from_hf({})
    with pytest.raises(ConfigError, match="audio_hop_length"):
        omni_processing_from_hf({"norm_mean": list(MEAN), "norm_std": list(STD)}, None, {"audio_hop_length": 320})


@pytest.mark.parametrize("how", [dict(backend="decord"), dict(backend="pyav", isolate=True)])
def test_decoded_videos_are_resized_where_they_are_decoded(clip, how):
    """Each backend, in-process or in a sandbox worker, gives the tubelets of the frames PyAV decodes."""
    path, decoded = clip
    cfg = OmniVideoConfig(norm_mean=MEAN, norm_std=STD, video_target_num_patches=24)
    video = load_omni_video(str(path), cfg, target_fps=4.0, **how)
    indices = video.frames.frame_indices
    assert video.frames.backend == how["backend"] and len(indices) == video.num_frames > 2
    torch.testing.assert_close(video.tubelets, omni_video_from_frames(decoded[indices], cfg).tubelets, **TOL)


@pytest.mark.parametrize("backend", ["decord", "pyav"])
def test_decoded_frames_are_held_once(tmp_path, backend, tokenizer):
    """Each decoded frame goes straight into one array for all the sampled frames, so numpy holds the frames once,
    not one by one and stacked too (80 normalised frames of a 5-minute clip are 250 MB); a single video's
    tubelets reach the model inputs without another copy. Numpy's allocations are what tracemalloc sees."""
    import tracemalloc

    colours = [Image.fromarray(rng_pixels(i, 96, 160, 3)) for i in range(24)]
    path = write_mp4(colours, 6.0, tmp_path / "clip.mp4")
    cfg = OmniVideoConfig(norm_mean=MEAN, norm_std=STD, video_target_num_patches=240)
    tracemalloc.start()
    try:
        video = load_omni_video(str(path), cfg, target_fps=6.0, backend=backend)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert video.frames.backend == backend and video.num_frames == 24
    held = video.tubelets.numel() * video.tubelets.element_size()
    assert held > 8 << 20 and peak < 1.25 * held, (peak, held)  # stacking a list of frames peaks at 2x
    proc = omni_processor(tokenizer)
    inputs = proc([{"role": "user", "content": [{"type": "video", "video": str(path)},
                                                {"type": "text", "text": "What happens?"}]}], fps=6.0)
    tubelets = inputs.pixel_values_videos
    # still the decode's numpy array (torch marks such storage not resizable; a copy by torch would be)
    assert tubelets.shape[:2] == (1, 12) and not tubelets.untyped_storage().resizable()


def test_load_processor_reads_an_omni_directory(tokenizer, tmp_path):
    """`vl.load_processor` dispatches on config.json (model_type nemotron_h_omni) to the Omni processor, read from
    the files transformers' own processor saved; an image message gives transformers' input_ids and pixels."""
    import sys
    from pathlib import Path

    import vl

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from omni_adapter import hf_omni

    model = hf_omni()
    ids = {k: tokenizer.convert_tokens_to_ids(t) for k, t in (("image_token_id", "<image>"),
                                                              ("audio_token_id", OMNI_TOKENS.audio_context))}
    model.config.image_token_id, model.config.audio_token_id = ids["image_token_id"], ids["audio_token_id"]
    model.config.save_pretrained(tmp_path)
    image_kwargs = dict(min_num_patches=16, max_num_patches=64, max_model_len=200)
    ref = ref_processor(tokenizer, image_kwargs=image_kwargs, mel_bins=model.config.audio_config.num_mel_bins)
    ref.save_pretrained(tmp_path)
    proc = vl.load_processor(tmp_path)
    assert isinstance(proc, OmniProcessor)
    image = rng_pixels(11, 40, 90, 3)
    ours = proc([{"role": "user", "content": [{"type": "image", "image": Image.fromarray(image)},
                                              {"type": "text", "text": "Describe the image."}]}])
    out = ref(images=[image], text=ours.prompt.text, return_tensors="pt")
    assert ours.input_ids.tolist() == out["input_ids"].tolist()
    torch.testing.assert_close(ours.pixel_values, out["pixel_values"], **TOL)


def test_a_bad_image_among_several_is_named(tmp_path):
    cfg = OmniImageConfig(norm_mean=MEAN, norm_std=STD, min_num_patches=16, max_num_patches=64)
    good = tmp_path / "good.png"
    Image.fromarray(rng_pixels(1, 40, 30, 3)).save(good)
    cut = tmp_path / "cut.png"
    cut.write_bytes(good.read_bytes()[:80])
    with pytest.raises(MediaError, match="^image 3 of 3: ") as named:
        load_omni_images([str(good), str(good), str(cut)], cfg)
    assert named.value.code == "corrupt_media"
    with pytest.raises(MediaError) as alone:
        load_omni_images([str(cut)], cfg)
    assert not str(alone.value).startswith("image ")
    assert len(load_omni_images([str(good), str(good)], cfg)) == 2


def test_the_mel_bins_follow_the_audio_encoder_where_no_feature_extractor_file_says():
    """A released directory has no feature-extractor file (its remote code, and vLLM, build the extractor from the
    audio config): the mel bins are the encoder's num_mel_bins, not the extractor's default 80. A file that
    disagrees with the encoder is refused, as transformers' feature extractor would feed it the wrong width."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from omni_adapter import TINY_TEXT, TINY_VISION

    from vl.config.omni import omni_config_from_hf

    model = omni_config_from_hf({"text_config": dict(TINY_TEXT), "vision_config": dict(TINY_VISION),
                                 "vision_hidden_size": 32, "sound_config": {"hidden_size": 32, "num_mel_bins": 128,
                                                                            "projection_hidden_size": 64}})
    pre = {"norm_mean": list(MEAN), "norm_std": list(STD)}
    assert omni_processing_from_hf(pre, model=model).mel.feature_size == 128
    assert omni_processing_from_hf(pre).mel.feature_size == 80  # no model to ask: the extractor's default
    assert omni_processing_from_hf(pre, feature_extractor={"feature_size": 128}, model=model).mel.feature_size == 128
    with pytest.raises(ConfigError, match="num_mel_bins is 128 but the feature extractor's feature_size is 80"):
        omni_processing_from_hf(pre, feature_extractor={"feature_size": 80}, model=model)
