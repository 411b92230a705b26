"""A completion -> its reasoning and its answer: the output side of the prompt format (vl/processing/chat.py).

Follows vLLM's nemotron reasoning parser: when the prompt opened the think block, the completion holds only
`</think>`. `ThinkSplitter` does the same on a stream and agrees with `split_reasoning` on every chunking.
`strip_reasoning` follows lmms-eval `strip_reasoning_tags` (docs/eval_scoring.md §1).
"""

from __future__ import annotations

from collections.abc import Sequence

from vl.processing.chat import THINK_CLOSE, THINK_OPEN

LE_REASONING_TAGS = (("<think>", "</think>"), ("<analysis>", "</analysis>"))


def split_reasoning(text: str, prompt_opened_think: bool) -> tuple[str, str, bool]:
    """Full completion -> (reasoning, answer, truncated), both stripped. If the prompt opened the block,
    reasoning runs up to the first `</think>`. Otherwise only a `<think>` at the very start (after whitespace)
    opens one. A block still open at the end means truncated: no answer."""
    if not prompt_opened_think:
        rest = text.lstrip()
        if not rest.startswith(THINK_OPEN):
            return "", text.strip(), False
        text = rest[len(THINK_OPEN):]
    reasoning, closed, answer = text.partition(THINK_CLOSE)
    return reasoning.strip(), drop_think_tags(answer)[0].strip(), not closed  # after a think block: no raw tags


def drop_think_tags(text: str, final: bool = True) -> tuple[str, str]:
    """(text without any `<think>` / `</think>`, held-back tail). A small model can emit a second `</think>`
    after its reasoning closed; the model card's reasoning parsers end the reasoning at the first one, and a
    raw tag is never part of an answer a user reads. Removal runs to a fixed point ("</th</think>ink>" is a
    tag once the inner one goes). With `final=False` a tail that may still become a tag is held back."""
    while (cleaned := text.replace(THINK_OPEN, "").replace(THINK_CLOSE, "")) != text:
        text = cleaned
    if final:
        return text, ""
    # a tag still to come spans, from its "<" to the end of `text`, only tag characters (removed tags included):
    # hold back from the first "<" of the tail made of tag characters
    j = len(text)
    while j and text[j - 1] in _TAG_CHARS:
        j -= 1
    cut = text.find("<", j)
    return (text, "") if cut < 0 else (text[:cut], text[cut:])


_TAG_CHARS = frozenset(THINK_OPEN + THINK_CLOSE)


class _Strip:
    """Streams a text with its outer whitespace removed, exactly as `str.strip()` of the whole."""

    def __init__(self):
        self.started, self.held = False, ""

    def push(self, text: str) -> str:
        text = self.held + (text if self.started else text.lstrip())
        self.started = self.started or bool(text)
        body = text.rstrip()
        self.held = text[len(body):]
        return body


class ThinkSplitter:
    """Streaming twin of `split_reasoning`: the concatenated events equal its result for any chunking.
    A tag cut across chunks, and whitespace at the edges, are held back until it is clear what they are.
    After `finish()`, `truncated` says whether the reasoning was still open."""

    def __init__(self, prompt_opened_think: bool):
        self._state = "reasoning" if prompt_opened_think else "start"
        self._buf, self._strip = "", {"reasoning": _Strip(), "answer": _Strip()}
        self.truncated, self.finished, self._reasoned = False, False, False

    def _emit(self, events: list, kind: str, text: str) -> None:
        if text := self._strip[kind].push(text):
            events.append((kind, text))

    def feed(self, chunk: str) -> list[tuple[str, str]]:
        if self.finished:
            raise RuntimeError("ThinkSplitter.feed() after finish(); use a new splitter per completion")
        self._buf += chunk
        events: list[tuple[str, str]] = []
        if self._state == "start":  # states only move forward: start -> reasoning -> answer
            rest = self._buf.lstrip()
            if not rest.startswith(THINK_OPEN) and THINK_OPEN.startswith(rest):  # empty, or a tag arriving
                return events
            self._state = "reasoning" if rest.startswith(THINK_OPEN) else "answer"
            self._buf = rest[len(THINK_OPEN):] if self._state == "reasoning" else self._buf
        if self._state == "reasoning":
            reasoning, closed, after = self._buf.partition(THINK_CLOSE)
            if not closed:  # emit all but a partial closing tag at the end
                cut = len(self._buf) - next((k for k in range(len(THINK_CLOSE) - 1, 0, -1)
                                             if self._buf.endswith(THINK_CLOSE[:k])), 0)
                self._emit(events, "reasoning", self._buf[:cut])
                self._buf = self._buf[cut:]
                return events
            self._emit(events, "reasoning", reasoning)
            self._buf, self._state, self._reasoned = after, "answer", True
        if self._reasoned:  # after a think block a raw tag is never answer text (`drop_think_tags`)
            emit, self._buf = drop_think_tags(self._buf, final=False)
        else:
            emit, self._buf = self._buf, ""
        self._emit(events, "answer", emit)
        return events

    def finish(self) -> list[tuple[str, str]]:
        """Flushes what was held back; sets `truncated` when the completion ended inside the reasoning."""
        events: list[tuple[str, str]] = []
        if not self.finished:
            self.truncated = self._state == "reasoning"
            rest = drop_think_tags(self._buf)[0] if self._reasoned and not self.truncated else self._buf
            self._emit(events, "reasoning" if self.truncated else "answer", rest)
            self._buf, self.finished = "", True
        return events


def strip_reasoning(text: str, tag_pairs: Sequence[tuple[str, str]] = LE_REASONING_TAGS) -> str:
    """lmms-eval's `strip_reasoning_tags` rules (docs/eval_scoring.md §1), for LE-compatible scoring.
    Every complete start...end block is removed. With only closing tags left, the text after the last one
    is kept. An unclosed opening tag stays. Matching is case-sensitive. The result is stripped."""
    for start_tag, end_tag in tag_pairs:
        while (start := text.find(start_tag)) >= 0 and (end := text.find(end_tag, start)) >= 0:
            text = text[:start] + text[end + len(end_tag):]
        if end_tag in text and start_tag not in text:
            text = text[text.rfind(end_tag) + len(end_tag):]
    return text.strip()
