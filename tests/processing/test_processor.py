"""The processor: messages with images, PDFs and videos -> ids and tiles, through the one prompt format."""

import numpy as np
import pytest
import torch
from PIL import Image

import vl
from data_recipes.synthetic.export import write_mp4, write_pdf
from tiny_models import make_tiny_vl_dir
from vl.errors import CorruptMediaError, GenerationOptionError, RemoteMediaError, TooManyItemsError
from vl.processing.chat import PromptFormatError
from vl.processing.limits import MediaLimits


@pytest.fixture(scope="module")
def proc(tmp_path_factory):
    return vl.load_processor(make_tiny_vl_dir(tmp_path_factory.mktemp("p")))


def user(*parts):
    return [{"role": "user", "content": list(parts)}]


def test_image_tiles_and_placeholders(proc):
    out = proc(user({"type": "image", "image": Image.new("RGB", (128, 64), "red")}, {"type": "text", "text": "hi"}))
    tpt = proc.config.tokens_per_tile
    assert out.pixel_values.shape == (3, 3, 64, 64)  # 2x1 grid + thumbnail
    assert int((out.input_ids == proc.image_token_id).sum()) == 3 * tpt
    assert out.text.count("<img>") == 1 and "<image>" * (3 * tpt) in out.text
    assert out.media[0].kind == "image" and out.items[0].grid == (2, 1)
    assert proc.tokenizer.decode(out.input_ids[0]) == out.text  # no BOS, nothing added


def test_video_frames_and_timestamps(proc, tmp_path):
    frames = [Image.fromarray(np.full((32, 48, 3), i * 20, np.uint8)) for i in range(8)]
    path = write_mp4(frames, 4.0, tmp_path / "clip.mp4")
    out = proc(user({"type": "video", "video": str(path)}, {"type": "text", "text": "what happens?"}), fps=2.0)
    info = out.items[0]
    assert out.media[0].kind == "video" and info.num_tiles == len(info.frame_indices) == 4  # 2 s at 2 fps
    assert "This is a video:\nFrame 1 sampled at 0.00 seconds: <img>" in out.text
    assert f"Frame 2 sampled at {info.timestamps[1]:.2f} seconds" in out.text
    assert out.pixel_values.shape[0] == 4


def test_pdf_pages_and_budget(proc, tmp_path):
    pages = [Image.new("RGB", (200, 260), c) for c in ("white", "gray", "white")]
    path = write_pdf(pages, tmp_path / "doc.pdf")
    out = proc(user({"type": "pdf", "pdf": str(path)}, {"type": "text", "text": "sum?"}), pages="1-2")
    assert len(out.items) == 2 and all(m.kind == "image" for m in out.media)
    tight = proc(user({"type": "pdf", "pdf": str(path)}, {"type": "text", "text": "sum?"}),
                 context_length=1024 + 3 * 3 * proc.config.tokens_per_tile, reserved_tokens=1024)
    assert tight.notes and "capped" in tight.notes[0]
    assert sum(m.num_tiles for m in tight.media) < sum(m.num_tiles for m in proc(user(
        {"type": "pdf", "pdf": str(path)}, {"type": "text", "text": "sum?"})).media)


def test_urls_and_paths_outside_roots_are_refused(proc, tmp_path):
    with pytest.raises(RemoteMediaError, match="never fetched"):
        proc(user({"type": "image", "image": "http://169.254.169.254/latest/meta-data"}))
    confined = vl.processing.processor.Processor(proc.tokenizer, proc.config, allowed_roots=[tmp_path / "ok"])
    secret = tmp_path / "secret.png"
    Image.new("RGB", (8, 8)).save(secret)
    with pytest.raises(RemoteMediaError, match="outside the allowed media folders"):
        confined(user({"type": "image", "image": str(secret)}))
    with pytest.raises(RemoteMediaError):
        confined(user({"type": "image", "image": str(tmp_path / "ok" / ".." / "secret.png")}))


def test_too_many_images_and_placeholders_in_text(proc):
    img = {"type": "image", "image": Image.new("RGB", (8, 8))}
    with pytest.raises(TooManyItemsError, match="at most 4 image"):
        proc(user(*([img] * 5)))
    with pytest.raises(PromptFormatError, match="placeholder"):
        proc(user({"type": "text", "text": "sneaky <image> token"}))


