"""`vl eval score` entry (eval.score.main) and `summarize` over runner-style records."""

import json

import pytest

from eval.score import latest_per_id, main, read_predictions, summarize
from eval.tasks import RecordError


def _write(path, records, tail=""):
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail, encoding="utf-8")
    return path


def _rec(i, pred, gold="abcd", **kw):
    return {"id": str(i), "prediction": pred, "answers": [gold], **kw}


def test_main_prints_json_summary_with_headline(tmp_path, capsys):
    path = _write(tmp_path / "p.jsonl", [_rec(1, "abce"), _rec(2, "abcd")])
    assert main(["--task", "docvqa_val", "--predictions", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["score"] == pytest.approx(0.875) and out["scale"] == "0-1" and out["metric"] == "anls"
    assert out["n"] == 2 and out["n_error"] == 0 and out["task"] == "docvqa_val"


def test_last_record_wins_and_errors_stay_in_the_denominator(tmp_path):
    records = [_rec(1, "", status="error", error_class="CorruptMediaError"),
               _rec(2, "zzzz", status="timeout"),
               _rec(1, "abcd", status="ok"),  # retried later: replaces the error
               _rec(3, "abcd")]
    s = summarize("docvqa_val", read_predictions(_write(tmp_path / "p.jsonl", records)))
    assert s["n"] == 3 and s["n_ok"] == 2 and s["n_error"] == 1
    assert s["score"] == pytest.approx(2 / 3) and s["duplicate_records_replaced"] == 1
    assert s["errors_by_class"] == {"timeout": 1}
    unique, replaced = latest_per_id(records)
    assert [r["id"] for r in unique] == ["1", "2", "3"] and unique[0]["status"] == "ok" and replaced == 1


def test_error_records_need_the_task_fields_for_aggregation():
    with pytest.raises(RecordError, match="error record"):
        summarize("ocrbench", [_rec(1, "", status="error")])
    fields = {"question_type": "Doc-oriented VQA", "dataset": "DocVQA"}
    s = summarize("ocrbench", [_rec(1, "", status="error", **fields), _rec(2, "abcd", **fields)])
    assert s["score"] == pytest.approx(1 / 1000) and s["n_error"] == 1  # OCRBench sums over 1000: the error adds 0


def test_nothing_answered_has_no_score_not_zero(tmp_path, capsys):
    records = [_rec(1, "", status="error", error_class="unavailable"), _rec(2, "", status="timeout")]
    s = summarize("docvqa_val", records)
    assert s["score"] is None and s["n"] == 2 and s["n_ok"] == 0 and "categories" not in s
    assert s["note"].startswith("no answers") and "unavailable 1" in s["note"] and "timeout 1" in s["note"]
    assert main(["--task", "docvqa_val", "--predictions", str(_write(tmp_path / "p.jsonl", records))]) == 0
    assert json.loads(capsys.readouterr().out)["score"] is None


def test_postprocess_flag_strips_reasoning(tmp_path, capsys):
    path = _write(tmp_path / "raw.jsonl", [_rec(1, "let me look</think> abcd")])
    assert main(["--task", "docvqa_val", "--predictions", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["score"] < 0.5
    assert main(["--task", "docvqa_val", "--predictions", str(path), "--postprocess"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["score"] == 1.0 and out["postprocessed"] is True


@pytest.mark.parametrize("content, code", [
    ('{"id": "1", "prediction": "a", "answers": ["a"]}\n{"id": "2", "predic', "bad_predictions"),
    ('{"id": "1", "prediction": "a"}\n', "bad_record"),
    ('{"id": "1", "prediction": "a", "answers": "a"}\n', "bad_record"),
    ('{"id": "1", "prediction": 3, "answers": ["a"]}\n', "bad_record"),
    ('[1, 2]\n', "bad_predictions"),
])
def test_bad_files_exit_2_with_a_coded_message(tmp_path, capsys, content, code):
    path = tmp_path / "p.jsonl"
    path.write_text(content, encoding="utf-8")
    assert main(["--task", "docvqa_val", "--predictions", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"[{code}]" in err and "Traceback" not in err


def test_bad_line_is_named(tmp_path):
    path = _write(tmp_path / "p.jsonl", [_rec(1, "a")], tail='{"id": "2", "pre')
    with pytest.raises(Exception, match=r"p.jsonl:2"):
        read_predictions(path)


def test_unknown_task_and_missing_file(tmp_path, capsys):
    assert main(["--task", "nope", "--predictions", str(tmp_path / "x.jsonl")]) == 2
    assert "[unknown_task]" in capsys.readouterr().err
    assert main(["--task", "chartqa", "--predictions", str(tmp_path / "x.jsonl")]) == 2
    assert "no predictions file" in capsys.readouterr().err


def test_summarize_accepts_task_objects_and_is_repeatable():
    from eval.tasks import get_task

    task = get_task("ocrbench")
    recs = [_rec(1, "hello", "Hello", question_type="Regular Text Recognition", dataset="IIIT5K")]
    first, second = summarize(task, recs), summarize(task, recs)
    assert first == second and first["correct"] == 1  # no cross-call accumulation (unlike LE's global dict)


def test_runner_flow_on_the_synthetic_export(tmp_path, capsys):
    """Coupling check with data_recipes.synthetic.export_split: its JSONL loads as synthetic_docs items,
    records built by the task re-score through the CLI."""
    synthetic = pytest.importorskip("data_recipes.synthetic", reason="synthetic generator not in this tree")
    from eval.data import load_items
    from eval.tasks import get_task

    task = get_task("synthetic_docs")
    items = list(load_items(synthetic.export_split("document", "test", 3, tmp_path / "set"), task))
    assert len(items) == 3 and all(i.media and i.media[0].path for i in items)
    assert task.build_messages(items[0])[0]["content"][-1] == {"type": "text", "text": items[0].question}
    preds = [items[0].answers[0], f"<think>reading</think> {items[1].answers[0]}.", "no idea"]
    records = [task.prediction_record(item, task.postprocess(p)) for item, p in zip(items, preds)]
    path = _write(tmp_path / "preds.jsonl", records)
    assert main(["--task", "synthetic_docs", "--predictions", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["score"] == pytest.approx(2 / 3) and len(out["categories"]["family"]) == 3
