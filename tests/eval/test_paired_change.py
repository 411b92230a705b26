"""eval.score.paired_change (a sweep setting against the first; `vl eval compare`): the headline change on shared
items, with a 95% paired bootstrap interval."""

from __future__ import annotations

import math

import pytest

from eval.score import compare_main, paired_change
from eval.tasks import get_task


def video_records(right: list[bool], prefix: str = "v") -> list[dict]:
    return [{"id": f"{prefix}{i}", "prediction": "left" if ok else "right", "answers": ["left"],
             "family": "video_direction", "status": "ok"} for i, ok in enumerate(right)]


def test_the_same_predictions_change_nothing():
    task, recs = get_task("synthetic_video"), video_records([i % 3 != 0 for i in range(90)])
    c = paired_change(task, recs, recs)
    assert c == {"base_score": 60 / 90, "other_score": 60 / 90, "change": 0.0, "low": 0.0, "high": 0.0, "n": 90,
                 "n_differ": 0, "only_in_base": 0, "only_in_other": 0}


def test_ten_of_two_hundred_lost_is_minus_five_points_with_the_binomial_interval():
    task = get_task("synthetic_video")
    base = video_records([True] * 200)
    other = video_records([i >= 10 for i in range(200)])
    c = paired_change(task, base, other, n_boot=2000)
    assert c["change"] == pytest.approx(-0.05) and c["n_differ"] == 10 and c["n"] == 200
    se = math.sqrt(0.05 * 0.95 / 200)  # the paired difference is -1 on 10 items, 0 on the rest
    assert c["low"] == pytest.approx(-0.05 - 1.96 * se, abs=0.01) and c["high"] == pytest.approx(-0.05 + 1.96 * se,
                                                                                                 abs=0.01)
    assert c["high"] < 0  # a real loss: the interval excludes no change
    # the same net change from items that move both ways is less certain: 20 lost, 10 gained
    mixed_base = video_records([not 20 <= i < 30 for i in range(200)])
    mixed = video_records([i >= 20 for i in range(200)])
    w = paired_change(task, mixed_base, mixed, n_boot=2000)
    assert w["change"] == pytest.approx(-0.05) and w["n_differ"] == 30
    assert w["high"] - w["low"] > c["high"] - c["low"]


def test_only_items_both_settings_scored_are_compared():
    task = get_task("synthetic_video")
    base = video_records([True] * 10)
    other = video_records([False] * 5)  # ids v0..v4: a run that stopped halfway
    c = paired_change(task, base, other)
    assert c["n"] == 5 and c["change"] == pytest.approx(-1.0) and (c["only_in_base"], c["only_in_other"]) == (5, 0)
    assert (c["base_score"], c["other_score"]) == (1.0, 0.0)
    assert paired_change(task, base, video_records([False] * 5, prefix="w")) is None


def test_a_macro_headline_is_recomputed_as_the_task_computes_it():
    task = get_task("mlvu_dev")  # macro over 7 task types, in percent
    types = ["count"] * 10 + ["needle"] * 2

    def recs(right):
        return [{"id": str(i), "prediction": "(A)" if ok else "(B)", "answers": ["A"], "task_type": t,
                 "status": "ok"} for i, (t, ok) in enumerate(zip(types, right))]

    base, other = recs([True] * 12), recs([True] * 10 + [False, True])  # one needle item lost
    c = paired_change(task, base, other)
    # macro: the needle type falls 100 -> 50, i.e. 50/7 points of the headline, not 100/12 of a plain mean
    assert c["change"] == pytest.approx(-50 / 7) and c["n_differ"] == 1
    assert c["low"] <= c["change"] <= c["high"] <= 0


def test_vl_eval_compare_prints_the_change_and_refuses_files_with_nothing_in_common(tmp_path, capsys):
    import json

    from eval.__main__ import main as eval_main

    def write(name, records):
        path = tmp_path / name
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        return str(path)

    base = write("bf16.jsonl", video_records([True] * 40))
    other = write("fp8.jsonl", video_records([i >= 4 for i in range(40)]))
    assert eval_main(["compare", "--task", "synthetic_video", base, other, "--boot", "200"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["change"] == pytest.approx(-0.1) and out["n_differ"] == 4 and out["high"] < 0
    assert (out["base"], out["other"], out["task"]) == (base, other, "synthetic_video")
    elsewhere = write("other_set.jsonl", video_records([True] * 3, prefix="w"))
    assert eval_main(["compare", "--task", "synthetic_video", base, elsewhere]) == 2
    assert "share no item id" in capsys.readouterr().err
    assert eval_main(["compare", "--task", "synthetic_video", base, str(tmp_path / "missing.jsonl")]) == 2
    assert "error [not_found]" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        eval_main(["compare", "--task", "synthetic_video", base, other, "--boot", "0"])
    assert exc.value.code == 2
