"""Bundled examples: small synthetic documents and clips with known answers, made on first run.

Nothing binary is committed: `data_recipes.synthetic.export.write_examples` draws them from the synthetic
generators' "examples" split (never train/val/test) and writes PNG / PDF / MP4 files plus `examples.json`.
They go to `ui/examples/` when the package folder is writable, else to a per-user cache folder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).parent / "examples"


def default_examples_dir() -> Path:
    if os.access(PACKAGE_DIR.parent, os.W_OK):
        return PACKAGE_DIR
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "nemotron-vl" / "ui-examples"


def _complete(directory: Path) -> list[dict] | None:
    index = directory / "examples.json"
    if not index.is_file():
        return None
    try:
        records = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    for r in records:
        for part in r.get("content", []):
            name = part.get(part.get("type"))
            if not isinstance(name, str) or not (directory / name).is_file():
                return None
    return records


def ensure_examples(directory: str | Path | None = None) -> tuple[Path, list[dict]]:
    """(folder, records) with every file present; writes them when missing or incomplete."""
    directory = Path(directory) if directory is not None else default_examples_dir()
    records = _complete(directory)
    if records is None:
        from data_recipes.synthetic.export import write_examples

        directory.mkdir(parents=True, exist_ok=True)
        records = write_examples(directory)
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
