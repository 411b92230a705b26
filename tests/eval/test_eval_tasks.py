"""Task definitions: harness prompts, messages, records and aggregation on the harness scale."""

import pytest

from eval.data import Item, MediaRef
from eval.score import summarize
from eval.tasks import RecordError, UnknownTaskError, get_task, task_names

SUFFIX = "\nAnswer the question using a single word or phrase."


def test_registry_loads_every_task_with_a_complete_header():
    assert set(task_names()) == {"docvqa_val", "infovqa_val", "chartqa", "textvqa_val", "ocrbench", "videomme",
                                 "mlvu_dev", "mlvu_test", "synthetic_docs", "synthetic_video",
                                 "synthetic_audio"}
    for name in task_names():
        head = get_task(name).header()
        assert head["task"] == name and head["scale"] in ("0-1", "percent") and head["max_new_tokens"] > 0
        assert head["harness"].startswith("lmms-eval@")
    assert get_task("DocVQA").name == "docvqa_val" and get_task("mlvu").name == "mlvu_dev"
    with pytest.raises(UnknownTaskError, match="docvqa_val"):
        get_task("mmmu")


@pytest.mark.parametrize("task, question, expected, budget", [
    ("docvqa_val", "What is the date?", "What is the date?" + SUFFIX, 32),
    ("infovqa_val", "How many?", "How many?" + SUFFIX, 32),
    ("chartqa", "Max value?", "Max value?\nAnswer the question with a single word.", 16),
    ("textvqa_val", "What does NASA say?", "What does nasa say?" + SUFFIX, 32),  # str.capitalize quirk
    ("ocrbench", "  what is written?\n", "what is written?", 128),
    ("mlvu_dev", "Q?\n(A) a\n(B) b", "Q?\n(A) a\n(B) b\nOnly give the best option.\nBest option: (", 16),
    ("synthetic_docs", "What is the total?", "What is the total?", 32),
])
def test_prompts_are_the_harness_prompts(task, question, expected, budget):
    t = get_task(task)
    assert t.prompt_text(Item("1", question, ("x",))) == expected
    assert t.generation_kwargs() == {"max_new_tokens": budget, "temperature": 0.0}


def test_videomme_prompt_matches_le_layout():
    item = Item("1", "What colour is the car?", ("B",),
                fields={"options": ["A. red", "B. blue", "C. green", "D. black"]})
    assert get_task("videomme").prompt_text(item) == (
        "Select the best answer to the following multiple-choice question based on the video and the subtitles. "
        "Respond with only the letter (A, B, C, or D) of the correct option.\n"
        "What colour is the car?\nA. red\nB. blue\nC. green\nD. black\n\n"
        "Answer with the option's letter from the given choices directly.")
    with pytest.raises(RecordError, match="options"):
        get_task("videomme").prompt_text(Item("2", "q", ("A",)))


def test_messages_put_media_first_then_text():
    item = Item("1", "Q?", ("a",), media=(MediaRef("image", data=b"png"), MediaRef("image", path="/d/x.png")))
    (msg,) = get_task("docvqa_val").build_messages(item)
    assert msg["role"] == "user"
    assert msg["content"] == [{"type": "image", "image": b"png"}, {"type": "image", "image": "/d/x.png"},
                              {"type": "text", "text": "Q?" + SUFFIX}]
    video = Item("2", "q", ("A",), media=(MediaRef("video", path="/v.mp4"),), fields={"task_type": "count"})
    assert get_task("mlvu_dev").build_messages(video)[0]["content"][0] == {"type": "video", "video": "/v.mp4"}


def test_postprocess_strips_reasoning_only():
    t = get_task("chartqa")
    assert t.postprocess("thinking about it</think>\n 42 ") == "42"
    assert t.postprocess("42.") == "42."  # no further rewriting


def test_prediction_record_carries_the_task_fields():
    t = get_task("ocrbench")
    item = Item("5", "q", ("Hello",), fields={"question_type": "Regular Text Recognition", "dataset": "IIIT5K",
                                              "other": 1})
    assert t.prediction_record(item, "hello", status="ok") == {
        "id": "5", "prediction": "hello", "answers": ["Hello"], "question_type": "Regular Text Recognition",
        "dataset": "IIIT5K", "status": "ok"}
    with pytest.raises(RecordError, match="question_type"):
        t.prediction_record(Item("6", "q", ("a",)), "a")


def test_docvqa_mean_anls_and_list_categories():
    recs = [{"id": "1", "prediction": "abce", "answers": ["abcd"], "question_types": ["form", "table"]},
            {"id": "2", "prediction": "x", "answers": ["y"], "question_types": ["form"]}]
    s = summarize("docvqa_val", recs)
    assert s["score"] == pytest.approx(0.375) and s["scale"] == "0-1"
    assert s["categories"]["question_types"] == {"form": {"score": 0.375, "n": 2}, "table": {"score": 0.75, "n": 1}}


