"""The README's file tree lists every tracked file, and nothing that is not there (keeps the README true)."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def tree_paths() -> set[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("## Files", 1)[1].split("```", 2)[1]
    return {line.split()[0] for line in block.splitlines() if line.strip() and not line.startswith("text")}


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                    reason="needs a git checkout to list the tracked files")
def test_every_tracked_file_is_in_the_tree():
    tracked = set(subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                                 check=True).stdout.split())
    listed = tree_paths()
    assert not (tracked - listed), f"tracked but missing from the README tree: {sorted(tracked - listed)}"
    assert not (listed - tracked), f"in the README tree but not tracked: {sorted(listed - tracked)}"


def test_tree_lines_have_notes_for_library_files():
    block = (ROOT / "README.md").read_text().split("## Files", 1)[1].split("```", 2)[1]
    for line in block.splitlines():
        path = line.split()[0] if line.strip() else ""
        if path.endswith(".py") and not path.startswith("tests/"):
            assert re.search(r"#\s+\S", line), f"no one-line note for {path}"
