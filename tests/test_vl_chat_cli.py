"""`vl chat` and `vl --version` as a script sees them: exit codes, only the answer on stdout, `--json`'s schema,
files, flags and the files' contents checked before any model loads, one reasoning default, help that is true for
every model.

Answers run on the shipped demo model (vl/demo) over a bundled example, in-process (`vl.cli.chat.main`), and are
compared with `vl.Engine.chat` given the same options; the checks that must not load a model, and the exit codes a
script sees, run as subprocesses. "The model was not loaded" is counted from `python -X importtime`: the model's
modules (`vl.runtime.engine`, torch) were never imported.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "vl" / "demo"
needs_demo = pytest.mark.skipif(not (DEMO / "config.json").is_file(),
                                reason="the demo model (vl/demo) is not trained yet; vl train-demo makes it")
JSON_KEYS = {"answer", "reasoning", "finish_reason", "finished_by", "reasoning_truncated", "note", "model", "stats"}
DOCUMENTED_STATS = {"prompt_tokens", "new_tokens", "vision_tokens_before", "vision_tokens_after",
                    "time_to_first_token_s", "decode_tokens_per_s", "total_s", "notes", "reductions"}
MODEL_MODULES = ("vl.runtime.engine", "torch")  # imported only to load the model


def _vl(*args, timeout=120, importtime=False):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    flags = ["-X", "importtime"] if importtime else []
    return subprocess.run([sys.executable, *flags, "-m", "vl.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _imported(stderr: str) -> list[str]:
    """The modules `python -X importtime` reports, in import order."""
    return [line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")]


def _messages(stderr: str) -> list[str]:
    """stderr without the `-X importtime` report."""
    return [line for line in stderr.splitlines() if not line.startswith("import time:")]


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
    from vl.cli.chat import main

    assert main(argv + ["--prompt", "x", "--json"]) == 2
    out, err = capsys.readouterr()
    assert words in json.loads(out)["error"]["message"] and words in err


def test_every_flag_has_help_and_shares_the_common_spelling():
    import argparse

    from vl.cli.flags import add_generation_flags, add_json_flag, add_media_flags, add_model_flags

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
    from vl.cli.chat import main

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
    from vl.cli.chat import main

    assert main(["--image", example["path"], "--prompt", example["question"], "--json", "--thinking", "off",
                 "--max-new-tokens", "8"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)  # stdout is exactly one JSON object
    assert set(doc) == JSON_KEYS and set(doc["stats"]) >= DOCUMENTED_STATS
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
    from vl.cli import chat as chat_cli

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


# --- before the model loads: "loading" at once, unreadable files refused first -------------------------------
@needs_demo
def test_loading_is_said_before_the_model_modules_are_imported(example):
    out = _vl("chat", "--image", example["path"], "--prompt", example["question"], "--json", importtime=True)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stderr.splitlines()
    loading = next(i for i, line in enumerate(lines) if line.startswith(f"loading {DEMO}"))
    first_torch = next(i for i, line in enumerate(lines) if line.startswith("import time:")
                       and line.rsplit("|", 1)[1].strip().split(".")[0] == "torch")
    assert loading < first_torch  # said before the seconds of imports, not after them


def _jpeg_cut_in_half() -> bytes:

    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(buf, "JPEG")
    return buf.getvalue()[: len(buf.getvalue()) // 2]


def _png() -> bytes:

    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, "PNG")
    return buf.getvalue()


@pytest.mark.parametrize("flag, name, content, code", [
    ("--image", "notes.png", lambda: b"meeting notes, not a picture\n", "unsupported_format"),
    ("--image", "photo.jpg", _jpeg_cut_in_half, "corrupt_media"),
    ("--pdf", "report.pdf", lambda: b"<html>a web page saved as .pdf</html>", "unsupported_format"),
    ("--video", "clip.mp4", _png, "unsupported_format"),
])
def test_an_unreadable_file_is_refused_before_the_model_loads(flag, name, content, code, tmp_path):
    bad = tmp_path / name
    bad.write_bytes(content())
    out = _vl("chat", flag, str(bad), "--prompt", "What is it?", importtime=True)
    messages = _messages(out.stderr)
    assert out.returncode == 2 and out.stdout == "", out
    assert any(line.startswith(f"error [{code}]: {flag} {bad}: ") for line in messages), messages
    assert not any(line.startswith("loading") for line in messages), messages
    assert not set(MODEL_MODULES) & set(_imported(out.stderr))  # the model was never loaded


@needs_demo
def test_a_refused_file_then_a_good_one_in_one_process(example, tmp_path, capsys):
    from vl.cli.chat import main

    bad = tmp_path / "scan.png"
    bad.write_bytes(_jpeg_cut_in_half())  # a JPEG named .png, cut short: read by content, refused as corrupt
    assert main(["--image", str(bad), "--prompt", "What is it?", "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["error"]["code"] == "corrupt_media"
    assert main(["--image", example["path"], "--prompt", example["question"], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["answer"]


# --- one reasoning default; no silent exit 0 without an answer -----------------------------------------------
def _ask(example, *flags):
    return _vl("chat", "--image", example["path"], "--prompt", example["question"], *flags)


@needs_demo
def test_reasoning_is_off_unless_asked_for(example, engine):
    from vl.options import DEFAULT_THINKING, RequestOptions

    assert RequestOptions().thinking is None and DEFAULT_THINKING is False  # unset: a message's toggle, else off
    messages = [{"role": "user", "content": [{"type": "image", "image": example["path"]},
                                             {"type": "text", "text": example["question"]}]}]
    off, on = engine.chat(messages), engine.chat(messages, thinking=True)  # Engine.chat: the same default
    assert off.reasoning == "" and off.answer and on.reasoning
    plain = _ask(example)
    assert plain.returncode == 0 and plain.stdout == off.answer + "\n", plain
    assert "[reasoning]" not in plain.stderr
    thinking = _ask(example, "--thinking")  # the flag alone turns it on
    assert thinking.returncode == 0 and thinking.stdout == on.answer + "\n", thinking
    assert "[reasoning]" in thinking.stderr and on.reasoning in thinking.stderr


@needs_demo
def test_no_complete_answer_exits_3_with_a_note(example):
    inside = _ask(example, "--thinking", "on", "--max-new-tokens", "4")  # the limit comes inside the reasoning
    assert inside.returncode == 3 and inside.stdout == "", inside
    last = inside.stderr.strip().splitlines()[-1]
    assert last.startswith("no complete answer (exit code 3): the reasoning did not finish") and \
        "--max-new-tokens" in last, inside.stderr
    doc = _ask(example, "--thinking", "--max-new-tokens", "4", "--json")
    assert doc.returncode == 3 and json.loads(doc.stdout)["answer"] == "" and json.loads(doc.stdout)["note"]
    cut = _ask(example, "--max-new-tokens", "1")  # no reasoning; the limit ends the answer itself
    assert cut.returncode == 3 and "may be cut short; raise --max-new-tokens" in cut.stderr, cut
    fixed_length = _ask(example, "--max-new-tokens", "3", "--ignore-eos")  # the limit is the asked-for end
    assert fixed_length.returncode == 0 and "no complete answer" not in fixed_length.stderr, fixed_length


def test_incomplete_note_covers_every_way_to_end_without_an_answer():
    from vl.cli.chat import incomplete_note
    from vl.runtime.results import ChatResult, Stats

    def result(answer, finish, truncated=False):
        return ChatResult(answer, "r" if truncated else "", answer, [1, 2], Stats(new_tokens=2), finish, truncated)

    assert incomplete_note(result("12", "stop")) is None and incomplete_note(result("12", "stop_string")) is None
    assert "did not finish within the token limit" in incomplete_note(result("", "length", truncated=True))
    assert "ended its turn inside its reasoning" in incomplete_note(result("", "stop", truncated=True))
    assert "empty answer" in incomplete_note(result("  ", "stop"))
    assert "may be cut short" in incomplete_note(result("12", "length"))
    assert incomplete_note(result("12", "length"), ignore_eos=True) is None


# --- help that is true for every model; --json carries every stats field ---------------------------------------
def test_help_says_what_holds_for_any_checkpoint():
    out = _vl("chat", "--help")
    text = " ".join(out.stdout.split())
    assert out.returncode == 0
    assert "512-px tiles" not in text and "default: the model's, 12" not in text
    assert "(default: the checkpoint's max_num_tiles)" in text
    assert "(/no_think); default: a /think or /no_think in the messages, else off; --thinking alone turns it on" \
        in " ".join(text.split())


def test_quantize_help_does_not_import_torch():
    out = _vl("quantize", "--help", importtime=True)
    assert out.returncode == 0 and "--format fp8|nvfp4" in out.stdout, out
    assert not set(MODEL_MODULES) & set(_imported(out.stderr))
    assert "torch" not in {m.split(".")[0] for m in _imported(out.stderr)}


def test_json_stats_carry_every_field_of_the_results_stats():
    """A field another part adds to `Stats` (a note, a counter) reaches --json without a change here."""
    from vl.cli.chat import result_json
    from vl.runtime.results import ChatResult, Stats

    Extended = dataclasses.make_dataclass("Extended", [("pruning_floor_kept", int, 0)], bases=(Stats,))
    stats = Extended(new_tokens=3, total_s=0.123456, notes=["a note"], pruning_floor_kept=7)
    doc = result_json(ChatResult("12", "", "12", [1, 2, 3], stats, "stop"), "m")
    reported = {f.name for f in dataclasses.fields(Extended) if not f.metadata.get("in_process")}
    assert set(doc["stats"]) == reported >= DOCUMENTED_STATS | {"pruning_floor_kept"}
    assert (doc["stats"]["pruning_floor_kept"], doc["stats"]["notes"], doc["stats"]["total_s"]) == (7, ["a note"],
                                                                                                    0.1235)
    json.dumps(doc)


def test_stats_refuse_an_undeclared_attribute_and_keep_in_process_fields_out_of_json():
    """Every `Stats` field is declared (slots): a caller cannot attach a stray attribute; the app's tensors
    (vision_keep, media_items, pixel_values) are declared but never printed by --json."""
    import torch

    from vl.cli.chat import result_json
    from vl.runtime.results import ChatResult, Stats

    stats = Stats(new_tokens=2)
    with pytest.raises(AttributeError, match="vision_kept"):
        stats.vision_kept = None  # a misspelt field
    stats.vision_keep, stats.pixel_values, stats.media_items = torch.ones(4, dtype=torch.bool), torch.zeros(3, 3), []
    doc = result_json(ChatResult("a", "", "a", [1, 2], stats, "stop"), "m")
    assert set(doc["stats"]) == set(stats.as_dict()) >= DOCUMENTED_STATS
    assert not {"vision_keep", "pixel_values", "media_items"} & set(doc["stats"])


def test_files_the_model_reads_pass_the_check(example, clip, tmp_path):
    """The early check is the processor's own (vl.processing): what the model reads passes it, a TIFF scan too."""

    from vl.cli.chat import parse_args
    from vl.cli.flags import check_media_files, options_from_args

    scan = tmp_path / "scan.tif"
    Image.new("L", (40, 30), 255).save(scan, "TIFF", compression="tiff_lzw")
    pdf = next(e for e in _examples(tmp_path)["document"] if e["path"].endswith(".pdf"))["path"]
    args = parse_args(["--image", example["path"], "--image", str(scan), "--pdf", pdf, "--video", clip["path"],
                       "--prompt", "x"])
    check_media_files(args, options_from_args(args))  # raises nothing
    one_page = parse_args(["--pdf", pdf, "--max-pages", "1", "--prompt", "x"])
    from vl.errors import MediaTooLargeError

    with pytest.raises(MediaTooLargeError, match="--pdf .*at most 1"):  # the page cap, before any load
        check_media_files(one_page, options_from_args(one_page))


