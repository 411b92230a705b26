"""vl/runtime/outcome.py: a turn without an answer says why, and the advice fits the cause."""

from types import SimpleNamespace

from vl.runtime.outcome import finish_label, finish_note


def _result(reason, truncated, new_tokens=40):
    return SimpleNamespace(finish_reason=reason, reasoning_truncated=truncated,
                           stats=SimpleNamespace(new_tokens=new_tokens))


def test_stop_token_inside_the_think_block_does_not_advise_more_tokens():
    r = _result("stop", True)
    assert finish_label(r) == "end of turn inside the reasoning"
    note = finish_note(r)
    assert "inside its reasoning" in note and "would not change this" in note and "raise max new tokens" not in note


def test_out_of_tokens_inside_the_think_block_advises_the_limit_by_its_local_name():
    r = _result("length", True, 20)
    assert finish_label(r) == "max new tokens reached"
    assert "raise --max-new-tokens or set --reasoning-budget" in finish_note(
        r, limit_name="--max-new-tokens", budget_hint="--reasoning-budget")
    assert "did not finish within the token limit (20 new tokens)" in finish_note(r)


def test_answers_need_no_note():
    for reason in ("stop", "length", "cancelled", "timeout"):
        assert finish_note(_result(reason, False)) is None
    assert finish_label(_result("stop", False)) == "end of answer"
    assert "stopped" in finish_note(_result("cancelled", True)) and "time limit" in finish_note(_result("timeout", True))