def test_a_media_part_s_own_options_apply_to_that_item_only(proc, tmp_path):
    """Per-part keys (by option name or alias) override the request's value for their item alone."""
    wide = Image.new("RGB", (128, 64), "red")  # 2x1 grid + thumbnail = 3 tiles at the request's cap
    out = proc(user({"type": "image", "image": wide, "max_tiles": 1}, {"type": "image", "image": wide}))
    assert [m.num_tiles for m in out.items] == [1, 3]
    assert [m.options for m in out.prompt.media] == [{"max_num_tiles": 1}, {}]
    frames = [Image.fromarray(np.full((32, 48, 3), i * 20, np.uint8)) for i in range(8)]
    path = str(write_mp4(frames, 4.0, tmp_path / "clip.mp4"))  # 2 s
    three = vl.processing.processor.Processor(proc.tokenizer, proc.config, limits=MediaLimits(max_videos=3))
    out = three(user({"type": "video", "video": path, "fps": 1}, {"type": "video", "video": path},
                     {"type": "video", "video": path, "max_frames": 3}), fps=2.0)
    assert [m.num_tiles for m in out.items] == [2, 4, 3]


@pytest.mark.parametrize("part, match", [
    ({"type": "video", "fps": 0}, r"fps must be in \(0, 30\], found 0"),
    ({"type": "video", "fps": 31.0}, r"fps must be in \(0, 30\], found 31"),
    ({"type": "video", "max_frames": 513}, r"max_frames must be 1\.\.512, found 513"),
    ({"type": "video", "max_frames": 2.5}, r"max_frames must be an integer, found 2\.5"),
    ({"type": "image", "max_num_tiles": 13}, r"max_num_tiles must be 1\.\.12, found 13"),
    ({"type": "image", "max_tiles": 0}, r"max_tiles \(max_num_tiles\) must be 1\.\.12, found 0"),
    ({"type": "image", "max_tiles": 2, "max_num_tiles": 2}, "max_num_tiles is given twice"),
    ({"type": "video", "num_frames": 8}, r"'num_frames' is not an option of a video item \(per-item options: fps, "
                                         r"max_frames\)"),
    ({"type": "image", "fps": 1.0}, r"'fps' is not an option of an image item \(per-item options: max_num_tiles\)"),
    ({"type": "pdf", "max_num_tiles": 2}, r"'max_num_tiles' is not an option of a pdf item \(per-item options: none\)"),
])
def test_a_media_part_s_options_are_checked_by_the_options_record(proc, tmp_path, part, match):
    """The same ranges as the request's options (vl/options.py Spec.check); an unknown key is refused by name.
    Refused while the prompt is built, before any media is read."""
    part = {**part, part["type"]: str(tmp_path / "never-read.bin")}
    with pytest.raises(GenerationOptionError, match=match) as err:
        proc(user(part, {"type": "text", "text": "hi"}))
    assert "message 0 (user) item 0" in str(err.value)


def test_a_bad_item_among_several_is_named_by_kind_and_place_and_a_lone_one_is_not(proc, tmp_path):
    good = tmp_path / "good.png"
    Image.new("RGB", (64, 64), "red").save(good)
    truncated = tmp_path / "cut.png"
    truncated.write_bytes(good.read_bytes()[:60])
    clip = str(write_mp4([Image.new("RGB", (32, 32), "blue")] * 4, 4.0, tmp_path / "c.mp4"))
    image = lambda p: {"type": "image", "image": str(p)}  # noqa: E731
    with pytest.raises(CorruptMediaError) as named:
        proc(user(image(good), {"type": "video", "video": clip}, image(truncated), {"type": "text", "text": "hi"}))
    assert str(named.value).startswith("image 2 of 2: ") and named.value.code == "corrupt_media"
    with pytest.raises(CorruptMediaError) as alone:
        proc(user(image(truncated), {"type": "text", "text": "hi"}))
    assert not str(alone.value).startswith("image ")
    out = proc(user(image(good), {"type": "video", "video": clip}, image(good), {"type": "text", "text": "hi"}))
    assert [m.kind for m in out.media] == ["image", "video", "image"]


def test_item_names_count_each_kind_apart():
    from vl.errors import InputError, item_names, naming

    assert item_names(["image", "video", "image", "audio"]) == ["image 1 of 2", None, "image 2 of 2", None]
    with pytest.raises(InputError, match="^video 2 of 3: bad$") as e:
        with naming("video 2 of 3"):
            raise InputError("bad")
    assert e.value.code == "bad_input"
    with pytest.raises(ValueError, match="^plain$"):  # not ours: left as it is
        with naming("video 1 of 2"):
            raise ValueError("plain")
