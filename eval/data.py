"""Local evaluation data: JSONL/JSON, parquet, arrow and `datasets.save_to_disk` folders -> `Item`s.

The public benchmarks are distributed as parquet shards with images embedded as
`{"bytes": ..., "path": ...}` structs (lmms-lab/* on the Hub) or as `save_to_disk` folders; our own
sets are JSONL with media paths relative to the JSONL's folder. Everything is read from local disk;
nothing is downloaded. Media are referenced, never decoded here: decoding untrusted bytes belongs to
vl.processing, behind its size limits (docs/reliability_policy.md rule 1). Paths are confined to a media
root and URLs are refused (docs/reliability_policy.md §1.2).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vl.errors import InputError, RemoteMediaError


class DatasetFormatError(InputError):
    """A local dataset file or row does not have the layout the loader expects."""

    code = "bad_dataset"


@dataclass(frozen=True)
class MediaRef:
    """One image / video / PDF / audio file of an item: a confined absolute path, or bytes embedded in the file."""

    kind: str  # "image" | "video" | "pdf" | "audio"
    path: str | None = None
    data: bytes | None = None
    name: str | None = None  # the file name recorded inside the dataset, for logs only

    def value(self) -> str | bytes:
        """What goes into a chat message: the path when there is one, else the raw bytes."""
        return self.path if self.path is not None else self.data  # type: ignore[return-value]


@dataclass(frozen=True)
class Item:
    """One benchmark question, uniform across datasets and layouts."""

    id: str
    question: str
    answers: tuple[str, ...]
    media: tuple[MediaRef, ...] = ()
    fields: Mapping[str, Any] = field(default_factory=dict)  # category, options, question_type, duration...


ID_KEYS = ("id", "question_id", "questionId", "qid", "index")
MEDIA_COLUMNS = {"image": "image", "images": "image", "video": "video", "videos": "video", "pdf": "pdf",
                 "audio": "audio"}
MEDIA_KINDS = ("image", "video", "pdf", "audio")
_NOT_FIELDS = {"question", "answers", "answer", "content"}


# ------------------------------------------------------------------------------------------------
# paths


def resolve_media_path(path: str, media_root: str | os.PathLike) -> str:
    """Join a dataset-relative path to `media_root` and require the result to stay inside it."""
    if "://" in path or path.startswith("data:"):
        raise RemoteMediaError(f"expected a local media path, found a URL {path[:80]!r}; download the "
                               "media next to the dataset and reference it by a relative path")
    root = os.path.realpath(media_root)
    full = os.path.realpath(os.path.join(root, path))
    if os.path.commonpath([root, full]) != root:
        raise RemoteMediaError(f"media path {path!r} resolves outside the media root {root}; pass "
                               "media_root= (vl eval --media-root) pointing at the folder that holds it")
    return full


def _media_refs(value: Any, kind: str, media_root: str, column: str) -> list[MediaRef]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [ref for v in value for ref in _media_refs(v, kind, media_root, column)]
    if isinstance(value, str):
        return [MediaRef(kind, path=resolve_media_path(value, media_root), name=value)]
    if isinstance(value, (bytes, bytearray)):
        return [MediaRef(kind, data=bytes(value))]
    if isinstance(value, Mapping) and ("bytes" in value or "path" in value):
        data, name = value.get("bytes"), value.get("path")
        if data is not None:
            return [MediaRef(kind, data=bytes(data), name=name)]
        if name:
            return [MediaRef(kind, path=resolve_media_path(name, media_root), name=name)]
        return []
    raise DatasetFormatError(f"column {column!r}: expected a path, bytes or a {{'bytes', 'path'}} struct, "
                             f"found {type(value).__name__}; load `datasets` folders through load_items, "
                             "which keeps images undecoded")


def _content_refs(content: Any, media_root: str, index: int) -> list[MediaRef]:
    """Media from a `content` list of message parts, `{"type": "image", "image": "media/x.png"}` (the
    layout data_recipes.synthetic.export writes); text parts are ignored (the question is its own column)."""
    if content is None:
        return []
    if not isinstance(content, list):
        raise DatasetFormatError(f"row {index}: expected 'content' to be a list of message parts, "
                                 f"found {type(content).__name__}")
    refs: list[MediaRef] = []
    for part in content:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text":
            continue
        if kind not in MEDIA_KINDS or kind not in part:
            raise DatasetFormatError(f"row {index}: expected content parts like {{'type': 'image', 'image': "
                                     f"path}} with type in {MEDIA_KINDS} or 'text', found {part!r}")
        refs += _media_refs(part[kind], kind, media_root, "content")
    return refs


# ------------------------------------------------------------------------------------------------
# rows -> items


def _jsonable(value: Any) -> bool:
    if value is None or isinstance(value, (str, int, float, bool)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_jsonable(v) for v in value)
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and _jsonable(v) for k, v in value.items())
    return False


def row_answers(row: Mapping[str, Any]) -> tuple[str, ...]:
    """`answers` (list) or `answer` (string or list) as a tuple of strings; () when the split has none."""
    value = row.get("answers", row.get("answer"))
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(str(v) for v in value)
    return (str(value),)


def row_to_item(row: Mapping[str, Any], index: int, media_root: str | os.PathLike,
                id_keys: tuple[str, ...] = ID_KEYS, media_columns: Mapping[str, str] = MEDIA_COLUMNS) -> Item:
    """Generic mapping used by every task unless it overrides `Task.item_from_row`.

    The id is the first present of `id_keys`, else the row index (stable for a fixed file order).
    Every other JSON-able column becomes a task field (category, options, question_type, ...).
    """
    if "question" not in row or row["question"] is None:
        raise DatasetFormatError(f"row {index}: expected a 'question' column, found columns {sorted(row)}")
    item_id = next((str(row[k]) for k in id_keys if row.get(k) is not None), str(index))
    media = _content_refs(row.get("content"), str(media_root), index)
    for column, kind in media_columns.items():
        media += _media_refs(row.get(column), kind, str(media_root), column)
    fields = {k: v for k, v in row.items()
              if k not in _NOT_FIELDS and k not in media_columns and _jsonable(v)}
    return Item(id=item_id, question=str(row["question"]), answers=row_answers(row),
                media=tuple(media), fields=fields)


# ------------------------------------------------------------------------------------------------
# layouts


def detect_layout(path: str | os.PathLike) -> str:
    """'jsonl' | 'json' | 'parquet' | 'arrow' | 'hf_disk' | 'parquet_dir', from the files themselves."""
    p = Path(path)
    if p.is_dir():
        if (p / "dataset_dict.json").exists() or (p / "state.json").exists():
            return "hf_disk"
        if any(p.rglob("*.parquet")):
            return "parquet_dir"
        raise DatasetFormatError(f"{p}: a folder without dataset_dict.json/state.json or *.parquet files; "
                                 "expected a datasets.save_to_disk folder or parquet shards")
    if not p.exists():
        raise DatasetFormatError(f"{p}: no such file or folder")
    with open(p, "rb") as f:
        head = f.read(8)
    if head.startswith(b"PAR1"):
        return "parquet"
    if head.startswith(b"ARROW1") or head[:4] == b"\xff\xff\xff\xff":
        return "arrow"
    if p.suffix == ".jsonl":
        return "jsonl"
    if p.suffix == ".json":
        return "json"
    raise DatasetFormatError(f"{p}: not parquet (PAR1), arrow (ARROW1/IPC stream), .jsonl or .json")


def _iter_jsonl(path: Path) -> Iterator[dict]:
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetFormatError(f"{path}:{lineno}: invalid JSON ({e.msg}); fix or remove the line") from e
            if not isinstance(row, dict):
                raise DatasetFormatError(f"{path}:{lineno}: expected a JSON object, found {type(row).__name__}")
            yield row


def _iter_json(path: Path) -> Iterator[dict]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise DatasetFormatError(f"{path}: expected a JSON list of objects")
    yield from data


def _iter_parquet(path: Path) -> Iterator[dict]:
    import pyarrow.parquet as pq

    for batch in pq.ParquetFile(path).iter_batches(batch_size=64):
        yield from batch.to_pylist()


def _iter_arrow(path: Path) -> Iterator[dict]:
    import pyarrow as pa

    with open(path, "rb") as f:
        is_file_format = f.read(6) == b"ARROW1"
    with pa.memory_map(str(path), "r") as source:
        reader = pa.ipc.open_file(source) if is_file_format else pa.ipc.open_stream(source)
        batches = (reader.get_batch(i) for i in range(reader.num_record_batches)) if is_file_format else reader
        for batch in batches:
            yield from batch.to_pylist()


def _parquet_shards(folder: Path, split: str | None) -> list[Path]:
    files = sorted(folder.rglob("*.parquet"))
    if split is not None:
        files = [f for f in files if f.name.startswith(split + "-") or f.name == split + ".parquet"
                 or f.parent.name == split]
        if not files:
            raise DatasetFormatError(f"{folder}: no parquet shard for split {split!r} "
                                     f"(expected {split}-*.parquet or a {split}/ folder)")
    return files


def _undecoded(ds):
    """Cast Image/Video features (also inside lists) to decode=False so rows hold bytes/paths."""
    import datasets as hfd

    for name, feat in ds.features.items():
        inner = feat.feature if isinstance(feat, (hfd.Sequence, hfd.List)) else feat
        if isinstance(inner, (hfd.Image, getattr(hfd, "Video", ()))) and getattr(inner, "decode", False):
            new_inner = type(inner)(decode=False)
            ds = ds.cast_column(name, hfd.List(new_inner) if inner is not feat else new_inner)
    return ds


def _iter_hf_disk(path: Path, split: str | None) -> Iterator[dict]:
    import datasets as hfd

    ds = hfd.load_from_disk(str(path))
    if isinstance(ds, hfd.DatasetDict):
        if split is None and len(ds) == 1:
            split = next(iter(ds))
        if split not in ds:
            raise DatasetFormatError(f"{path}: expected split= one of {sorted(ds)}, found {split!r}")
        ds = ds[split]
    yield from _undecoded(ds)


def iter_rows(path: str | os.PathLike, split: str | None = None) -> Iterator[dict]:
    """Raw rows (dicts) of a local dataset in any supported layout, in file order."""
    p = Path(path)
    layout = detect_layout(p)
    if layout == "jsonl":
        yield from _iter_jsonl(p)
    elif layout == "json":
        yield from _iter_json(p)
    elif layout == "parquet":
        yield from _iter_parquet(p)
    elif layout == "arrow":
        yield from _iter_arrow(p)
    elif layout == "parquet_dir":
        for shard in _parquet_shards(p, split):
            yield from _iter_parquet(shard)
    else:
        yield from _iter_hf_disk(p, split)


def load_items(path: str | os.PathLike, task=None, *, media_root: str | os.PathLike | None = None,
               split: str | None = None, limit: int | None = None) -> Iterator[Item]:
    """Yield `Item`s from a local dataset. `task` (an eval.tasks.Task) maps task-specific columns;
    `media_root` defaults to the dataset file's folder (or the dataset folder itself). Ids must be
    unique: the runner resumes by id."""
    p = Path(path)
    root = Path(media_root) if media_root is not None else (p if p.is_dir() else p.parent)
    seen: set[str] = set()
    for index, row in enumerate(iter_rows(p, split=split)):
        if limit is not None and index >= limit:
            return
        item = task.item_from_row(row, index, root) if task is not None else row_to_item(row, index, root)
        if item.id in seen:
            raise DatasetFormatError(f"{p}: duplicate item id {item.id!r} at row {index}; ids must be unique "
                                     "(the runner resumes by id)")
        seen.add(item.id)
        yield item
