"""The items of a run, planned before any model call: each dataset row made into the task's item, in file order
and within `limit`, with its content digest; a row whose media reference is refused (a URL, a path outside the
media root) becomes an item without media and the typed error it is recorded with; a dataset the task cannot
score (no rows, duplicate ids, a row without the fields its scorer needs) stops the run before it starts."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from eval.data import MEDIA_COLUMNS, DatasetFormatError, Item, iter_rows, row_to_item
from eval.fingerprint import item_digest
from eval.run_config import RunConfig
from eval.tasks import RecordError, Task
from vl.errors import InputError, VLError


@dataclass
class Planned:
    index: int
    id: str
    digest: str
    attempt: int = 1
    problem: VLError | None = None  # the item could not be built (URL / out-of-root media): no model call


def _media_free_item(task: Task, row: dict, index: int, root: str) -> Item:
    clean = {k: v for k, v in row.items() if k not in MEDIA_COLUMNS and k != "content"}
    return row_to_item(clean, index, root, id_keys=task.id_keys)


def iter_items(task: Task, cfg: RunConfig, wanted: set[int] | None = None) -> Iterator[tuple[int, Item, VLError | None]]:
    """(row index, item, problem) in file order. A row whose media reference is refused (a URL, a path
    outside the media root) still yields an item, without media, plus the typed error it gets recorded with.
    A row the task cannot score at all (no question, no required field) stops the run: that is a broken
    dataset, not a bad item."""
    data = Path(cfg.data)
    root = cfg.media_root or str(data if data.is_dir() else data.parent)
    for index, row in enumerate(iter_rows(data, split=cfg.split)):
        if cfg.limit is not None and index >= cfg.limit:
            return
        if wanted is not None and index not in wanted:
            continue
        problem = None
        try:
            item = task.item_from_row(row, index, root)
        except DatasetFormatError:
            raise
        except InputError as e:
            item, problem = _media_free_item(task, row, index, root), e
        yield index, item, problem


def plan_items(task: Task, cfg: RunConfig) -> list[Planned]:
    if not Path(cfg.data).exists():
        raise DatasetFormatError(f"{cfg.data}: no such file or folder; {task.missing_data_hint()}")
    plan, seen = [], set()
    for index, item, problem in iter_items(task, cfg):
        if item.id in seen:
            raise DatasetFormatError(f"{cfg.data}: duplicate item id {item.id!r} at row {index}; ids must be "
                                     "unique (records are keyed by id)")
        seen.add(item.id)
        try:
            task.check_record(task.prediction_record(item, ""))  # fail now, not after hours of generation
            digest = item_digest(task, item)
        except RecordError as e:
            raise DatasetFormatError(f"{cfg.data}: row {index} (id {item.id!r}) cannot be scored by "
                                     f"{task.name}: {e}") from e
        plan.append(Planned(index, item.id, digest, problem=problem))
    if not plan:
        raise DatasetFormatError(f"{cfg.data}: no items (split={cfg.split!r}, limit={cfg.limit})")
    return plan