def test_chartqa_splits_and_single_answer_rule():
    recs = [{"id": "1", "prediction": "104", "answers": ["100"], "type": "human_test"},
            {"id": "2", "prediction": "Yes", "answers": ["No"], "type": "augmented_test"},
            {"id": "3", "prediction": "12%", "answers": ["0.12"], "type": "augmented_test"}]
    s = summarize("chartqa", recs)
    assert s["score"] == pytest.approx(2 / 3)
    assert s["relaxed_human_split"] == 1.0 and s["relaxed_augmented_split"] == 0.5
    with pytest.raises(RecordError, match="single"):
        summarize("chartqa", [{**recs[0], "answers": ["100", "101"]}])


def test_textvqa_vqa_accuracy_mean():
    recs = [{"id": "1", "prediction": "Two", "answers": ["2"] * 3 + ["3"] * 7},
            {"id": "2", "prediction": "stop", "answers": ["stop"] * 10}]
    assert summarize("textvqa_val", recs)["score"] == pytest.approx((0.9 + 1.0) / 2)


def test_ocrbench_divides_by_1000_and_keys_hme_on_dataset():
    recs = [{"id": "1", "prediction": "It says HELLO", "answers": ["hello"],
             "question_type": "Regular Text Recognition", "dataset": "IIIT5K"},
            {"id": "2", "prediction": "X^2", "answers": ["x ^ 2"],
             "question_type": "Handwritten Mathematical Expression Recognition", "dataset": "HME100k"},
            {"id": "3", "prediction": "x^2", "answers": ["x ^ 2"],
             "question_type": "Handwritten Mathematical Expression Recognition", "dataset": "HME100k"}]
    s = summarize("ocrbench", recs)
    assert s["score"] == 2 / 1000 and s["correct"] == 2 and s["accuracy_over_scored"] == pytest.approx(2 / 3)
    hme = s["categories"]["question_type"]["Handwritten Mathematical Expression Recognition"]
    assert hme == {"score": 0.5, "correct": 1, "n": 2, "total": 100}
    assert s["vk_style_totals"]["Final Score"] == 2 and s["vk_style_totals"]["Text Recognition"] == 1
    with pytest.raises(RecordError, match="question_type"):
        summarize("ocrbench", [{**recs[0], "question_type": "Bogus"}])


def _vm(i, pred, gold, duration):
    return {"id": str(i), "prediction": pred, "answers": [gold], "options": ["A. a", "B. b", "C. c", "D. d"],
            "duration": duration, "domain": "Knowledge", "sub_category": "Astronomy", "task_type": "OCR Problems"}


def test_videomme_micro_percent_and_labelled_old_rule():
    recs = [_vm(1, "The answer is B, not A", "A", "short"),  # LE: A (right); old rule: B (wrong)
            _vm(2, "Clearly D", "D", "short"),  # LE: D (end); old rule: C
            _vm(3, "b", "B", "long"),  # nothing extracted under LE; old rule: "" too
            _vm(4, "(C)", "C", "long")]
    s = summarize("videomme", recs)
    assert s["score"] == pytest.approx(75.0) and s["scale"] == "percent"
    assert s["first_letter_rule_score"] == pytest.approx(25.0)
    assert s["categories"]["duration"] == {"long": {"score": 50.0, "n": 2}, "short": {"score": 100.0, "n": 2}}


def test_mlvu_macro_headline_and_micro_m_avg():
    recs = [{"id": "1", "prediction": "A) cat", "answers": ["A"], "task_type": "count"},
            {"id": "2", "prediction": "B", "answers": ["A"], "task_type": "count"},
            {"id": "3", "prediction": "C", "answers": ["C"], "task_type": "ego"},
            {"id": "4", "prediction": "a", "answers": ["a"], "task_type": "ego"}]  # case-sensitive: "" != "a"
    s = summarize("mlvu_dev", recs)
    assert s["score"] == pytest.approx((50.0 + 50.0) / 7)  # 5 empty types count as 0
    assert s["m_avg_micro"] == pytest.approx(50.0)
    assert s["categories"]["task_type"]["needle"] == {"score": 0.0, "correct": 0, "n": 0}
    assert summarize("mlvu_test", [{**recs[0], "task_type": "sportsQA"}])["score"] == pytest.approx(100 / 9)
    with pytest.raises(RecordError, match="task_type"):
        summarize("mlvu_dev", [{**recs[0], "task_type": "sportsQA"}])


def test_synthetic_per_family_accuracy_with_chance():
    recs = [{"id": "1", "prediction": "Red.", "answers": ["red"], "family": "video_colour", "chance": 1 / 6},
            {"id": "2", "prediction": "blue", "answers": ["red"], "family": "video_colour", "chance": 1 / 6},
            {"id": "3", "prediction": " 42 ", "answers": ["42"], "family": "doc_total", "chance": 0.01}]
    s = summarize("synthetic_video", recs)
    assert s["score"] == pytest.approx(2 / 3)
    assert s["categories"]["family"]["video_colour"] == {"score": 0.5, "n": 2, "chance": pytest.approx(1 / 6)}
    assert s["macro_over_families"] == pytest.approx(0.75)
    item = Item("1", "q", ("red",), fields={"family": "video_colour", "chance": 0.5})
    assert get_task("synthetic_video").prediction_record(item, "red")["chance"] == 0.5