def _examples(directory):
    from ui.examples import ensure_examples, tab_examples

    found, records = ensure_examples(directory / "examples")
    return tab_examples(found, records)


@needs_demo
def test_the_pruning_note_reaches_json_and_stderr_as_it_is(example):
    """The note redundant-token pruning writes when its similarity floor keeps tokens (token_reduction) reaches
    both outputs through `Stats.notes`, with nothing in vl chat that knows about it."""
    doc = _ask(example, "--token-pruning-rate", "0.6", "--json")
    assert doc.returncode == 0, doc.stderr
    stats = json.loads(doc.stdout)["stats"]
    notes = [n for n in stats["notes"] if n.startswith("redundant-token pruning 0.6 kept")]
    assert len(notes) == 1 and "similarity floor" in notes[0] and stats["reductions"][0]["note"] == notes[0]
    plain = _ask(example, "--token-pruning-rate", "0.6")
    assert f"note: {notes[0]}" in plain.stderr.splitlines()


# --- audio: --audio, a video's sound track, models that do not hear -------------------------------------------
def _write_wav(path, wave_f32, rate=16000):
    import wave


    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes((np.clip(wave_f32, -1, 1) * 32767).astype("<i2").tobytes())
    return str(path)


@pytest.fixture(scope="module")
def omni_media(tmp_path_factory):
    """A tiny random Omni directory (tests/tiny_models.py), a WAV tone, an H.264 + AAC clip and a broken WAV."""
    sys.path.insert(0, str(REPO / "tests" / "processing"))
    from media_fixtures import tone, write_video
    from tiny_models import make_tiny_omni_dir

    d = tmp_path_factory.mktemp("omni_cli")
    model, _ = make_tiny_omni_dir(d / "omni")
    broken = d / "broken.wav"
    broken.write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunk")
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 56, 3), dtype=np.uint8)).save(d / "page.png")
    return {"model": str(model), "wav": _write_wav(d / "tone.wav", tone(16000, 1.5, 440.0, 0.2)),
            "video": str(write_video(d / "clip.mp4", seconds=2.0)), "broken": str(broken), "image": str(d / "page.png")}


