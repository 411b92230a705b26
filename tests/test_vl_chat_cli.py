"""`vl chat` and `vl --version` as a script sees them: exit codes, only the answer on stdout, `--json`'s schema,
files and flags checked before any model loads.

Answers run on the shipped demo model (vl/demo) over a bundled example, in-process (`vl.chat_cli.main`), and are
compared with `vl.Engine.chat` given the same options; the checks that must not load a model run as subprocesses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "vl" / "demo"
needs_demo = pytest.mark.skipif(not (DEMO / "config.json").is_file(),
                                reason="the demo model (vl/demo) is not trained yet; vl train-demo makes it")
JSON_KEYS = {"answer", "reasoning", "finish_reason", "finished_by", "reasoning_truncated", "note", "model", "stats"}
STATS_KEYS = {"prompt_tokens", "new_tokens", "vision_tokens_before", "vision_tokens_after", "time_to_first_token_s",
              "decode_tokens_per_s", "total_s", "notes", "reductions"}


def _vl(*args, timeout=60):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "vl.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    from ui.examples import ensure_examples, tab_examples

    directory, records = ensure_examples(tmp_path_factory.mktemp("examples"))
    return next(e for e in tab_examples(directory, records)["document"] if e["path"].endswith(".png"))


@pytest.fixture(scope="module")
def engine():
    import vl

    return vl.Engine.from_pretrained(DEMO)


def test_version_prints_the_version_with_rc_0():
    from importlib.metadata import version

    out = _vl("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"vl {version('nemotron-vl')}", out


def test_a_missing_file_is_named_before_any_model_loads(tmp_path):
    missing = tmp_path / "missing.png"
    out = _vl("chat", "--image", str(missing), "--prompt", "What is it?")
    assert out.returncode == 2 and out.stdout == ""
    assert "file_not_found" in out.stderr and str(missing) in out.stderr and "loading" not in out.stderr, out.stderr
    out = _vl("chat", "--video", str(tmp_path), "--prompt", "What happens?", "--json")  # a folder
    assert out.returncode == 2 and json.loads(out.stdout)["error"]["code"] == "file_not_found"


@pytest.mark.parametrize("argv, words", [
    (["--pages", "1-2"], "no --pdf was given"),
    (["--max-tiles", "40"], "--max-tiles must be 1..12"),
    (["--token-pruning-rate", "1.5"], "--token-pruning-rate must be in [0, 1)"),
])
def test_contradictory_or_out_of_range_flags_are_errors(argv, words, capsys):
    from vl.chat_cli import main

    assert main(argv + ["--prompt", "x", "--json"]) == 2
    out, err = capsys.readouterr()
    assert words in json.loads(out)["error"]["message"] and words in err


def test_every_flag_has_help_and_shares_the_common_spelling():
    import argparse

    from vl.cli_flags import add_generation_flags, add_json_flag, add_media_flags, add_model_flags

    p = argparse.ArgumentParser()
    for add in (add_model_flags, add_media_flags, add_generation_flags, add_json_flag):
        add(p)
    shown = [a for a in p._actions if a.help != argparse.SUPPRESS and a.dest != "help"]
    assert all(a.help for a in shown), [a.option_strings for a in shown if not a.help]
    flags = {s for a in p._actions for s in a.option_strings}
    assert {"--thinking", "--dtype", "--device-map", "--video-pruning-rate", "--token-pruning-rate",
            "--skip-blank-tiles", "--max-tiles", "--fps", "--max-frames", "--pages", "--json", "--think"} <= flags
    assert p.parse_args(["--think", "on"]).thinking == "on"  # the old spelling still works


@needs_demo
def test_only_the_answer_goes_to_stdout(example, engine, capsys):
    from vl.chat_cli import main

    assert main(["--image", example["path"], "--prompt", example["question"], "--thinking", "on"]) == 0
    out, err = capsys.readouterr()
    want = engine.chat([{"role": "user", "content": [{"type": "image", "image": example["path"]},
                                                     {"type": "text", "text": example["question"]}]}],
                       thinking=True, max_new_tokens=256)
    assert want.answer and out == want.answer + "\n", (out, err)
    assert "</think>" not in out and "[reasoning]" in err and want.reasoning in err
    assert "finished by: end of answer" in err and "demo model" in err


@needs_demo
def test_json_has_the_documented_schema(example, engine, capsys):
    from vl.chat_cli import main

    assert main(["--image", example["path"], "--prompt", example["question"], "--json", "--thinking", "off",
                 "--max-new-tokens", "8"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)  # stdout is exactly one JSON object
    assert set(doc) == JSON_KEYS and set(doc["stats"]) == STATS_KEYS
    want = engine.chat([{"role": "user", "content": [{"type": "image", "image": example["path"]},
                                                     {"type": "text", "text": example["question"]}]}],
                       thinking=False, max_new_tokens=8)
    assert doc["answer"] == want.answer and doc["finish_reason"] == want.finish_reason
    assert doc["stats"]["new_tokens"] == len(want.token_ids) and doc["reasoning_truncated"] is False
    assert "prompt tokens" in err


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    from ui.examples import ensure_examples, tab_examples

    directory, records = ensure_examples(tmp_path_factory.mktemp("clip_examples"))
    return tab_examples(directory, records)["video"][0]


class _Terminal:
    """A stderr that says it is a terminal (the progress line is then redrawn in place), recording what it gets."""

    def __init__(self):
        self.text = ""

    def isatty(self):
        return True

    def write(self, s):
        self.text += s

    def flush(self):
        pass


@needs_demo
def test_video_progress_goes_to_stderr_frame_by_frame(clip, engine, capsys, monkeypatch):
    from vl import chat_cli

    argv = ["--video", clip["path"], "--prompt", clip["question"], "--max-frames", "8", "--max-new-tokens", "24"]
    assert chat_cli.main(argv) == 0
    out, err = capsys.readouterr()
    want = engine.chat([{"role": "user", "content": [{"type": "video", "video": clip["path"]},
                                                     {"type": "text", "text": clip["question"]}]}],
                       max_new_tokens=24, max_frames=8)
    assert want.answer and out == want.answer + "\n", (out, err)  # stdout: only the answer
    n = 8  # the clip is longer than 4 s: 8 frames are sampled
    assert f"video frames decoded [{'.' * 20}" not in err  # nothing is reported before a frame is decoded
    assert "video frames decoded [" in err and f"] 1/{n}" in err and f"] {n}/{n}" in err, err

    term = _Terminal()  # on a terminal, with no redraw throttle: one redraw per decoded frame
    monkeypatch.setattr(sys, "stderr", term)
    monkeypatch.setattr(chat_cli.Progress.__init__, "__defaults__", (None, 0.0))
    assert chat_cli.main(argv) == 0
    frames = [line.split("] ")[-1] for line in term.text.split("\r\033[K") if line.startswith("video frames decoded")]
    assert frames == [f"{i}/{n}" for i in range(1, n + 1)], term.text
    assert capsys.readouterr().out == want.answer + "\n"
