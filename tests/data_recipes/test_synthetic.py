"""Synthetic data: determinism, split disjointness, balance, answers re-derived from pixels, export round trips."""

import hashlib
import json
import random
import re
from collections import Counter

import numpy as np
import pytest
from PIL import Image, ImageDraw

from data_recipes.synthetic import (
    FAMILIES,
    SEED_SPAN,
    families,
    frame_time_str,
    generate,
    make_dataset,
    split_seed,
    write_examples,
    write_mp4,
    write_pdf,
)
from data_recipes.recipes import VIDEO_OPTIONS
from data_recipes.registry import get_recipe
from data_recipes.synthetic.common import COLOURS, balanced_class, draw_text, hairline, text_stroke
from data_recipes.synthetic.documents import TABLE_TEXT
from data_recipes.synthetic.export import EXAMPLES, export_split
from vl.errors import ConfigError

ALL = sorted(FAMILIES)


def _digest(sample) -> str:
    h = hashlib.sha256()
    for img in sample.media:
        h.update(img.tobytes())
    return h.hexdigest()


def _arr(img) -> np.ndarray:
    return np.asarray(img.convert("RGB")).astype(int)  # (H, W, 3)


def _coloured(arr: np.ndarray) -> np.ndarray:
    """Mask of saturated pixels: answer colours; never paper, grey furniture or black ink."""
    return (arr.max(-1) - arr.min(-1)) > 80  # (H, W)


def _mask_of(arr: np.ndarray, rgb, tol: int = 0) -> np.ndarray:
    return (np.abs(arr - np.array(rgb)).max(-1) <= tol)  # (H, W)


# ---------------------------------------------------------------- determinism and purity
@pytest.mark.parametrize("family", ALL)
def test_same_seed_same_bytes_and_no_global_state(family):
    a = generate(family, "train", 5, seed=3, tile_size=64)
    random.seed(123)
    np.random.seed(123)
    for i in range(3):  # other samples in between must not matter
        generate(family, "train", i, seed=9, tile_size=64)
    b = generate(family, "train", 5, seed=3, tile_size=64)
    assert _digest(a) == _digest(b)
    assert (a.question, a.answer, a.reasoning, a.metadata) == (b.question, b.answer, b.reasoning, b.metadata)
    c = generate(family, "train", 6, seed=3, tile_size=64)
    assert _digest(c) != _digest(a)


@pytest.mark.parametrize("kind", ["document", "video"])
def test_tile_size_and_clip_shape(kind):
    for sample in make_dataset(kind, "val", 2 * len(families(kind)), tile_size=96, num_frames=12, fps=4.0)\
            if kind == "video" else make_dataset(kind, "val", 16, tile_size=96):
        assert all(img.size == (96, 96) and img.mode == "RGB" for img in sample.media)
        if kind == "video":
            assert sample.num_frames == 12 and sample.fps == 4.0
        else:
            assert sample.fps is None and 1 <= sample.num_pages <= 10


# ---------------------------------------------------------------- splits, balance, chance
def test_splits_own_disjoint_seed_ranges_and_contents():
    assert split_seed("train", SEED_SPAN - 1) < split_seed("val", 0) < split_seed("test", 0)
    with pytest.raises(ConfigError):
        split_seed("train", SEED_SPAN)
    with pytest.raises(ConfigError):
        split_seed("holdout")
    for kind in ("document", "video"):
        n = 12 * len(families(kind))
        train = make_dataset(kind, "train", n, tile_size=64)
        test = make_dataset(kind, "test", n, tile_size=64)
        train_ids, test_ids = {s.id for s in train}, {s.id for s in test}
        assert len(train_ids) == n and not train_ids & test_ids
        assert {s.metadata["split"] for s in test} == {"test"}
        assert not {_digest(s) for s in train} & {_digest(s) for s in test}