OMNI_QUESTION = ["--prompt", "What is heard?", "--max-new-tokens", "4", "--ignore-eos"]


def _omni_in_process(omni_media, capsys, *flags) -> tuple[int, dict, str]:
    from vl.cli.chat import main

    rc = main(["--model", omni_media["model"], *OMNI_QUESTION, "--json", *flags])
    out, err = capsys.readouterr()
    return rc, json.loads(out), err


def test_an_audio_question_twice_after_a_bad_audio_gives_the_engines_answer(omni_media, capsys):
    """A broken WAV is refused by its probe before the model loads (exit 2, typed code, the flag and path named);
    the same question on a good WAV then answers as a script sees it (a subprocess: the answer alone on stdout,
    the audio tokens in the stats line) and again in-process with --json, both equal to `vl.Engine.chat`; --json
    carries the audio tokens and the stage times."""
    import vl

    bad = _vl("chat", "--model", omni_media["model"], "--audio", omni_media["broken"], *OMNI_QUESTION, "--json")
    doc = json.loads(bad.stdout)
    assert bad.returncode == 2 and doc["error"]["code"] == "corrupt_media", bad
    assert f"--audio {omni_media['broken']}: " in doc["error"]["message"] and "loading" not in bad.stderr
    engine = vl.Engine.from_pretrained(omni_media["model"])
    want = engine.chat([{"role": "user", "content": [{"type": "audio", "audio": omni_media["wav"]},
                                                     {"type": "text", "text": "What is heard?"}]}],
                       max_new_tokens=4, ignore_eos=True)
    plain = _vl("chat", "--model", omni_media["model"], "--audio", omni_media["wav"], *OMNI_QUESTION)
    assert plain.returncode == 0 and plain.stdout == want.answer + "\n", plain
    assert f", audio tokens {want.stats.audio_tokens}, " in plain.stderr
    rc, doc, _ = _omni_in_process(omni_media, capsys, "--audio", omni_media["wav"])
    assert rc == 0 and doc["answer"] == want.answer
    assert doc["stats"]["audio_tokens"] == want.stats.audio_tokens > 0
    assert {"media", "audio", "prefill", "decode"} <= set(doc["stats"]["stages_s"])


