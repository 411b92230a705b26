"""Reference pages and code comments say what is true now; dated runs and work logs live in docs/journal/.

Fails when a date or UTC stamp, a work-session label or a reference outside the repository ("issue 34", "the
issue's", "../shared", "the lead") appears in docs/*.md, in a docstring or comment of vl/**/*.py, or in a comment of
vl/**/*.cpp / *.h. Exempt by design: docs/journal/ (the dated record itself); docs/reliability.md and vl/demo/README.md,
which scripts write with the run they describe (scripts/reliability_table.py, data_recipes/model_card.py); a date
that pins an upstream source ("commit cb07f55 (2025-06-28)", "last commit 2022-07-19", "vLLM blog 2025-10-28"); a
link into docs/journal/, whose file names are dates; and "session" where it is a browser's or pytest's (per-session
state, `state_session_capacity`).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GENERATED = {"docs/reliability.md", "vl/demo/README.md"}

MONTH = (r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|Sep(?:t(?:ember)?)?"
         r"|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)\.?")
RULES = {
    "date": re.compile(rf"\b20\d\d-\d\d-\d\d\b|\b\d{{1,2}} {MONTH}(?![\w-])|\b{MONTH} \d{{1,2}}, 20\d\d\b"),
    "UTC stamp": re.compile(r"\b\d{1,2}:\d\d(?:\s*-\s*\d{1,2}:\d\d)?\s*UTC\b"),
    "session label": re.compile(r"(?<![\w-])(?<!browser )(?<!per )sessions?(?![\w-])", re.IGNORECASE),
    "reference outside the repository": re.compile(
        r"\b[Ii]ssue\s*#?\d+|\bthe issue's\b|\.\./shared\b|\bthe lead\b(?! (?:row|byte|time)s?\b)"),
}
# what may precede a date that pins an upstream source rather than stamping a run of ours
UPSTREAM = re.compile(r"(?:\bcommit [0-9a-f]{7,40}\W{0,3}|\blast commit |\bblog \(?|\breleased? )$")


def findings(text: str) -> list[tuple[int, str, str]]:
    """(line, rule, matched text) for every stamp or outside reference in `text`."""
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        for rule, pattern in RULES.items():
            for m in pattern.finditer(line):
                before = line[:m.start()]
                if rule == "date" and (UPSTREAM.search(before[-60:]) or before.endswith("journal/")):
                    continue
                out.append((lineno, rule, m.group(0)))
    return out


def python_prose(source: str) -> list[tuple[int, str]]:
    """(first line, text) of every docstring and comment of a Python source; code and other strings are left out."""
    parts = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                parts.append((body[0].lineno, body[0].value.value))
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            parts.append((tok.start[0], tok.string))
    return parts


def cpp_prose(source: str) -> list[tuple[int, str]]:
    return [(source.count("\n", 0, m.start()) + 1, m.group(0))
            for m in re.finditer(r"//[^\n]*|/\*.*?\*/", source, re.DOTALL)]


def reference_texts() -> list[tuple[str, int, str]]:
    """(path, first line, text) of every piece of prose this test holds to the rule."""
    texts = []
    for path in sorted((ROOT / "docs").glob("*.md")):
        rel = path.relative_to(ROOT).as_posix()
        if rel not in GENERATED:
            texts.append((rel, 1, path.read_text()))
    for path in sorted((ROOT / "vl").rglob("*")):
        rel = path.relative_to(ROOT).as_posix()
        if "__pycache__" in rel or rel in GENERATED or not path.is_file():
            continue
        if path.suffix == ".py":
            texts += [(rel, line, text) for line, text in python_prose(path.read_text())]
        elif path.suffix in (".cpp", ".h"):
            texts += [(rel, line, text) for line, text in cpp_prose(path.read_text())]
    return texts


def test_reference_docs_and_code_comments_carry_no_stamps_or_outside_references():
    texts = reference_texts()
    files = {path for path, _, _ in texts}
    assert sum(p.startswith("docs/") for p in files) >= 10 and sum(p.endswith(".py") for p in files) >= 50, \
        f"the scan found too few files to mean anything: {len(files)}"
    bad = [f"{path}:{first + line - 1}: {rule}: {hit!r}"
           for path, first, text in texts for line, rule, hit in findings(text)]
    assert not bad, ("dated runs, session logs and references outside the repository belong in docs/journal/ "
                     "(a reference page keeps the current figure with its command):\n" + "\n".join(bad))


@pytest.mark.parametrize("text,rule", [
    ("measured 3 Dec 2026, before this step existed", "date"),
    ("## Prefetch into L2 (4 Dec 2026)", "date"),
    ("run: 2026-12-06 on the runner", "date"),
    ("Dec 4, 2026 on an Intel runner", "date"),
    ("two runs at 10:04-10:06 UTC", "UTC stamp"),
    ("(12:35 UTC, load average 0.3)", "UTC stamp"),
    ("In a later session the ratio was 1.96x", "session label"),
    ("46.0-47.0% in three sessions", "session label"),
    ("Fourth session's runs", "session label"),
    ("### 12B geometry on one CPU (issue 34, goal 3)", "reference outside the repository"),
    ("what the issue's goal asks", "reference outside the repository"),
    ("one run each; the lead re-measures", "reference outside the repository"),
    ("the target layout of ../shared/DESIGN.md", "reference outside the repository"),
])
def test_the_checker_flags_each_kind_of_stamp(text, rule):
    assert [r for _, r, _ in findings(text)] == [rule]


@pytest.mark.parametrize("text", [
    "The stop flag is per browser session and is cleared when a question is asked",
    "the per-session stop flag and the Stop button's wiring",
    "tiny quantized checkpoints built once per session for the quant tests",
    "| `delete_cache`, `state_session_capacity` | bound disk and memory growth |",
    "`NVlabs/RADIO` @ c0f3701; commit cb07f55 (2025-06-28)",
    "decord is unmaintained (last commit 2022-07-19)",
    "vLLM blog (2025-10-28): leading accuracy",
    "raw output: [journal/2026-12-04-vl-bench.txt](journal/2026-12-04-vl-bench.txt)",
    "`vdpbf16ps` issues only every ~2.2 cycles on this core",
    "2048 tokens at 12 ms per token; 3 Decoders",
])
def test_the_checker_passes_what_is_not_a_stamp(text):
    assert findings(text) == []


def test_docstrings_and_comments_are_read_and_code_is_not():
    source = ('"""Module docstring, 3 Dec 2026."""\n'
              'x = "a string of code, 3 Dec 2026"  # a comment, 12:35 UTC\n'
              'def f():\n    """In a later session."""\n')
    prose = " ".join(text for _, text in python_prose(source))
    assert "a string of code" not in prose
    assert [r for _, r, _ in findings(prose)] == ["date", "UTC stamp", "session label"]
    cpp = 'int x = 1; // measured 4 Dec\nconst char* s = "3 Dec"; /* the\n lead */\n'
    assert [r for _, r, _ in findings(" ".join(t for _, t in cpp_prose(cpp)))] == ["date"]