@pytest.mark.parametrize("family", ALL)
def test_answers_balanced_over_each_block(family):
    fam = FAMILIES[family]
    classes = fam.classes()
    n_classes = generate(family, "train", 0, tile_size=64).metadata["n_classes"]
    samples = [generate(family, "train", i, tile_size=64) for i in range(2 * n_classes)]
    assert Counter(s.metadata["class_index"] for s in samples) == {c: 2 for c in range(n_classes)}
    assert all(s.answer in classes for s in samples)
    if family == "video_order":  # classes say whether the answer is the first-named candidate
        for s in samples:
            named = re.findall(r"the (\w+ \w+)", s.question)
            assert named.index(s.answer) == s.metadata["class_index"]
        assert fam.chance() == 0.5
    else:
        assert Counter(s.answer for s in samples) == {c: 2 for c in classes}
        assert fam.chance() == pytest.approx(1 / len(classes))
    assert samples[0].chance == fam.chance()


def test_balanced_class_is_a_permutation_per_block():
    for n in (2, 5, 90):
        for block in range(3):
            got = sorted(balanced_class(11, "x", block * n + k, n) for k in range(n))
            assert got == list(range(n))


def test_families_interleave_round_robin():
    ds = make_dataset("document", "train", 20, tile_size=64)
    names = families("document")
    assert [ds.locate(j)[0] for j in range(20)] == [names[j % len(names)] for j in range(20)]
    assert ds.chance_levels()["doc_total"] == pytest.approx(1 / 90)
    sub = make_dataset("video", "test", 4, families=["video_when"], num_frames=16, fps=4.0)
    assert sub.chance_levels() == {"video_when": pytest.approx(1 / 15)}


def test_bad_options_are_errors():
    with pytest.raises(ConfigError, match="tile_size"):
        generate("doc_total", "train", 0, tile_size=63)
    with pytest.raises(ConfigError, match="num_frames"):
        generate("video_when", "train", 0, num_frames=4)
    with pytest.raises(ConfigError, match="unknown"):
        generate("doc_total", "train", 0, num_frames=8)
    with pytest.raises(ConfigError, match="options"):
        make_dataset("document", "train", 3, fps=2.0)
    with pytest.raises(ConfigError, match="families"):
        make_dataset("document", "train", 3, families=["video_when"])
    with pytest.raises(ConfigError, match="kind"):
        make_dataset("speech", "train", 3)


# ---------------------------------------------------------------- answers agree with the pixels
def _rerendered_matches(page, box, text, size_frac, S) -> bool:
    """Draws `text` on a blank copy of the page's paper at the recorded spot and compares the crop."""
    blank = Image.new("RGB", page.size, page.getpixel((0, S - 1)))
    draw_text(ImageDraw.Draw(blank), (box[0], box[1]), text, int(size_frac * S), page=S)
    x0, y0, x1, y1 = box
    return np.array_equal(_arr(page.crop((x0, y0, x1, y1))), _arr(blank.crop((x0, y0, x1, y1))))


@pytest.mark.parametrize("family,size", [("doc_total", 0.22), ("doc_name", 0.18), ("doc_multipage", 0.22)])
def test_reading_answers_are_the_pixels_next_to_the_label(family, size):
    for i in range(6):
        s = generate(family, "test", i, tile_size=128)
        page = s.media[s.metadata.get("answer_page", 0)]
        (field,) = [f for f in s.metadata["fields"] if f["label"] in ("TOTAL", "NAME")]
        assert field["value"] == s.answer
        assert _rerendered_matches(page, field["box"], s.answer, size, 128)
        wrong = str(int(s.answer) % 90 + 10) if s.answer.isdigit() else s.answer[::-1]
        assert not _rerendered_matches(page, field["box"], wrong, size, 128)


def test_multipage_other_pages_carry_no_amounts():
    for i in range(6):
        s = generate("doc_multipage", "test", i, tile_size=128)
        ink = [int((_arr(p).max(-1) < 80).sum()) for p in s.media]  # dark pixels (glyphs) per page
        assert 2 <= s.num_pages <= 10
        assert max(range(s.num_pages), key=ink.__getitem__) == s.metadata["answer_page"]
        answer_ink = ink[s.metadata["answer_page"]]
        assert all(k < answer_ink / 2 for j, k in enumerate(ink) if j != s.metadata["answer_page"])


def test_layout_top_field_is_highest_and_table_cell_matches():
    for i in range(6):
        s = generate("doc_layout", "test", i, tile_size=128)
        fields = s.metadata["fields"]
        top = min(fields, key=lambda f: f["box"][1])
        assert top["label"] == s.answer and fields[0] is top
        t = generate("doc_table", "test", i, tile_size=128)
        box = t.metadata["boxes"][t.metadata["row"] + t.metadata["col"]]
        assert _rerendered_matches(t.media[0], box, t.answer, TABLE_TEXT, 128)