def test_a_videos_sound_is_heard_unless_no_audio(omni_media, capsys):
    rc_on, on, err_on = _omni_in_process(omni_media, capsys, "--video", omni_media["video"], "--max-frames", "4")
    rc_off, off, err_off = _omni_in_process(omni_media, capsys, "--video", omni_media["video"], "--max-frames", "4",
                                            "--no-audio")
    assert rc_on == rc_off == 0, (err_on, err_off)
    assert on["stats"]["audio_tokens"] > 0 and off["stats"]["audio_tokens"] == 0
    assert on["stats"]["prompt_tokens"] == off["stats"]["prompt_tokens"] + on["stats"]["audio_tokens"] + 2
    assert f", audio tokens {on['stats']['audio_tokens']}, " in err_on and "audio tokens" not in err_off
    _, same, _ = _omni_in_process(omni_media, capsys, "--video", omni_media["video"], "--max-frames", "4",
                                  "--with-audio", "off")  # the generated spelling means the same
    assert same["stats"]["prompt_tokens"] == off["stats"]["prompt_tokens"] and same["answer"] == off["answer"]


def test_a_released_omni_directory_answers_as_its_transformers_layout_does(omni_media, tmp_path):
    """The hub's Omni directories are written for their remote code (config.json names
    `NemotronH_Nano_Omni_Reasoning_V3`, with auto_map and the older key names; no feature-extractor file): `vl chat`
    loads one without running or offering to run that code (stdin stays open, as at a terminal, where transformers
    would ask), a bad clip first is refused by its flag, then an image and audio question answers twice as the
    transformers-layout copy of the same weights does."""
    import vl
    from tiny_models import make_released_omni_dir

    released = make_released_omni_dir(omni_media["model"], tmp_path / "released")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}

    def chat(*flags):
        with subprocess.Popen([sys.executable, "-m", "vl.cli", "chat", "--model", str(released), *flags,
                               *OMNI_QUESTION, "--json"], cwd=REPO, env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
            out, err = proc.communicate(timeout=120)  # stdin is never written nor closed before the answer
        assert "custom code" not in err and "trust_remote_code" not in err, err
        assert "unknown" not in err  # every key of the hub files has its reason
        return proc.returncode, json.loads(out), err

    rc, doc, _ = chat("--audio", omni_media["broken"])
    assert rc == 2 and doc["error"]["code"] == "corrupt_media", doc
    engine = vl.Engine.from_pretrained(omni_media["model"])
    want = engine.chat([{"role": "user", "content": [{"type": "image", "image": omni_media["image"]},
                                                     {"type": "audio", "audio": omni_media["wav"]},
                                                     {"type": "text", "text": "What is heard?"}]}],
                       max_new_tokens=4, ignore_eos=True)
    for _ in range(2):
        rc, doc, err = chat("--image", omni_media["image"], "--audio", omni_media["wav"])
        assert rc == 0 and doc["answer"] == want.answer, err
        assert doc["stats"]["audio_tokens"] == want.stats.audio_tokens > 0
        assert doc["stats"]["prompt_tokens"] == want.stats.prompt_tokens


@pytest.mark.parametrize("model", ["demo", "omni_without_audio"])
def test_audio_to_a_model_that_does_not_hear_is_refused_before_it_loads(model, omni_media, tmp_path):
    wav = omni_media["wav"]
    if model == "demo":
        argv = ["--audio", wav]
    else:
        from tiny_models import make_tiny_omni_dir

        d, _ = make_tiny_omni_dir(tmp_path / "deaf", audio=False)
        argv = ["--model", str(d), "--audio", wav]
    out = _vl("chat", *argv, "--prompt", "What is heard?", "--json", importtime=True)
    messages = _messages(out.stderr)
    assert out.returncode == 2 and json.loads(out.stdout)["error"]["code"] == "no_audio", out
    assert any(line.startswith("error [no_audio]: --audio: ") and "no audio encoder" in line for line in messages)
    assert not set(MODEL_MODULES) & set(_imported(out.stderr))  # refused from config.json alone


def test_too_many_audio_files_and_a_missing_one_are_refused_first(omni_media, tmp_path, capsys):
    from vl.cli.chat import main

    assert main(["--audio", omni_media["wav"]] * 5 + ["--prompt", "x", "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["error"]["code"] == "too_many_items"
    assert main(["--audio", str(tmp_path / "gone.wav"), "--prompt", "x", "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["error"]["code"] == "file_not_found"


@needs_demo
def test_a_folder_of_checkpoints_as_the_model_names_its_checkpoints(tmp_path):
    """`--model FOLDER` where FOLDER holds checkpoints (as `vl app --model FOLDER` takes it): the error names the
    ones that would load and how to pass one, skipping a sub-folder whose config.json is broken; the suggestion
    then answers."""
    import shutil

    folder = tmp_path / "models"
    shutil.copytree(DEMO, folder / "demo")
    (folder / "aa_broken").mkdir()
    (folder / "aa_broken" / "config.json").write_text('{"model_type": ')
    (folder / "notes").mkdir()
    wrong = _vl("chat", "--model", str(folder), "--prompt", "Hi.")
    assert wrong.returncode == 2 and wrong.stdout == ""
    assert f"{folder}: no config.json; it is a folder of checkpoints (demo): pass one of them, e.g. --model " \
           f"{folder / 'demo'}" in wrong.stderr and f"vl app --model {folder}" in wrong.stderr, wrong.stderr
    plain = _vl("chat", "--model", str(folder / "notes"), "--prompt", "Hi.")  # no checkpoints inside: no hint
    assert plain.returncode == 2 and plain.stderr.strip().endswith(f"{folder / 'notes'}: no config.json")
    right = _vl("chat", "--model", str(folder / "demo"), "--prompt", "Hi.")
    assert right.returncode == 0 and right.stdout.strip(), right.stderr


def test_an_empty_recording_found_by_the_request_is_named_by_its_flag_and_file(omni_media, capsys, tmp_path):
    """A WAV with no samples passes the header check and is refused when the request decodes it: the error names
    the flag and file as the checks before the load do, alone and as the second of two; the good clip then answers."""
    import wave

    empty = tmp_path / "empty.wav"
    with wave.open(str(empty), "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000)
        w.writeframes(b"")
    for flags in (["--audio", str(empty)], ["--audio", omni_media["wav"], "--audio", str(empty)]):
        rc, doc, err = _omni_in_process(omni_media, capsys, *flags)
        assert rc == 2 and doc["error"]["code"] == "audio_too_short", doc
        assert doc["error"]["message"].startswith(f"--audio {empty}: the audio holds no sound"), doc
        assert f"error [audio_too_short]: --audio {empty}: " in err
    rc, doc, _ = _omni_in_process(omni_media, capsys, "--audio", omni_media["wav"], "--audio", omni_media["wav"])
    assert rc == 0 and doc["stats"]["audio_tokens"] > 0

