"""Bundled examples: small synthetic documents and clips with known answers, made on first run.

Nothing binary is committed: `data_recipes.synthetic.export.write_examples` draws them from the synthetic
generators' "examples" split (never train/val/test) and writes PNG / PDF / MP4 files plus `examples.json`.
They go to `ui/examples/` when the package folder is writable, else to a per-user cache folder.

They are drawn as the shipped demo model was trained: pages at its tile size (read from its config.json, 96 px)
and 8-frame clips.
The demo model reads glyphs only as rasterized at that size: the same pages drawn at 256 px and resized
read worse (docs/demo_model.md), so larger examples would misrepresent it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from vl.directory import default_model, read_config
from vl.errors import VLError

PACKAGE_DIR = Path(__file__).parent / "examples"
DEMO_TILE_SIZE = 96  # the shipped demo model's force_image_size, if its config cannot be read


def default_examples_dir() -> Path:
    if os.access(PACKAGE_DIR.parent, os.W_OK):
        return PACKAGE_DIR
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "nemotron-vl" / "ui-examples"


def example_tile_size() -> int:
    """The shipped demo model's tile size (`force_image_size` of vl/demo/config.json): the examples show what the
    demo model reads, drawn as it was trained, whatever model is served."""
    try:
        size = read_config(Path(default_model())).get("force_image_size")
    except VLError:
        size = None
    return size if isinstance(size, int) and size > 0 else DEMO_TILE_SIZE


def _complete(directory: Path, tile_size: int) -> list[dict] | None:
    from data_recipes.synthetic.export import examples_stamp

    index, stamp = directory / "examples.json", directory / "examples.stamp.json"
    if not (index.is_file() and stamp.is_file()):
        return None
    try:
        records = json.loads(index.read_text(encoding="utf-8"))
        if json.loads(stamp.read_text(encoding="utf-8")) != examples_stamp(tile_size):
            return None
    except (OSError, ValueError):
        return None
    for r in records:
        for part in r.get("content", []):
            name = part.get(part.get("type"))
            if not isinstance(name, str) or not (directory / name).is_file():
                return None
    return records


def ensure_examples(directory: str | Path | None = None) -> tuple[Path, list[dict]]:
    """(folder, records) with every file present; writes them when missing, incomplete or drawn at another size."""
    directory = Path(directory) if directory is not None else default_examples_dir()
    tile_size = example_tile_size()
    records = _complete(directory, tile_size)
    if records is None:
        from data_recipes.synthetic.export import write_examples

        directory.mkdir(parents=True, exist_ok=True)
        records = write_examples(directory, tile_size=tile_size)
    return directory.resolve(), records


def tab_examples(directory: Path, records: list[dict]) -> dict[str, list[dict]]:
    """{"document": [{path, question, pages}], "video": [{path, question}]} for the tabs' example tables."""
    out: dict[str, list[dict]] = {"document": [], "video": []}
    for r in records:
        for part in r.get("content", []):
            kind = part.get("type")
            if kind in ("image", "pdf"):
                out["document"].append({"path": str(directory / part[kind]), "question": r["question"],
                                        "pages": "", "answer": r.get("answer")})
            elif kind == "video":
                out["video"].append({"path": str(directory / part[kind]), "question": r["question"],
                                     "answer": r.get("answer")})
    return out
