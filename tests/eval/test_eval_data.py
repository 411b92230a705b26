"""eval.data on tiny hand-made files in every supported layout (built here, nothing downloaded)."""

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from eval.data import DatasetFormatError, Item, detect_layout, iter_rows, load_items, resolve_media_path
from eval.tasks import get_task
from vl.errors import RemoteMediaError


def _png(color=(255, 0, 0)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (4, 4), color).save(buf, format="PNG")
    return buf.getvalue()


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _docvqa_rows():
    return [
        {"questionId": 7, "question": "What is the date?", "answers": ["1 May", "May 1"],
         "image": {"bytes": _png(), "path": "a.png"}, "question_types": ["form"], "docId": 3},
        {"questionId": 9, "question": "Who signed?", "answers": ["Bob"],
         "image": {"bytes": _png((0, 0, 255)), "path": "b.png"}, "question_types": ["handwritten"], "docId": 4},
    ]


def test_jsonl_relative_media_paths(tmp_path):
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "x.png").write_bytes(_png())
    path = _write_jsonl(tmp_path / "set.jsonl", [
        {"id": "q1", "question": "Q?", "answer": "yes", "image": "imgs/x.png", "category": "c1"},
        {"id": "q2", "question": "Q2?", "answers": ["a", 3], "images": ["imgs/x.png", "imgs/y.png"]},
    ])
    items = list(load_items(path))
    assert [i.id for i in items] == ["q1", "q2"]
    assert items[0].answers == ("yes",) and items[1].answers == ("a", "3")
    assert items[0].media[0].path == str((tmp_path / "imgs" / "x.png").resolve())
    assert items[0].media[0].kind == "image" and items[0].media[0].data is None
    assert len(items[1].media) == 2 and items[0].fields == {"id": "q1", "category": "c1"}


def test_jsonl_content_parts_as_written_by_synthetic_export(tmp_path):
    path = _write_jsonl(tmp_path / "video_test.jsonl", [
        {"id": "v/0", "family": "video_when", "question": "When?", "answer": "1.50", "chance": 0.125,
         "content": [{"type": "video", "video": "media/v_0.mp4"}], "metadata": {"split": "test"}},
    ])
    (item,) = load_items(path, get_task("synthetic_video"))
    assert item.media[0].kind == "video" and item.media[0].path.endswith("media/v_0.mp4")
    assert item.fields["family"] == "video_when" and "content" not in item.fields
    bad = _write_jsonl(tmp_path / "bad.jsonl", [{"question": "q", "content": [{"type": "smell", "smell": "x"}]}])
    with pytest.raises(DatasetFormatError, match="content parts"):
        list(load_items(bad))


def test_paths_are_confined_and_urls_refused(tmp_path):
    with pytest.raises(RemoteMediaError):
        resolve_media_path("https://example.com/a.png", tmp_path)
    with pytest.raises(RemoteMediaError, match="outside the media root"):
        resolve_media_path("../secret.png", tmp_path)
    with pytest.raises(RemoteMediaError):
        resolve_media_path("/etc/passwd", tmp_path)
    path = _write_jsonl(tmp_path / "s.jsonl", [{"question": "q", "image": "../up.png"}])
    with pytest.raises(RemoteMediaError):
        list(load_items(path))
    # an explicit media root above the file makes the same reference legal
    (tmp_path / "sub").mkdir()
    inner = _write_jsonl(tmp_path / "sub" / "s.jsonl", [{"question": "q", "image": "sub/x.png"}])
    (item,) = load_items(inner, media_root=tmp_path)
    assert item.media[0].path == str((tmp_path / "sub" / "x.png").resolve())


def test_jsonl_errors_name_the_line_and_duplicates(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"question": "a"}\n{"question": "b", \n', encoding="utf-8")
    with pytest.raises(DatasetFormatError, match=r"broken.jsonl:2"):
        list(load_items(path))
    dup = _write_jsonl(tmp_path / "dup.jsonl", [{"id": 1, "question": "a"}, {"id": "1", "question": "b"}])
    with pytest.raises(DatasetFormatError, match="duplicate item id"):
        list(load_items(dup))
    noq = _write_jsonl(tmp_path / "noq.jsonl", [{"id": 1, "prompt": "a"}])
    with pytest.raises(DatasetFormatError, match="'question'"):
        list(load_items(noq))


def test_parquet_with_embedded_image_structs(tmp_path):
    path = tmp_path / "docvqa.parquet"
    pq.write_table(pa.Table.from_pylist(_docvqa_rows()), path)
    assert detect_layout(path) == "parquet"
    items = list(load_items(path, get_task("docvqa_val")))
    assert [i.id for i in items] == ["7", "9"]
    assert items[0].media[0].data == _png() and items[0].media[0].name == "a.png" and items[0].media[0].path is None
    assert items[1].answers == ("Bob",) and items[1].fields["question_types"] == ["handwritten"]
    assert list(load_items(path, limit=1))[0].question == "What is the date?"
    no_ids = tmp_path / "noid.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": "a", "answer": "x"}, {"question": "b", "answer": "y"}]), no_ids)
    assert [i.id for i in load_items(no_ids)] == ["0", "1"]  # no id column: the row index