def test_table_trace_reads_every_cell_in_order_then_names_the_asked_one():
    for i in range(8):
        t = generate("doc_table", "train", i, tile_size=96)
        m = t.metadata
        read = re.findall(r"row ([AB]): X (\d), Y (\d)", t.reasoning)
        assert read == [(name, str(row[0]), str(row[1])) for name, row in zip("AB", m["cells"])]
        assert t.reasoning.endswith(f"row {m['row']}, column {m['col']} holds {t.answer}")
        assert t.answer == str(m["cells"]["AB".index(m["row"])]["XY".index(m["col"])])


def _bar_heights(page, boxes):
    arr = _arr(page)
    coloured = _coloured(arr)
    return [int(coloured[:, (b[0] + b[2]) // 2].sum()) for b in boxes]


def test_chart_answers_from_measured_bar_heights():
    for i in range(8):
        s = generate("doc_chart_tallest", "test", i, tile_size=128)
        heights = _bar_heights(s.media[0], s.metadata["boxes"])
        assert "ABCD"[int(np.argmax(heights))] == s.answer
        assert sorted(heights)[-1] - sorted(heights)[-2] >= 0.1 * 0.66 * 128
        v = generate("doc_chart_value", "test", i, tile_size=128)
        heights = _bar_heights(v.media[0], v.metadata["boxes"])
        label = re.search(r"bar (\w)\?", v.question).group(1)
        assert round(heights["ABC".index(label)] / (0.13 * 128)) == int(v.answer)


def _components(mask: np.ndarray):
    """4-connected components of a boolean mask, as lists of (y, x)."""
    seen = np.zeros_like(mask)
    comps = []
    for y, x in zip(*np.nonzero(mask)):
        if seen[y, x]:
            continue
        stack, comp = [(y, x)], []
        seen[y, x] = True
        while stack:
            cy, cx = stack.pop()
            comp.append((cy, cx))
            for ny, nx in ((cy + 1, cx), (cy - 1, cx), (cy, cx + 1), (cy, cx - 1)):
                if 0 <= ny < mask.shape[0] and 0 <= nx < mask.shape[1] and mask[ny, nx] and not seen[ny, nx]:
                    seen[ny, nx] = True
                    stack.append((ny, nx))
        comps.append(comp)
    return comps


def test_count_answer_from_connected_shapes():
    for i in range(10):
        s = generate("doc_count", "test", i, tile_size=128)
        kinds = []
        for comp in _components(_coloured(_arr(s.media[0]))):
            ys, xs = zip(*comp)
            fill = len(comp) / ((max(ys) - min(ys) + 1) * (max(xs) - min(xs) + 1))
            kinds.append("box" if fill > 0.9 else "star")
        target = "star" if "stars" in s.question else "box"
        assert kinds.count(target) == int(s.answer)


def _first_frame_with(frames, rgb):
    return next(i for i, f in enumerate(frames) if _mask_of(_arr(f), rgb, tol=40).sum() > 20)


def test_video_answers_from_frame_differences():
    for i in range(8):
        d = generate("video_direction", "test", i, tile_size=128)
        rgb = COLOURS[d.metadata["colour"]]
        ys0, xs0 = np.nonzero(_mask_of(_arr(d.media[0]), rgb))
        ys1, xs1 = np.nonzero(_mask_of(_arr(d.media[-1]), rgb))
        dx, dy = xs1.mean() - xs0.mean(), ys1.mean() - ys0.mean()
        moved = ("right" if dx > 0 else "left") if abs(dx) > abs(dy) else ("down" if dy > 0 else "up")
        assert moved == d.answer

        c = generate("video_colour", "test", i, tile_size=128)
        assert not _coloured(_arr(c.media[0])).any()
        last = _arr(c.media[-1])[_coloured(_arr(c.media[-1]))]
        assert np.abs(last - np.array(COLOURS[c.answer])).max() == 0

        o = generate("video_order", "test", i, tile_size=128)
        named = re.findall(r"the (\w+) (\w+)", o.question)  # (colour, shape) of both candidates
        assert o.answer in {f"{c} {s}" for c, s in named}
        other = next(c for c, s in named if f"{c} {s}" != o.answer)
        assert _first_frame_with(o.media, COLOURS[o.answer.split()[0]]) < _first_frame_with(o.media, COLOURS[other])

        f = generate("video_flash", "test", i, tile_size=128)
        lit = np.array([_coloured(_arr(fr)).sum() > 20 for fr in f.media])
        assert lit.sum() == int(f.answer) and not (lit[1:] & lit[:-1]).any()  # separate flashes

        w = generate("video_when", "test", i, tile_size=128, num_frames=12, fps=3.0)
        assert frame_time_str(_first_frame_with(w.media, COLOURS["red"]), 3.0) == w.answer


def test_frame_time_follows_the_prompt_header_rule():
    # frame_duration_ms = int(1000 / fps); t_i = i * frame_duration_ms / 1000, two decimals
    assert [frame_time_str(i, 2.0) for i in range(4)] == ["0.00", "0.50", "1.00", "1.50"]
    assert frame_time_str(3, 3.0) == "1.00"  # 3 * 333 ms = 0.999 s
    assert frame_time_str(7, 30.0) == "0.23"  # 7 * 33 ms = 0.231 s
    assert frame_time_str(10, 29.97) == "0.33"


# ---------------------------------------------------------------- export round trips
def test_mp4_round_trip_frames_fps_and_answer(tmp_path):
    av = pytest.importorskip("av")
    s = generate("video_when", "test", 4, tile_size=64, num_frames=10, fps=2.5)
    for codec in ("libx264", "mpeg4"):
        path = write_mp4(s.media, s.fps, tmp_path / f"{codec}.mp4", codec=codec)
        first = path.read_bytes()
        assert write_mp4(s.media, s.fps, tmp_path / f"{codec}.mp4", codec=codec).read_bytes() == first
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            frames = [fr.to_image() for fr in container.decode(stream)]
            assert stream.average_rate == 2.5 and stream.codec_context.pix_fmt == "yuv420p"
        assert len(frames) == 10 and frames[0].size == (64, 64)
        assert frame_time_str(_first_frame_with(frames, COLOURS["red"]), 2.5) == s.answer
    with pytest.raises(ConfigError):
        write_mp4(s.media, 2.0, tmp_path / "x.mp4", codec="vp9")
    for i in range(6):  # every answer colour is still the nearest palette colour after H.264 + yuv420p
        c = generate("video_colour", "test", i, tile_size=64)
        with av.open(str(write_mp4(c.media, c.fps, tmp_path / "c.mp4"))) as container:
            last = _arr(list(container.decode(video=0))[-1].to_image())
        centre = last[_coloured(last)].mean(0)
        assert min(COLOURS, key=lambda k: np.abs(np.array(COLOURS[k]) - centre).sum()) == c.answer


def test_pdf_round_trip_pages_and_pixels(tmp_path):
    pdfium = pytest.importorskip("pypdfium2")
    s = generate("doc_multipage", "test", 0, tile_size=128, min_pages=5, max_pages=5)
    for lossless in (False, True):
        path = write_pdf(s.media, tmp_path / f"doc{lossless}.pdf", lossless=lossless)
        first = path.read_bytes()
        assert write_pdf(s.media, tmp_path / f"doc{lossless}.pdf", lossless=lossless).read_bytes() == first
        doc = pdfium.PdfDocument(str(path))
        assert len(doc) == 5
        for page, original in zip(doc, s.media):
            assert page.get_size() == (128.0, 128.0)
            back = _arr(page.render(scale=1).to_pil())
            err = np.abs(back - _arr(original))
            assert (err.max() == 0) if lossless else (err.mean() < 2.0)
        doc.close()


def test_export_split_jsonl_and_files(tmp_path):
    jsonl = export_split("document", "test", 9, tmp_path, tile_size=64, max_pages=3)
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert len(records) == 9 and {r["split"] for r in records} == {"test"}
    again = make_dataset("document", "test", 9, tile_size=64, max_pages=3)
    for record, sample in zip(records, again):
        assert (record["id"], record["answer"], record["question"]) == (sample.id, sample.answer, sample.question)
        (part,) = record["content"]
        path = tmp_path / part[part["type"]]
        assert path.is_file()
        if part["type"] == "image":
            assert np.array_equal(_arr(Image.open(path)), _arr(sample.media[0]))
        else:
            assert part["type"] == "pdf" and record["num_pages"] == sample.num_pages > 1


def test_write_examples_makes_two_documents_and_two_clips(tmp_path):
    records = write_examples(tmp_path, tile_size=96)
    types = Counter(r["content"][0]["type"] for r in records)
    assert types == {"image": 1, "pdf": 1, "video": 2}
    for r in records:
        path = tmp_path / r["content"][0][r["content"][0]["type"]]
        assert path.is_file() and path.stat().st_size < 200_000
    assert json.loads((tmp_path / "examples.json").read_text()) == records
    assert Image.open(tmp_path / records[0]["content"][0]["image"]).size == (96, 96)


def test_examples_are_drawn_as_the_demo_recipe_trains():
    """The app's clips have the recipe's length; ui/examples.py draws pages at the recipe's tile size."""
    from ui.examples import example_tile_size

    assert example_tile_size() == get_recipe("demo").model.tile_size
    for family, _, opts in EXAMPLES:
        if FAMILIES[family].kind == "video":
            assert {**dict(VIDEO_OPTIONS), **opts} == dict(VIDEO_OPTIONS)


def test_examples_take_the_demo_models_tile_size_from_its_config(monkeypatch, tmp_path):
    """ui/examples.py reads the tile size from the demo model's config.json (the library's files), not from a
    training recipe; a missing or broken config falls back to the shipped value."""
    import ui.examples
    import vl.directory
    from ui.examples import example_tile_size

    demo_config = json.loads((tmp_path.__class__(vl.directory.default_model()) / "config.json").read_text())
    assert example_tile_size() == demo_config["force_image_size"]
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "NemotronH_Nano_VL_V2", "force_image_size": 128}))
    monkeypatch.setattr(ui.examples, "default_model", lambda: str(tmp_path))
    assert example_tile_size() == 128
    monkeypatch.setattr(ui.examples, "default_model", lambda: str(tmp_path / "missing"))
    assert example_tile_size() == 96


