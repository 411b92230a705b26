"""How a generation ended, in words a user can act on: one wording for the app, `vl chat` and the server.

The cases that confuse users are the ones without an answer: the think block never closed. Why it did not close
decides the advice: out of tokens (raise the limit or set a reasoning budget), the model's own end of turn inside
the think block (a larger limit would not help), a stop, or the time limit. See docs/app_and_cli.md.
"""

from __future__ import annotations

FINISH_TEXT = {"stop": "end of answer", "length": "max new tokens reached", "stop_string": "stop string",
               "cancelled": "stopped", "timeout": "time limit reached"}


def finish_label(result) -> str:
    """A short "finished by" text for a `ChatResult`."""
    if result.reasoning_truncated and result.finish_reason == "stop":
        return "end of turn inside the reasoning"
    return FINISH_TEXT.get(result.finish_reason, result.finish_reason)


def finish_note(result, *, limit_name: str = "max new tokens", budget_hint: str = "a reasoning budget") -> str | None:
    """What happened and what to do, when the result has no answer because the reasoning never closed; else None.

    `limit_name` / `budget_hint`: how the token limit and the budget are called where the note is shown
    (a slider in the app, `--max-new-tokens` on the command line)."""
    if not result.reasoning_truncated:
        return None
    reason = result.finish_reason
    if reason == "length":
        return (f"the reasoning did not finish within the token limit ({result.stats.new_tokens} new tokens), so "
                f"there is no answer; raise {limit_name} or set {budget_hint}")
    if reason == "stop":
        return ("the model ended its turn inside its reasoning (its stop token came before the end of the think "
                "block), so there is no answer; raising the token limit would not change this: ask again, "
                "rephrase, or turn reasoning off")
    if reason == "cancelled":
        return "stopped during the reasoning, before an answer began"
    if reason == "timeout":
        return "the time limit came during the reasoning, before an answer began"
    return f"the reasoning did not finish ({reason}), so there is no answer"