def test_parquet_shard_folder_with_splits(tmp_path):
    data = tmp_path / "DocVQA"
    data.mkdir()
    rows = _docvqa_rows()
    pq.write_table(pa.Table.from_pylist(rows[:1]), data / "validation-00000-of-00002.parquet")
    pq.write_table(pa.Table.from_pylist(rows[1:]), data / "validation-00001-of-00002.parquet")
    pq.write_table(pa.Table.from_pylist([{**rows[0], "questionId": 99}]), data / "test-00000-of-00001.parquet")
    assert detect_layout(tmp_path) == "parquet_dir"
    assert [i.id for i in load_items(tmp_path, split="validation")] == ["7", "9"]  # shards in name order
    assert [i.id for i in load_items(tmp_path, get_task("docvqa_val"), split="validation")] == ["7", "9"]
    assert [i.id for i in load_items(tmp_path, get_task("docvqa_val"), split="test")] == ["99"]
    with pytest.raises(DatasetFormatError, match="no parquet shard for split"):
        list(load_items(tmp_path, split="train"))


@pytest.mark.parametrize("fmt", ["file", "stream"])
def test_arrow_ipc_file_and_stream(tmp_path, fmt):
    table = pa.Table.from_pylist(_docvqa_rows())
    path = tmp_path / "data.arrow"
    with pa.OSFile(str(path), "wb") as sink:
        writer = pa.ipc.new_file(sink, table.schema) if fmt == "file" else pa.ipc.new_stream(sink, table.schema)
        writer.write_table(table)
        writer.close()
    assert detect_layout(path) == "arrow"
    items = list(load_items(path, get_task("docvqa_val")))
    assert [i.id for i in items] == ["7", "9"] and items[1].media[0].data == _png((0, 0, 255))


def test_datasets_save_to_disk_keeps_images_undecoded(tmp_path):
    datasets = pytest.importorskip("datasets")
    feats = datasets.Features({
        "question_id": datasets.Value("string"), "question": datasets.Value("string"),
        "answers": datasets.List(datasets.Value("string")), "image": datasets.Image(),
        "images": datasets.List(datasets.Image()), "type": datasets.Value("string"),
    })
    row = {"question_id": "t1", "question": "how many?", "answers": ["two"] * 10,
           "image": {"bytes": _png(), "path": None}, "images": [{"bytes": _png((0, 255, 0)), "path": None}],
           "type": "human_test"}
    dd = datasets.DatasetDict({"validation": datasets.Dataset.from_list([row], features=feats),
                               "train": datasets.Dataset.from_list([{**row, "question_id": "t2"}], features=feats)})
    dd.save_to_disk(str(tmp_path / "disk"))
    assert detect_layout(tmp_path / "disk") == "hf_disk"
    (item,) = load_items(tmp_path / "disk", get_task("textvqa_val"), split="validation")
    assert item.id == "t1" and item.answers == ("two",) * 10
    assert [m.data for m in item.media] == [_png(), _png((0, 255, 0))]
    with pytest.raises(DatasetFormatError, match="split"):
        list(iter_rows(tmp_path / "disk"))
    dd["validation"].save_to_disk(str(tmp_path / "single"))
    assert [i.id for i in load_items(tmp_path / "single")] == ["t1"]


def test_video_tasks_map_their_video_columns(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "abc.mkv").write_bytes(b"")
    rows = [{"question_id": "001-1", "videoID": "abc", "question": "What?", "answer": "B",
             "options": ["A. x", "B. y", "C. z", "D. w"], "duration": "short", "domain": "Knowledge",
             "sub_category": "Astronomy", "task_type": "OCR Problems"},
            {"question_id": "001-2", "videoID": "nofile", "question": "Why?", "answer": "A",
             "options": ["A. x", "B. y", "C. z", "D. w"], "duration": "long", "domain": "Knowledge",
             "sub_category": "Astronomy", "task_type": "Counting Problem"}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "test.parquet")
    items = list(load_items(tmp_path / "test.parquet", get_task("videomme")))
    assert items[0].media[0].path == str((tmp_path / "data" / "abc.mkv").resolve())  # LE: mp4, MP4, then mkv
    assert items[1].media[0].path.endswith("data/nofile.mp4")  # missing: fails at decode time, per item
    mlvu = _write_jsonl(tmp_path / "mlvu.jsonl", [{"question": "Q\n(A) a\n(B) b", "answer": "A",
                                                   "task_type": "count", "video_name": "count/1.mp4"}])
    (m,) = load_items(mlvu, get_task("mlvu_dev"))
    assert m.media[0].kind == "video" and m.media[0].path.endswith("count/1.mp4")


def test_item_is_plain_data():
    item = Item("1", "q", ("a",))
    assert item.media == () and dict(item.fields) == {}