def test_app_examples_are_made_again_when_drawn_otherwise(tmp_path):
    from ui.examples import ensure_examples

    write_examples(tmp_path, tile_size=64)  # e.g. a folder left by an older version
    _, records = ensure_examples(tmp_path)
    assert Image.open(tmp_path / records[0]["content"][0]["image"]).size == (96, 96)
    stamp = tmp_path / "examples.stamp.json"
    before = stamp.stat().st_mtime_ns
    assert ensure_examples(tmp_path)[1] == records and stamp.stat().st_mtime_ns == before  # current: kept


# ---------------------------------------------------------------- the same page at any size
def test_text_weight_at_96_px_is_unchanged():
    """The demo model was trained on 96 px pages drawn with a 1 px stroke from 14 px text up, none below."""
    assert [text_stroke(size, 96) for size in range(6, 40)] == [int(size >= 14) for size in range(6, 40)]
    assert hairline(96) == 1


def _ink(S: int, frac: float) -> float:
    """Ink of a line of text drawn on an S-px page at `frac` of the page height, resized to 96 px."""
    page = Image.new("RGB", (S, S), (255, 255, 255))
    draw_text(ImageDraw.Draw(page), (int(0.1 * S), int(0.3 * S)), "TOTAL 12", int(frac * S), page=S)
    if S != 96:
        page = page.resize((96, 96), Image.Resampling.BICUBIC)
    return float((255 - np.asarray(page.convert("L"), dtype=float)).sum())


@pytest.mark.parametrize("frac", [0.1, 0.12, 0.17, 0.25, 0.3])
def test_a_page_drawn_large_and_resized_has_the_glyph_weight_of_one_drawn_small(frac):
    """Stroke widths are relative to the page: with a fixed 1 px stroke the ink ratio ranged 0.56-2.75."""
    for S in (192, 256, 288, 384):
        assert 0.8 < _ink(S, frac) / _ink(96, frac) < 1.25, (S, frac)
