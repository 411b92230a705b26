"""The runner end to end with a real (tiny, random) Nano V2 VL checkpoint: every public dataset layout, the
synthetic sets, poison media (row E3), SIGKILL + resume through `python -m eval` (E1), and two processes
under `accelerate launch` against one. Scores are meaningless (random weights); the paths are what is tested.
"""

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image
from processing.media_fixtures import make_pdf, png_header_only, red_square_page
from tiny_models import make_tiny_vl_dir

from data_recipes.synthetic.export import export_split, write_mp4
from eval.backend import EngineBackend
from eval.records import iter_records
from eval.runner import RunConfig, Runner, model_facts
from ui.measure import free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_vl")
    make_tiny_vl_dir(str(path))
    return path


@pytest.fixture(scope="module")
def backend(tiny):
    b = EngineBackend(str(tiny), decode_sandbox=False)
    yield b
    b.close()


def _png(color, size=(48, 40)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


def _mp4(path: Path, n: int = 4) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    frames = [Image.new("RGB", (64, 64), (40 * i, 200 - 40 * i, 90)) for i in range(n)]
    return write_mp4(frames, 2.0, path)


def _run(tiny, backend, task, data, out, **kw):
    cfg = RunConfig(task=task, data=str(data), out=str(out), model=str(tiny), progress=False, isolation="inline",
                    decode_sandbox=False, device="cpu", max_new_tokens=kw.pop("max_new_tokens", 2), **kw)
    return Runner(cfg, backend=backend, facts=model_facts(str(tiny)), log=lambda m: None).run()


def _preds(out: Path) -> list[dict]:
    return list(iter_records(out / "predictions.jsonl"))


def _stable(summary):
    s = {k: v for k, v in summary.items() if k != "run"}
    s["header"] = {k: v for k, v in s["header"].items() if k != "data"}
    # time to first token is wall-clock timing (the summary says so): it differs between any two runs
    s["tokens"] = {k: v for k, v in s["tokens"].items() if k != "time_to_first_token_s"}
    return s


def _no_timing(recs):
    return [{k: v for k, v in r.items() if k != "timing"} for r in recs]


# --- one tiny file per public layout ---------------------------------------------------------------------


def _docvqa_shards(root: Path) -> tuple[Path, dict]:
    folder = root / "DocVQA"
    folder.mkdir(parents=True)
    rows = [{"questionId": 7, "question": "What is the date?", "answers": ["1 May", "May 1"],
             "image": {"bytes": _png((250, 250, 250)), "path": "a.png"}, "question_types": ["form"]},
            {"questionId": 9, "question": "Who signed?", "answers": ["Bob"],
             "image": {"bytes": _png((0, 0, 255)), "path": "b.png"}, "question_types": ["handwritten"]}]
    pq.write_table(pa.Table.from_pylist(rows), folder / "validation-00000-of-00001.parquet")
    return root, {"split": "validation"}


def _infovqa_arrow(root: Path) -> tuple[Path, dict]:
    rows = [{"questionId": 1, "question": "How many?", "answers": ["3"], "answer_type": ["number"],
             "image": {"bytes": _png((10, 200, 10)), "path": "i.png"}},
            {"questionId": 2, "question": "Which year?", "answers": ["2019"], "answer_type": ["number"],
             "image": {"bytes": _png((200, 10, 10)), "path": "j.png"}}]
    table = pa.Table.from_pylist(rows)
    path = root / "infovqa.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return path, {}


def _chartqa_parquet(root: Path) -> tuple[Path, dict]:
    rows = [{"question": "Max value?", "answer": "42", "type": "human_test", "image": {"bytes": _png((9, 9, 9)),
                                                                                      "path": None}},
            {"question": "Is it rising?", "answer": "Yes", "type": "augmented_test",
             "image": {"bytes": _png((99, 9, 9)), "path": None}}]
    path = root / "test-00000-of-00001.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path, {}


def _textvqa_save_to_disk(root: Path) -> tuple[Path, dict]:
    import datasets

    feats = datasets.Features({"question_id": datasets.Value("string"), "question": datasets.Value("string"),
                               "answers": datasets.List(datasets.Value("string")), "image": datasets.Image()})
    rows = [{"question_id": f"t{i}", "question": f"What does sign {i} say?", "answers": ["stop"] * 10,
             "image": {"bytes": _png((30 * i, 60, 90)), "path": None}} for i in range(2)]
    datasets.DatasetDict({"validation": datasets.Dataset.from_list(rows, features=feats)}).save_to_disk(
        str(root / "textvqa"))
    return root / "textvqa", {"split": "validation"}


def _ocrbench_jsonl(root: Path) -> tuple[Path, dict]:
    (root / "img").mkdir(parents=True)
    (root / "img" / "a.png").write_bytes(_png((240, 240, 240)))
    rows = [{"id": 0, "question": " what is written? ", "answer": ["STOP"], "question_type": "Regular Text Recognition",
             "dataset": "IIIT5K", "image": "img/a.png"},
            {"id": 1, "question": "Write the expression", "answer": ["x^2"],
             "question_type": "Handwritten Mathematical Expression Recognition", "dataset": "HME100k",
             "image": "img/a.png"}]
    path = root / "ocrbench.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, {}


def _videomme_parquet(root: Path) -> tuple[Path, dict]:
    _mp4(root / "data" / "vid1.mp4")
    rows = [{"question_id": f"001-{i}", "videoID": "vid1", "question": "What colour?", "answer": "B",
             "options": ["A. red", "B. blue", "C. green", "D. black"], "duration": "short", "domain": "Knowledge",
             "sub_category": "Astronomy", "task_type": "Counting Problem"} for i in (1, 2)]
    path = root / "test-00000-of-00001.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path, {}


def _mlvu_jsonl(root: Path) -> tuple[Path, dict]:
    _mp4(root / "count" / "1.mp4")
    rows = [{"question": "How many?\n(A) 1\n(B) 2\n(C) 3\n(D) 4", "answer": "B", "task_type": "count",
             "video_name": "count/1.mp4"},
            {"question": "What order?\n(A) ab\n(B) ba\n(C) aa\n(D) bb", "answer": "A", "task_type": "order",
             "video_name": "count/1.mp4"}]
    path = root / "mlvu.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, {}


LAYOUTS = [("docvqa_val", _docvqa_shards), ("infovqa_val", _infovqa_arrow), ("chartqa", _chartqa_parquet),
           ("textvqa_val", _textvqa_save_to_disk), ("ocrbench", _ocrbench_jsonl), ("videomme", _videomme_parquet),
           ("mlvu_dev", _mlvu_jsonl)]


@pytest.mark.parametrize("task, build", LAYOUTS, ids=[t for t, _ in LAYOUTS])
def test_public_layout_end_to_end(tiny, backend, tmp_path, task, build):
    (tmp_path / "data").mkdir()
    data, kw = build(tmp_path / "data")
    summary = _run(tiny, backend, task, data, tmp_path / "out", **kw)
    recs = _preds(tmp_path / "out")
    assert len(recs) == 2 and all(r["status"] == "ok" for r in recs), [r.get("error_message") for r in recs]
    assert all(r["tokens"]["vision_before"] > 0 and r["tokens"]["prompt"] > r["tokens"]["vision_before"]
               for r in recs)
    assert summary["counts"]["complete"] and summary["header"]["task"] == task
    assert isinstance(summary["scores"]["score"], float)


@pytest.mark.parametrize("kind, task", [("document", "synthetic_docs"), ("video", "synthetic_video")])
def test_synthetic_sets_end_to_end(tiny, backend, tmp_path, kind, task):
    jsonl = export_split(kind, "test", 3, tmp_path / "data", tile_size=64)
    summary = _run(tiny, backend, task, jsonl, tmp_path / "out", video_pruning_rate=0.5)
    recs = _preds(tmp_path / "out")
    assert len(recs) == 3 and all(r["status"] == "ok" for r in recs), [r.get("error_message") for r in recs]
    assert summary["header"]["evs_rate"] == 0.5 and "family" in summary["scores"]["categories"]
    if kind == "video":  # EVS drops tokens of later frames
        assert summary["tokens"]["vision_after"]["total"] < summary["tokens"]["vision_before"]["total"]


def test_poison_media_are_typed_errors_and_the_run_goes_on(tiny, backend, tmp_path):  # E3
    d = tmp_path / "data"
    d.mkdir()
    (d / "good.png").write_bytes(_png((200, 30, 30)))
    (d / "bomb.png").write_bytes(png_header_only(40000, 40000))
    (d / "truncated.png").write_bytes(_png((1, 2, 3), (64, 64))[:60])
    (d / "corrupt.mp4").write_bytes(os.urandom(100))
    (d / "locked.pdf").write_bytes(make_pdf([red_square_page()], user_password="secret"))
    parts = [("good", "image", "good.png"), ("bomb", "image", "bomb.png"), ("trunc", "image", "truncated.png"),
             ("video", "video", "corrupt.mp4"), ("pdf", "pdf", "locked.pdf"), ("missing", "image", "absent.png"),
             ("good2", "image", "good.png")]
    rows = [{"id": i, "question": "What is the total?", "answer": "1", "family": "doc_total",
             "content": [{"type": kind, kind: name}]} for i, kind, name in parts]
    (d / "set.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = _run(tiny, backend, "synthetic_docs", d / "set.jsonl", tmp_path / "out", batch_size=3)
    by_id = {r["id"]: r for r in _preds(tmp_path / "out")}
    assert by_id["good"]["status"] == by_id["good2"]["status"] == "ok"
    codes = {i: by_id[i]["error_class"] for i in ("bomb", "trunc", "video", "pdf", "missing")}
    assert all(by_id[i]["status"] == "error" and not by_id[i]["retriable"] for i in codes), by_id
    assert codes["bomb"] == "too_large" and codes["pdf"] == "encrypted_pdf", codes
    assert codes["trunc"] in ("corrupt_media", "unsupported_format") and codes["video"] in (
        "corrupt_media", "unsupported_format", "no_video_stream"), codes
    assert summary["counts"]["error"] == 5 and summary["counts"]["ok"] == 2 and summary["run"]["batch_splits"] >= 1
    assert sum(summary["scores"]["errors_by_class"].values()) == 5


# --- through the command line ----------------------------------------------------------------------------


def _cli(tiny, data, out, *extra):
    return [sys.executable, "-m", "eval", "--model", str(tiny), "--task", "synthetic_docs", "--data", str(data),
            "--out", str(out), "--max-new-tokens", "2", "--isolation", "inline", "--decode-sandbox", "off",
            "--device", "cpu", "--no-progress", *extra]


@pytest.fixture(scope="module")
def doc_set(tmp_path_factory):
    return export_split("document", "test", 6, tmp_path_factory.mktemp("docs"), tile_size=64)


@pytest.fixture(scope="module")
def reference_run(tiny, backend, doc_set, tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    return out, _run(tiny, backend, "synthetic_docs", doc_set, out)


@pytest.mark.slow
def test_cli_sigkill_mid_run_then_resume_equals_uninterrupted(tiny, doc_set, reference_run, tmp_path):  # E1
    out = tmp_path / "out"
    log = out / "records" / "rank0.jsonl"
    proc = subprocess.Popen(_cli(tiny, doc_set, out), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if log.exists() and len(log.read_bytes().splitlines()) >= 2:
            break
        time.sleep(0.01)
    assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = len(list(iter_records(log)))
    assert 2 <= killed_at < 6
    done = subprocess.run(_cli(tiny, doc_set, out, "--resume"), cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"{killed_at} done, {6 - killed_at} to run" in done.stderr
    ids = [r["id"] for r in iter_records(log)]
    assert len(ids) == len(set(ids)) == 6
    ref_out, ref_summary = reference_run
    assert _no_timing(_preds(out)) == _no_timing(_preds(ref_out))
    assert _stable(json.loads((out / "summary.json").read_text())) == _stable(ref_summary)
    assert json.loads(done.stdout)["n"] == 6


@pytest.mark.slow
def test_accelerate_two_processes_equal_one(tiny, doc_set, reference_run, tmp_path):
    """`accelerate launch` with two processes on the CPU (torchrun underneath; `--multi_gpu` only selects that
    launcher, the ranks run on --device cpu) gives the same predictions and summary as one process."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(free_port()), "-m", "eval", *_cli(tiny, doc_set, out)[3:]]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    logs = sorted(p.name for p in (out / "records").glob("rank*.jsonl"))
    assert logs == ["rank0.jsonl", "rank1.jsonl"]
    assert [len(list(iter_records(out / "records" / n))) for n in logs] == [3, 3]
    ref_out, ref_summary = reference_run
    summary = json.loads((out / "summary.json").read_text())
    assert summary["run"]["world_size"] == 2
    assert _no_timing(_preds(out)) == _no_timing(_preds(ref_out))
    assert _stable(summary) == _stable(ref_summary)
