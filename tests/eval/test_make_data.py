"""`vl eval make-data` as a user meets it, as subprocesses: the missing-data error names the command, the command
writes the synthetic sets (small here) at the demo model's tile size, twice to the same bytes, and `vl eval` then
runs on what it wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "vl" / "demo"


def vl(*args: str, module: str = "vl.cli") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.skipif(not (DEMO / "config.json").is_file(), reason="the demo model is not shipped here")
def test_missing_data_names_make_data_which_writes_what_eval_reads(tmp_path):
    data = tmp_path / "synthetic"
    missing = vl("eval", "--task", "synthetic_docs", "--data", str(data / "document_test.jsonl"),
                 "--out", str(tmp_path / "run0"), "--no-progress")
    assert missing.returncode == 2 and "error [bad_dataset]" in missing.stderr
    assert "vl eval make-data --out DIR" in missing.stderr and "document_test.jsonl" in missing.stderr

    made = vl("eval", "make-data", "--out", str(data), "--per-family", "1")
    assert made.returncode == 0, made.stderr
    paths = json.loads(made.stdout)
    assert paths == {"synthetic_docs": str(data / "document_test.jsonl"),
                     "synthetic_video": str(data / "video_test.jsonl"),
                     "synthetic_audio": str(data / "audio_test.jsonl")}
    docs, videos, sounds = (rows(data / f"{k}_test.jsonl") for k in ("document", "video", "audio"))
    assert len(docs) == 8 and len(videos) == 5 and len(sounds) == 2  # one per family
    assert {r["split"] for r in docs + videos + sounds} == {"test"}
    assert {part["type"] for r in sounds for part in r["content"]} == {"audio"}
    media = [data / part[part["type"]] for r in docs + videos + sounds for part in r["content"]]
    tile = json.loads((DEMO / "config.json").read_text())["force_image_size"]
    from PIL import Image

    assert {Image.open(p).size for p in media if p.suffix == ".png"} == {(tile, tile)}  # the model's tile
    assert all(p.is_file() and p.stat().st_size > 0 for p in media)
    hints = {line.split(" --task ")[1].split()[0]: line for line in made.stderr.splitlines()
             if line.startswith("next: ")}
    assert hints["synthetic_docs"] == (f"next: vl eval --task synthetic_docs --data {paths['synthetic_docs']} "
                                       "--out runs/synthetic_docs")
    audio = hints["synthetic_audio"]  # the demo model does not hear: the line names a model that does
    assert audio.startswith("next: vl eval --model OMNI --task synthetic_audio") and "Nano Omni" in audio
    first = {p.name: p.read_bytes() for p in media}
    again = vl("eval", "make-data", "--out", str(data), "--per-family", "1", "--model", str(DEMO))
    assert again.returncode == 0, again.stderr
    assert {p.name: p.read_bytes() for p in media} == first  # the same set again, byte for byte
    hints = [line for line in again.stderr.splitlines() if line.startswith("next: ")]
    assert len(hints) == 3 and all(h.startswith(f"next: vl eval --model {DEMO} --task ") for h in hints)

    run = vl("eval", "--task", "synthetic_docs", "--data", paths["synthetic_docs"], "--out", str(tmp_path / "run"),
             "--limit", "3", "--isolation", "inline", "--no-progress")
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout)["ok"] == 3


def test_make_data_refuses_what_it_cannot_make(tmp_path):
    benchmark = vl("eval", "make-data", "--out", str(tmp_path), "--tasks", "docvqa_val")
    assert benchmark.returncode == 2 and "docvqa_val: not generated here" in benchmark.stderr
    text_only = tmp_path / "text_only"
    text_only.mkdir()
    (text_only / "config.json").write_text(json.dumps({"model_type": "nemotron_h"}))
    no_tile = vl("eval", "make-data", "--out", str(tmp_path / "d"), "--model", str(text_only))
    assert no_tile.returncode == 2 and "force_image_size" in no_tile.stderr and "--tile-size" in no_tile.stderr
    bare = vl("make-data", "--out", str(tmp_path / "d"), module="eval")  # python -m eval: no generator to run
    assert bare.returncode == 2 and "vl eval make-data" in bare.stderr
    assert not (tmp_path / "d").exists()


def test_make_data_for_omni_draws_its_video_frame_and_its_audio_set_answers_the_same_locally_and_remotely(tmp_path):
    """An Omni checkpoint has no force_image_size (it sees images at their own resolution; `make-data --model OMNI`
    used to stop there): the sets are drawn at the square frame its video path aims at, and the audio set runs
    under `vl eval` on the model and against `vl serve` of it, with the same answers and audio tokens."""
    sys.path.insert(0, str(REPO / "tests"))
    sys.path.insert(0, str(REPO / "tests" / "server"))
    from helpers import free_port, start_serve, stop, wait_health
    from PIL import Image
    from tiny_models import make_tiny_omni_dir

    omni = Path(make_tiny_omni_dir(tmp_path / "omni")[0])
    data = tmp_path / "data"
    made = vl("eval", "make-data", "--out", str(data), "--per-family", "1", "--model", str(omni))
    assert made.returncode == 0, made.stderr
    video = json.loads((omni / "processor_config.json").read_text())["video_processor"]
    frame = video["patch_size"] * int(video["video_target_num_patches"] ** 0.5)
    docs = rows(data / "document_test.jsonl")
    pictures = [data / part[part["type"]] for r in docs for part in r["content"] if part["type"] == "image"]
    assert pictures and {Image.open(p).size for p in pictures} == {(frame, frame)}
    assert all(line.startswith(f"next: vl eval --model {omni} ") for line in made.stderr.splitlines()
               if line.startswith("next: "))

    audio = str(data / "audio_test.jsonl")
    local = vl("eval", "--model", str(omni), "--task", "synthetic_audio", "--data", audio, "--out",
               str(tmp_path / "local"), "--no-progress")
    assert local.returncode == 0, local.stderr[-2000:]
    port = free_port()
    proc = start_serve(port, "--model", str(omni))
    try:
        wait_health(f"http://127.0.0.1:{port}", proc)
        remote = vl("eval", "--backend", "openai", "--base-url", f"http://127.0.0.1:{port}/v1", "--task",
                    "synthetic_audio", "--data", audio, "--out", str(tmp_path / "remote"), "--no-progress")
    finally:
        stop(proc)
    assert remote.returncode == 0, remote.stderr[-2000:]
    here, there = ({r["id"]: r for r in rows(tmp_path / run / "predictions.jsonl")} for run in ("local", "remote"))
    assert here.keys() == there.keys() and len(here) == 2
    for key, r in here.items():
        assert r["status"] == there[key]["status"] == "ok" and r["prediction"] == there[key]["prediction"]
        assert r["tokens"]["audio"] == there[key]["tokens"]["audio"] > 0
