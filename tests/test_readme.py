"""The docs stay true: docs/architecture.md lists every tracked file (and nothing that is not there), each library
file with a one-line note; the README stays a user's guide of at most 250 lines whose local links resolve."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "docs" / "architecture.md"


def tree_block() -> str:
    return TREE.read_text().split("## Files", 1)[1].split("```", 2)[1]


def tree_paths() -> set[str]:
    return {line.split()[0] for line in tree_block().splitlines() if line.strip() and not line.startswith("text")}


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                    reason="needs a git checkout to list the tracked files")
def test_every_tracked_file_is_in_the_tree():
    tracked = set(subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                                 check=True).stdout.split())
    listed = tree_paths()
    assert not (tracked - listed), f"tracked but missing from docs/architecture.md: {sorted(tracked - listed)}"
    assert not (listed - tracked), f"in docs/architecture.md but not tracked: {sorted(listed - tracked)}"


def test_tree_lines_have_notes_for_library_files():
    for line in tree_block().splitlines():
        path = line.split()[0] if line.strip() else ""
        if path.endswith(".py") and not path.startswith("tests/"):
            assert re.search(r"#\s+\S", line), f"no one-line note for {path}"


def test_readme_is_a_short_guide_whose_links_resolve():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250, f"README.md has {len(text.splitlines())} lines; move detail to docs/"
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" not in target:
            assert (ROOT / target).exists(), f"README links to {target}, which does not exist"
